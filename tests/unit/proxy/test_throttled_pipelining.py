"""A throttled client's pipelined requests go upstream one at a time, as a broker reads them.

A broker reads one request per connection and processes it before reading the next, so a
muted client's pipelined requests wait in its socket. The proxy pipelines normally; while a
client is being throttled (on this connection or another one) it forwards one request, waits
for its response, then the next.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from kqp.protocol.headers import response_correlation_id
from tests.unit.helpers.fake_broker import FakeBroker, RawClient
from tests.unit.helpers.proxy import HEARTBEAT_KEY, EventLog, answer_heartbeat, heartbeat_request, start_proxy


@pytest.fixture
async def slow_broker() -> AsyncIterator[FakeBroker]:
    fake = FakeBroker(handlers={HEARTBEAT_KEY: answer_heartbeat}, delay_s=0.05)
    await fake.start()
    yield fake
    await fake.stop()


async def pipelined_events(broker: FakeBroker, one_at_a_time: bool) -> list[str]:
    log = EventLog(one_at_a_time)
    proxy = await start_proxy(broker, log)
    client = await RawClient.connect(proxy.bootstrap_port)
    for correlation_id in (1, 2, 3):
        client.send(heartbeat_request(correlation_id))
    answered = [response_correlation_id(await client.receive()) for _ in range(3)]
    client.close()
    await proxy.stop()
    assert answered == [1, 2, 3]
    return log.events


async def test_pipelined_requests_are_forwarded_together_normally(slow_broker: FakeBroker) -> None:
    events = await pipelined_events(slow_broker, one_at_a_time=False)
    assert events.index("request 3") < events.index("response 1")


async def test_a_throttled_client_gets_one_request_forwarded_at_a_time(slow_broker: FakeBroker) -> None:
    events = await pipelined_events(slow_broker, one_at_a_time=True)
    assert events == ["request 1", "response 1", "request 2", "response 2", "request 3", "response 3"]


async def test_a_throttled_client_is_not_read_while_its_request_is_with_the_broker() -> None:
    # librdkafka writes requests as long as its socket takes them: were the proxy to read on
    # while it forwards one at a time, a throttled client's whole backlog would move into the
    # proxy's memory (50 MB per producer, measured) instead of waiting in the client, as it
    # does behind a broker's muted channel.
    broker = FakeBroker(handlers={HEARTBEAT_KEY: answer_heartbeat}, delay_s=0.3)
    await broker.start()
    log = EventLog(one_at_a_time=True)
    proxy = await start_proxy(broker, log)
    client = await RawClient.connect(proxy.bootstrap_port)
    client.send(heartbeat_request(1))
    await asyncio.sleep(0.1)  # request 1 is with the broker now
    for correlation_id in range(2, 6):
        client.send(heartbeat_request(correlation_id))
    await asyncio.sleep(0.1)
    (connection,) = proxy.connections
    assert connection.client_reads_paused
    assert connection.session.requests_queued == 0, "requests were read while one was in handling"
    answered = [response_correlation_id(await client.receive()) for _ in range(5)]
    assert answered == [1, 2, 3, 4, 5]
    assert not connection.client_reads_paused  # read again once the last response has gone
    client.close()
    await proxy.stop()
    await broker.stop()
