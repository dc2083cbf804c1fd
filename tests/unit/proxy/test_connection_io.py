"""The proxy's IO layer against a scripted broker: ordering, rewriting, bad input, muting."""

from __future__ import annotations

import asyncio
import logging
import struct

import pytest

from kqp.protocol.apis import METADATA_KEY, PRODUCE_KEY
from kqp.protocol.codec import decode_body
from kqp.protocol.headers import response_body_offset, response_correlation_id
from kqp.proxy.hooks import ClientView, Exchange, ResponseVerdict, TrafficHooks
from tests.unit.helpers.fake_broker import FakeBroker, RawClient
from tests.unit.helpers.proxy import (
    HEARTBEAT_KEY,
    heartbeat_request,
    metadata_request,
    produce_acks0_request,
    start_proxy,
)


async def test_metadata_points_clients_at_the_proxy(broker: FakeBroker) -> None:
    proxy = await start_proxy(broker)
    client = await RawClient.connect(proxy.bootstrap_port)
    client.send(metadata_request(7))
    response = await client.receive()
    assert response_correlation_id(response) == 7
    message = decode_body(METADATA_KEY, 12, response[response_body_offset(response, METADATA_KEY, 12):],
                          is_request=False)
    node_port = proxy.directory.listeners[broker.node_id].port
    assert [(b.node_id, b.host, b.port) for b in message.brokers] == [(broker.node_id, "127.0.0.1", node_port)]
    assert node_port != broker.port
    # The node listener reaches the broker too.
    direct = await RawClient.connect(node_port)
    direct.send(heartbeat_request(1))
    assert response_correlation_id(await direct.receive()) == 1
    client.close()
    direct.close()
    await proxy.stop()


async def test_pipelined_requests_are_answered_in_order(broker: FakeBroker) -> None:
    proxy = await start_proxy(broker)
    client = await RawClient.connect(proxy.bootstrap_port)
    for correlation_id in range(100):
        client.send(heartbeat_request(correlation_id))
    received = [response_correlation_id(await client.receive()) for _ in range(100)]
    assert received == list(range(100))
    client.close()
    await proxy.stop()


async def test_oversized_frame_closes_only_that_connection(
    broker: FakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = await start_proxy(broker, max_frame_bytes=1024)
    good = await RawClient.connect(proxy.bootstrap_port)
    bad = await RawClient.connect(proxy.bootstrap_port)
    with caplog.at_level(logging.WARNING):
        bad.writer.write(struct.pack(">i", 1_000_000))
        assert await bad.closed_by_peer()
    assert "exceeds the limit of 1024 bytes" in caplog.text
    good.send(heartbeat_request(3))
    assert response_correlation_id(await good.receive()) == 3
    good.close()
    await proxy.stop()


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (struct.pack(">hhih", METADATA_KEY, 99, 1, -1), "outside the versions the proxy decodes"),
        (b"\x00\x03", "request header needs"),
        (struct.pack(">hhih", METADATA_KEY, 12, 1, 200) + b"x", "client id runs past"),
    ],
)
async def test_malformed_requests_close_the_connection_with_a_reason(
    broker: FakeBroker, caplog: pytest.LogCaptureFixture, payload: bytes, reason: str
) -> None:
    proxy = await start_proxy(broker)
    client = await RawClient.connect(proxy.bootstrap_port)
    with caplog.at_level(logging.WARNING):
        client.send(payload)
        assert await client.closed_by_peer()
    assert reason in caplog.text
    assert "127.0.0.1" in caplog.text  # the log names the peer
    await proxy.stop()


async def test_an_api_the_proxy_does_not_know_is_forwarded_as_bytes(broker: FakeBroker) -> None:
    # API key 9999 in a version no definition describes: the header is read, the rest is not.
    broker.handlers[9999] = lambda header, body: b"ANSWER:" + bytes(body)
    proxy = await start_proxy(broker)
    client = await RawClient.connect(proxy.bootstrap_port)
    client.send(struct.pack(">hhih", 9999, 7, 41, 2) + b"id" + b"\x00opaque body")
    response = await client.receive()
    assert response == struct.pack(">i", 41) + b"ANSWER:\x00opaque body"
    assert [(h.api_key, h.api_version, h.correlation_id) for h in broker.received if h.api_key == 9999] == [
        (9999, 7, 41)]
    client.close()
    await proxy.stop()


