"""A throttle answered by the proxy itself holds like one the broker's answer carries.

The proxy answers some requests locally (a strict CreateTopics whose every topic is over
the controller mutation quota). Its throttle must mute the connection exactly as a
forwarded response's does: in order with the forwarded responses, with the requests
pipelined behind it waiting for the mute, and the client remembered as throttled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from kqp.protocol.apis import CREATE_TOPICS_KEY
from kqp.protocol.codec import decode_body
from kqp.protocol.headers import (
    encode_response_header,
    response_body_offset,
    response_correlation_id,
)
from kqp.proxy.hooks import ClientView, Exchange, RequestVerdict, ResponseVerdict, TrafficHooks
from tests.unit.helpers.fake_broker import FakeBroker, RawClient
from tests.unit.helpers.mutations import answer_create_topics, create_topics, creator_enforcement
from tests.unit.helpers.proxy import HEARTBEAT_KEY, answer_heartbeat, heartbeat_request, start_proxy

THROTTLING_QUOTA_EXCEEDED = 89


class AnswerSecondLocally(TrafficHooks):
    """Answers the request with correlation id 2 itself, with a throttle of `mute_ms`."""

    def __init__(self, mute_ms: int) -> None:
        self.mute_ms = mute_ms

    def request(self, client: ClientView, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        header = exchange.header
        if header.correlation_id != 2:
            return None
        body = answer_heartbeat(header, b"")
        return RequestVerdict(answer=encode_response_header(header.api_key, header.api_version, 2) + body)

    def response(
        self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int
    ) -> ResponseVerdict | None:
        return ResponseVerdict(mute_ms=self.mute_ms) if exchange.local_response is not None else None


@pytest.fixture
async def slow_broker() -> AsyncIterator[FakeBroker]:
    fake = FakeBroker(handlers={HEARTBEAT_KEY: answer_heartbeat}, delay_s=0.1)
    await fake.start()
    yield fake
    await fake.stop()


async def test_a_local_answer_mutes_in_order_and_holds_the_requests_behind_it(slow_broker: FakeBroker) -> None:
    proxy = await start_proxy(slow_broker, AnswerSecondLocally(mute_ms=400))
    loop = asyncio.get_running_loop()
    client = await RawClient.connect(proxy.bootstrap_port)
    for correlation_id in (1, 2, 3):  # pipelined: forwarded, local, forwarded
        client.send(heartbeat_request(correlation_id))
    arrivals = []
    for _ in range(3):
        response = await client.receive()
        arrivals.append((response_correlation_id(response), loop.time()))
    client.close()
    await proxy.stop()
    assert [c for c, _ in arrivals] == [1, 2, 3]  # the local answer waited for the forwarded one
    # Request 3 was read before the mute began, yet waits it out, as on a muted broker channel.
    assert arrivals[2][1] - arrivals[1][1] >= 0.39
    assert [h.correlation_id for h in slow_broker.received if h.client_id == "test"] == [1, 3]








async def test_a_strict_create_topics_rejected_locally_mutes_the_connection() -> None:
    broker = FakeBroker(handlers={CREATE_TOPICS_KEY: answer_create_topics, HEARTBEAT_KEY: answer_heartbeat})
    await broker.start()
    loop = asyncio.get_running_loop()
    enforcement = creator_enforcement()
    proxy = await start_proxy(broker, enforcement)
    client = await RawClient.connect(proxy.bootstrap_port)
    # 11300 partitions on a full bucket: admitted (strict checks the bucket before), 300 in debt.
    client.send(create_topics(1, 11_300))
    await client.receive()
    # The bucket is negative: rejected by the proxy with a throttle of 300 / 1000 s = 300 ms
    # (less the few ms the bucket refilled), and the heartbeat pipelined behind it waits for it.
    client.send(create_topics(2, 1))
    client.send(heartbeat_request(3))
    rejected = await client.receive()
    rejected_at = loop.time()
    heartbeat = await client.receive()
    waited = loop.time() - rejected_at
    client.close()
    await proxy.stop()
    await broker.stop()
    offset = response_body_offset(rejected, CREATE_TOPICS_KEY, 7)
    response = decode_body(CREATE_TOPICS_KEY, 7, rejected[offset:], is_request=False)
    assert [t.error_code for t in response.topics] == [THROTTLING_QUOTA_EXCEEDED]
    assert 250 <= response.throttle_time_ms <= 300
    assert response_correlation_id(heartbeat) == 3
    assert waited >= response.throttle_time_ms / 1000.0 - 0.01
    assert [h.api_key for h in broker.received if h.client_id != "kqp-discovery"] == [CREATE_TOPICS_KEY, HEARTBEAT_KEY]
    # Recorded as throttled: a new connection of this client starts one request at a time.
    assert ("ANONYMOUS", "creator") in enforcement.registry.recent_throttles
