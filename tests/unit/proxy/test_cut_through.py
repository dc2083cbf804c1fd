"""Cut-through: large Fetch responses reach the client while they stream in from the broker."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from kqp.protocol.apis import FETCH_KEY
from kqp.protocol.headers import response_correlation_id
from kqp.protocol.session import CUT_THROUGH_MIN_BYTES
from kqp.protocol.throttle_field import patch_throttle_time
from kqp.proxy.hooks import ClientView, Exchange, ResponseVerdict, TrafficHooks
from kqp.proxy.server import ProxyServer
from tests.unit.helpers.fake_broker import FakeBroker, RawClient
from tests.unit.helpers.fetch import DATA, FETCH_VERSION, answer_fetch, decode, fetch_request
from tests.unit.helpers.proxy import answer_heartbeat, heartbeat_request, start_proxy

HEARTBEAT_KEY = 12










@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    fake = FakeBroker(handlers={HEARTBEAT_KEY: answer_heartbeat, FETCH_KEY: answer_fetch}, piece_bytes=16_384)
    await fake.start()
    yield fake
    await fake.stop()


async def node_client(proxy: ProxyServer, broker: FakeBroker) -> RawClient:
    return await RawClient.connect(proxy.directory.listeners[broker.node_id].port)




async def test_a_large_fetch_response_is_forwarded_whole_and_rewritten(broker: FakeBroker) -> None:
    proxy = await start_proxy(broker)
    rewritten: list[str] = []
    proxy.on_node_endpoints_rewritten = rewritten.append
    client = await node_client(proxy, broker)
    client.send(fetch_request(1))
    client.send(heartbeat_request(2))  # pipelined behind the fetch
    response = await client.receive()
    assert len(response) >= CUT_THROUGH_MIN_BYTES and response_correlation_id(response) == 1
    message = decode(response)
    assert message.responses[0].partitions[0].records == DATA
    node_port = proxy.directory.listeners[broker.node_id].port
    assert [(e.node_id, e.host, e.port) for e in message.node_endpoints] == [(1, "127.0.0.1", node_port)]
    assert b"kafka-1.broker.internal" not in response
    assert response_correlation_id(await client.receive()) == 2
    assert rewritten == ["Fetch"]  # the heartbeat carried no endpoints
    client.close()
    await proxy.stop()


async def test_the_client_gets_the_head_before_the_broker_sent_the_rest(broker: FakeBroker) -> None:
    broker.hold_at = 300_000  # the broker stops half way through the response
    proxy = await start_proxy(broker)
    client = await node_client(proxy, broker)
    client.send(fetch_request(5))
    size = int.from_bytes(await client.receive_exactly(4), "big")
    head = await client.receive_exactly(200_000)  # arrives while the broker holds the rest
    assert response_correlation_id(head) == 5 and not broker.release.is_set()
    broker.release.set()
    rest = await client.receive_exactly(size - len(head))
    assert decode(head + rest).responses[0].partitions[0].records == DATA
    client.close()
    await proxy.stop()


class ThrottleStreamed(TrafficHooks):
    """Patches 1234 ms into a streamed response's head and mutes for it; counts the calls."""

    def __init__(self, whole: bool = False) -> None:
        self.whole = whole
        self.started: list[int] = []
        self.streamed: list[int] = []
        self.responses = 0

    def needs_whole_response(self, client: ClientView, exchange: Exchange) -> bool:
        return self.whole

    def response_started(
        self, client: ClientView, exchange: Exchange, head: bytearray, body_offset: int, frame_size: int
    ) -> ResponseVerdict | None:
        self.started.append(frame_size)
        patch_throttle_time(head, body_offset, FETCH_KEY, FETCH_VERSION, 1234)
        return ResponseVerdict(mute_ms=50)

    def response_streamed(
        self, client: ClientView, exchange: Exchange, frame_size: int, body_offset: int
    ) -> None:
        self.streamed.append(frame_size)

    def response(
        self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int
    ) -> ResponseVerdict | None:
        self.responses += 1
        return None


async def test_hooks_see_a_streamed_response_start_and_end(broker: FakeBroker) -> None:
    hooks = ThrottleStreamed()
    proxy = await start_proxy(broker, hooks)
    client = await node_client(proxy, broker)
    client.send(fetch_request(1))
    response = await client.receive()
    assert decode(response).throttle_time_ms == 1234
    assert hooks.started == hooks.streamed == [len(response)] and hooks.responses == 0
    connection = next(iter(proxy.connections))
    assert connection.muted
    client.close()
    await proxy.stop()


async def test_a_hook_that_needs_the_whole_frame_gets_it(broker: FakeBroker) -> None:
    hooks = ThrottleStreamed(whole=True)
    proxy = await start_proxy(broker, hooks)
    client = await node_client(proxy, broker)
    client.send(fetch_request(1))
    response = await client.receive()
    assert decode(response).responses[0].partitions[0].records == DATA
    assert hooks.responses == 1 and hooks.started == []
    client.close()
    await proxy.stop()


async def test_a_malformed_streamed_response_closes_the_connection_with_a_reason(
    broker: FakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    def short_fetch(header: object, body: bytes) -> bytes:
        return answer_fetch(header, body)[:-40]  # the frame ends inside the records

    broker.handlers[FETCH_KEY] = short_fetch
    proxy = await start_proxy(broker)
    client = await node_client(proxy, broker)
    with caplog.at_level(logging.WARNING):
        client.send(fetch_request(1))
        # What streamed through reaches the client; then the proxy closes (EOF ends the read).
        received = await asyncio.wait_for(client.reader.read(), 5.0)
    assert received[4:8] == (1).to_bytes(4, "big")
    assert "Fetch response ended inside its structure" in caplog.text
    client.close()
    await proxy.stop()