async def test_broker_answering_out_of_order_closes_the_connection(
    broker: FakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = await start_proxy(broker)
    broker.reverse_pairs = True
    client = await RawClient.connect(proxy.bootstrap_port)
    with caplog.at_level(logging.WARNING):
        client.send(heartbeat_request(1))
        client.send(heartbeat_request(2))
        assert await client.closed_by_peer()
    assert "out of order" in caplog.text
    await proxy.stop()




async def test_acks_zero_produce_is_not_waited_for(broker: FakeBroker) -> None:
    broker.handlers[PRODUCE_KEY] = lambda header, body: None  # like a broker: no answer for acks=0
    proxy = await start_proxy(broker)
    client = await RawClient.connect(proxy.bootstrap_port)
    client.send(produce_acks0_request(1))
    client.send(heartbeat_request(2))
    assert response_correlation_id(await client.receive()) == 2
    assert [h.api_key for h in broker.received if h.client_id == "test"] == [PRODUCE_KEY, HEARTBEAT_KEY]
    client.close()
    await proxy.stop()


async def test_unreachable_broker_closes_the_client_promptly(caplog: pytest.LogCaptureFixture) -> None:
    dead = FakeBroker()
    await dead.start()
    await dead.stop()  # the port is now closed
    proxy = await start_proxy(dead)
    client = await RawClient.connect(proxy.bootstrap_port)
    with caplog.at_level(logging.WARNING):
        assert await client.closed_by_peer(timeout=5)
    assert "no upstream broker reachable" in caplog.text
    await proxy.stop()


class MuteFirstResponse(TrafficHooks):
    def __init__(self, mute_ms: int) -> None:
        self.mute_ms = mute_ms
        self.muted_once = False

    def response(self, client: ClientView, exchange: Exchange, frame: bytes,
                 body_offset: int) -> ResponseVerdict | None:
        if self.muted_once:
            return None
        self.muted_once = True
        return ResponseVerdict(mute_ms=self.mute_ms)


async def test_muted_connection_forwards_nothing_until_the_throttle_ends(broker: FakeBroker) -> None:
    proxy = await start_proxy(broker, MuteFirstResponse(mute_ms=400))
    loop = asyncio.get_running_loop()
    client = await RawClient.connect(proxy.bootstrap_port)
    client.send(heartbeat_request(1))
    await client.receive()
    first_answered = loop.time()
    # Pipelined right behind the throttled response: must wait out the mute.
    client.send(heartbeat_request(2))
    await client.receive()
    assert loop.time() - first_answered >= 0.39
    assert [h.correlation_id for h in broker.received if h.client_id == "test"] == [1, 2]
    client.close()
    await proxy.stop()


async def test_graceful_stop_answers_requests_in_flight(broker: FakeBroker) -> None:
    broker.delay_s = 0.3
    proxy = await start_proxy(broker)
    client = await RawClient.connect(proxy.bootstrap_port)
    client.send(heartbeat_request(5))
    await asyncio.wait_for(broker.request_seen.wait(), 5)
    stopping = asyncio.ensure_future(proxy.stop(grace_s=5))
    assert response_correlation_id(await client.receive()) == 5
    await stopping
    assert await client.closed_by_peer()


async def test_connections_over_the_per_ip_limit_are_closed(
    broker: FakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = await start_proxy(broker, max_connections_per_ip=2)
    first = await RawClient.connect(proxy.bootstrap_port)
    second = await RawClient.connect(proxy.bootstrap_port)
    with caplog.at_level(logging.WARNING):
        third = await RawClient.connect(proxy.bootstrap_port)
        assert await third.closed_by_peer()
    assert "max_connections_per_ip=2" in caplog.text
    for client, correlation_id in ((first, 1), (second, 2)):
        client.send(heartbeat_request(correlation_id))
        assert response_correlation_id(await client.receive()) == correlation_id
    # A slot freed by a closed connection can be used again.
    first.close()
    await first.writer.wait_closed()
    # The proxy learns of the close asynchronously; wait for that condition.
    while len(proxy.connections) > 1:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    fourth = await RawClient.connect(proxy.bootstrap_port)
    fourth.send(heartbeat_request(4))
    assert response_correlation_id(await fourth.receive()) == 4
    await proxy.stop()
