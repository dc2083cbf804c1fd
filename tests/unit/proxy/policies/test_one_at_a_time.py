"""kqp.proxy.policies.one_at_a_time, through the enforcement chain called directly (no sockets).
How a connection carries the span out is tested in test_throttled_pipelining."""

from __future__ import annotations

import pytest

from kqp.config.models import EnforcementSection
from kqp.protocol.headers import RequestHeader, parse_request_header
from kqp.proxy.hooks import Exchange, RequestVerdict
from kqp.proxy.policies.chain import EnforcementPolicies
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings
from tests.unit.helpers.client_views import client_view
from tests.unit.helpers.proxy import heartbeat_request

# ---- a throttled client's other connections --------------------------------------------
# A client throttled on one connection is read one request at a time on its others.

def one_at_a_time_for(verdict: RequestVerdict | None) -> float:
    return verdict.one_at_a_time_s if verdict is not None else 0.0


def heartbeat_exchange_for(client_id: str) -> Exchange:
    frame = heartbeat_request(1)
    header: RequestHeader = parse_request_header(frame.replace(b"test", client_id.encode()[:4].ljust(4, b"x")))
    return Exchange(header=header, request_bytes=len(frame) + 4, received_at=0.0)


def test_a_new_connection_of_a_throttled_client_starts_one_request_at_a_time() -> None:
    now = [1_000_000.0]
    entry = QuotaEntry(QuotaEntity(client_id="test"), {"producer_byte_rate": 1000.0})
    enforcement = EnforcementPolicies(QuotaEngine(QuotaSettings(entries=(entry,))), EnforcementSection(),
                                   lambda: now[0], TopicDirectory())
    enforcement.registry.recent_throttles.note(("ANONYMOUS", "test"), 2000, now[0])
    second = enforcement.request(client_view(2), heartbeat_exchange_for("test"), heartbeat_request(1))
    other = enforcement.request(client_view(3), heartbeat_exchange_for("else"), heartbeat_request(1))
    # The throttle's 2 s plus a quota span of 11 s; another client is not affected.
    assert one_at_a_time_for(second) == pytest.approx(13.0)
    assert one_at_a_time_for(other) == 0.0
    now[0] += 14_000
    enforcement.forget_expired_throttles(now[0])
    later = enforcement.request(client_view(4), heartbeat_exchange_for("test"), heartbeat_request(1))
    assert one_at_a_time_for(later) == 0.0
