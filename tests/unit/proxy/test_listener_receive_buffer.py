"""Client connections get Kafka's socket.receive.buffer.bytes, so a muted client feels back-pressure.

A broker sets SO_RCVBUF to 100 KB on every client socket. With the OS's autotuned buffer (up
to several MB on Linux) a client the proxy has muted for a throttle keeps writing requests
into the kernel, and each of them then waits out a throttle of its own;
bench/quota_accuracy.py shows the effect on the achieved rate.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from kqp.config.models import ProxySection
from kqp.proxy.cluster import BOOTSTRAP, ClusterDirectory, Listener
from kqp.proxy.options import ProxyOptions


def _accepted_receive_buffer(options: ProxyOptions) -> int:
    """SO_RCVBUF of a connection accepted on a listener the directory opens."""
    opened: list[socket.socket] = []
    directory = ClusterDirectory(options, lambda _listener, sock: opened.append(sock))
    listener: Listener = directory.open_listener(BOOTSTRAP, 0)
    (server,) = opened
    server.setblocking(True)
    with server, socket.create_connection(("127.0.0.1", listener.port)) as _client:
        accepted, _address = server.accept()
        with accepted:
            return accepted.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)


@pytest.fixture
def os_default_receive_buffer() -> Iterator[int]:
    with socket.socket() as fresh:
        yield fresh.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)


def test_accepted_client_sockets_get_the_configured_receive_buffer() -> None:
    options = ProxyOptions(upstream_bootstrap=(("127.0.0.1", 9),), bootstrap_port=0, socket_receive_buffer_bytes=50_000)
    # Linux doubles what is asked for, to leave room for its bookkeeping (socket(7)).
    assert _accepted_receive_buffer(options) == 2 * 50_000


def test_minus_one_leaves_the_os_default(os_default_receive_buffer: int) -> None:
    options = ProxyOptions(upstream_bootstrap=(("127.0.0.1", 9),), bootstrap_port=0, socket_receive_buffer_bytes=-1)
    assert _accepted_receive_buffer(options) == os_default_receive_buffer


def test_the_default_is_kafkas_socket_receive_buffer_bytes() -> None:
    assert ProxyOptions(upstream_bootstrap=()).socket_receive_buffer_bytes == 102400
    assert ProxySection().socket_receive_buffer_bytes == 102400
