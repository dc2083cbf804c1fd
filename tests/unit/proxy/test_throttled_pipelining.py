"""A throttled client's pipelined requests go upstream one at a time, as a broker reads them.

A broker reads one request per connection and processes it before reading the next, so a
muted client's pipelined requests wait in its socket. The proxy pipelines normally; while a
client is being throttled (on this connection or another one) it forwards one request, waits
for its response, then the next.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kqp.config.models import EnforcementSection
from kqp.protocol.headers import RequestHeader, parse_request_header, response_correlation_id
from kqp.proxy.enforcement import QuotaEnforcement
from kqp.proxy.hooks import ClientView, Exchange, RequestVerdict, ResponseVerdict, TrafficHooks
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import QuotaEngine
from kqp.quotas.settings import QuotaEntity, QuotaEntry, QuotaSettings
from tests.unit.client_views import client_view
from tests.unit.proxy.fake_broker import FakeBroker, RawClient
from tests.unit.proxy.test_connection_io import HEARTBEAT_KEY, answer_heartbeat, heartbeat_request, start_proxy


class EventLog(TrafficHooks):
    """Records when each request is forwarded and each response arrives."""

    def __init__(self, one_at_a_time: bool) -> None:
        self.one_at_a_time = one_at_a_time
        self.events: list[str] = []

    def request(self, client: ClientView, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        self.events.append(f"request {exchange.header.correlation_id}")
        return RequestVerdict(one_at_a_time_s=30.0) if self.one_at_a_time else None

    def response(
        self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int
    ) -> ResponseVerdict | None:
        self.events.append(f"response {exchange.header.correlation_id}")
        return None


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


def one_at_a_time_for(verdict: RequestVerdict | None) -> float:
    return verdict.one_at_a_time_s if verdict is not None else 0.0


def exchange_for(client_id: str) -> Exchange:
    frame = heartbeat_request(1)
    header: RequestHeader = parse_request_header(frame.replace(b"test", client_id.encode()[:4].ljust(4, b"x")))
    return Exchange(header=header, request_bytes=len(frame) + 4, received_at=0.0)


def test_a_new_connection_of_a_throttled_client_starts_one_request_at_a_time() -> None:
    now = [1_000_000.0]
    entry = QuotaEntry(QuotaEntity(client_id="test"), {"producer_byte_rate": 1000.0})
    enforcement = QuotaEnforcement(QuotaEngine(QuotaSettings(entries=(entry,))), EnforcementSection(),
                                   lambda: now[0], TopicDirectory())
    enforcement._note_throttle(("ANONYMOUS", "test"), 2000, now[0])
    second = enforcement.request(client_view(2), exchange_for("test"), heartbeat_request(1))
    other = enforcement.request(client_view(3), exchange_for("else"), heartbeat_request(1))
    # The throttle's 2 s plus a quota span of 11 s; another client is not affected.
    assert one_at_a_time_for(second) == pytest.approx(13.0)
    assert one_at_a_time_for(other) == 0.0
    now[0] += 14_000
    enforcement.forget_expired_throttles(now[0])
    later = enforcement.request(client_view(4), exchange_for("test"), heartbeat_request(1))
    assert one_at_a_time_for(later) == 0.0
