"""Which upstream broker each node id is, and one proxy listener per broker.

Clients reach broker N through advertised_host:node_port(N). The upstream address of N is
learned from the responses that carry it (Metadata, FindCoordinator, ...) while they are
rewritten, so a broker that joins the cluster gets its listener the first time a client
could hear of it. With SNI routing there is one listener: broker N is advertised as the
pattern's name for N on that listener's port, and connections are told apart by the name.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass

from kqp.protocol.sni_routing import BOOTSTRAP_ROUTE
from kqp.proxy.options import ProxyOptions

log = logging.getLogger(__name__)

BOOTSTRAP = BOOTSTRAP_ROUTE  # listener id of the bootstrap port


@dataclass(frozen=True, slots=True)
class Listener:
    node_id: int  # BOOTSTRAP for the bootstrap listener
    port: int

    @property
    def name(self) -> str:
        return "bootstrap" if self.node_id == BOOTSTRAP else f"node-{self.node_id}"


class ClusterDirectory:
    """Upstream addresses by node id, and the listeners serving them."""

    def __init__(
        self,
        options: ProxyOptions,
        start_listener: Callable[[Listener, socket.socket], None],
    ) -> None:
        self._options = options
        self._sni_routes = options.sni_routes  # built once: map_address runs per rewritten address
        self._start_listener = start_listener
        self._upstream: dict[int, tuple[str, int]] = {}
        self._listeners: dict[int, Listener] = {}
        self._bootstrap_next = 0

    @property
    def listeners(self) -> dict[int, Listener]:
        return self._listeners

    def is_known(self, node_id: int) -> bool:
        return node_id in self._upstream

    def known_nodes(self) -> list[int]:
        return sorted(self._upstream)

    def upstream_of(self, node_id: int) -> tuple[str, int] | None:
        return self._upstream.get(node_id)

    def bootstrap_candidates(self) -> list[tuple[str, int]]:
        """Bootstrap servers in rotating order, so clients spread over them."""
        servers = list(self._options.upstream_bootstrap)
        start = self._bootstrap_next % len(servers)
        self._bootstrap_next += 1
        return servers[start:] + servers[:start]

    def open_listener(self, node_id: int, port: int) -> Listener:
        # Bind synchronously so the port is reserved before any client can learn of it;
        # the event loop starts serving it right after.
        sock = socket.socket(socket.AF_INET6 if ":" in self._options.bind_host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self._options.reuse_port:
            # The kernel spreads new connections over the workers that bound the same port.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if self._options.socket_receive_buffer_bytes > 0:
            # Set before listen() so accepted sockets inherit it and the TCP window is
            # negotiated for it (Kafka sets socket.receive.buffer.bytes on each accepted socket).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._options.socket_receive_buffer_bytes)
        sock.bind((self._options.bind_host, port))
        sock.listen(1024)
        sock.setblocking(False)
        listener = Listener(node_id, sock.getsockname()[1])
        self._listeners[node_id] = listener
        self._start_listener(listener, sock)
        log.info("listening for %s on %s:%d", listener.name, self._options.bind_host, listener.port)
        return listener

    def map_address(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        """Rewrite callback: remember the upstream address, return the proxy's for it."""
        previous = self._upstream.get(node_id)
        if previous != (host, port):
            self._upstream[node_id] = (host, port)
            if previous is not None:
                log.info("node %d moved from %s:%d to %s:%d", node_id, *previous, host, port)
        sni = self._sni_routes
        if sni is not None:
            listening = self._listeners.get(BOOTSTRAP)
            port = sni.advertised_port or (listening.port if listening else self._options.bootstrap_port)
            return sni.broker_host(node_id), port
        listener = self._listeners.get(node_id)
        if listener is None:
            try:
                listener = self.open_listener(node_id, self._options.node_port(node_id))
            except OSError as exc:
                # The client will be told an address nobody serves; say why loudly.
                log.error("cannot open listener for node %d: %s", node_id, exc)
                return self._options.advertised_host, self._options.node_port(node_id)
        return self._options.advertised_host, listener.port


async def wait_closed(servers: list[asyncio.Server]) -> None:
    for server in servers:
        server.close()
    for server in servers:
        await server.wait_closed()
