"""Broker discovery reads the broker's answer through the same bounded framing as the data
path: a nonsense size prefix or a wrong correlation id fails discovery with a logged reason
instead of allocating what the prefix asks for or reading a stranger's answer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from kqp.protocol.apis import METADATA_KEY
from kqp.protocol.framing import frame
from kqp.protocol.headers import encode_response_header
from kqp.proxy.options import ProxyOptions
from kqp.proxy.server import ProxyServer
from tests.unit.helpers.fake_broker import FakeBroker

Answer = Callable[[bytes], bytes]


async def answering(answer: Answer) -> tuple[asyncio.Server, int]:
    """A server that answers each connection's first request with `answer(request)`, then hangs up."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.read(65536)
        writer.write(answer(request))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.fixture
async def discover() -> AsyncIterator[Callable[[Answer], Awaitable[tuple[bool, ProxyServer]]]]:
    servers: list[asyncio.Server] = []
    proxies: list[ProxyServer] = []

    async def run(answer: Answer) -> tuple[bool, ProxyServer]:
        """Start a proxy (which discovers the brokers), then ask it to discover once more."""
        server, port = await answering(answer)
        servers.append(server)
        proxy = ProxyServer(ProxyOptions(upstream_bootstrap=(("127.0.0.1", port),), bootstrap_port=0))
        proxies.append(proxy)
        await proxy.start()
        return await proxy.discover_brokers(), proxy

    yield run
    for proxy in proxies:
        await proxy.stop()
    for server in servers:
        server.close()
        await server.wait_closed()


async def test_a_huge_size_prefix_is_refused_before_reading_it(
    discover: Callable[[Answer], Awaitable[tuple[bool, ProxyServer]]], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="kqp.proxy.server"):
        found, _ = await discover(lambda request: (2**31 - 1).to_bytes(4, "big") + b"\x00" * 64)
    assert not found
    assert "frame of 2147483647 bytes exceeds the limit" in caplog.text


async def test_an_answer_cut_short_fails_discovery(
    discover: Callable[[Answer], Awaitable[tuple[bool, ProxyServer]]], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="kqp.proxy.server"):
        found, _ = await discover(lambda request: (100).to_bytes(4, "big") + b"\x00" * 10)
    assert not found
    assert "broker closed the connection 10 bytes into its answer" in caplog.text


async def test_an_answer_to_another_request_is_not_taken(
    discover: Callable[[Answer], Awaitable[tuple[bool, ProxyServer]]], caplog: pytest.LogCaptureFixture
) -> None:
    body = FakeBroker(node_id=7, port=9999).metadata_body(12)
    with caplog.at_level(logging.WARNING, logger="kqp.proxy.server"):
        found, proxy = await discover(lambda request: frame(encode_response_header(METADATA_KEY, 12, 42) + body))
    assert not found
    assert "answered correlation id 42" in caplog.text
    assert proxy.directory.upstream_of(7) is None


async def test_a_well_formed_answer_maps_the_brokers(
    discover: Callable[[Answer], Awaitable[tuple[bool, ProxyServer]]],
) -> None:
    body = FakeBroker(node_id=7, port=9999).metadata_body(12)
    found, proxy = await discover(lambda request: frame(encode_response_header(METADATA_KEY, 12, 1) + body))
    assert found
    assert proxy.directory.upstream_of(7) == ("127.0.0.1", 9999)
