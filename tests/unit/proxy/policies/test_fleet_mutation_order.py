"""kqp.proxy.policies.fleet_mutation_order through the enforcement chain, called directly: a
mutation with a quota waits for the fleet's charge, which kafka_mutations then records
instead of charging again. The fleet's side is tested in tests/unit/quotas/test_fleet.py."""

from __future__ import annotations

import asyncio

from kqp.config.models import EnforcementSection
from kqp.protocol.headers import parse_request_header
from kqp.proxy.hooks import Exchange, FleetCharge
from kqp.proxy.policies.chain import EnforcementPolicies
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings
from kqp.quotas.recording import QuotaClient, RequestCharges, RequestOutcome
from tests.unit.helpers.client_views import client_view
from tests.unit.helpers.mutations import create_topics
from tests.unit.helpers.proxy import heartbeat_request


class Fleet:
    """Claims every mutation; the test settles the claims."""

    def __init__(self) -> None:
        self.claims: list[tuple[QuotaClient, RequestCharges, asyncio.Future[FleetCharge | None]]] = []

    def claim(self, client: QuotaClient, charges: RequestCharges) -> asyncio.Future[FleetCharge | None]:
        future: asyncio.Future[FleetCharge | None] = asyncio.get_running_loop().create_future()
        self.claims.append((client, charges, future))
        return future


def enforcement(client_id: str) -> tuple[EnforcementPolicies, Fleet]:
    settings = QuotaSettings(entries=(QuotaEntry(QuotaEntity(None, client_id), {"controller_mutation_rate": 10.0}),))
    chain = EnforcementPolicies(QuotaEngine(settings), EnforcementSection(), lambda: 7_000.0, TopicDirectory())
    chain.mutation_order = fleet = Fleet()
    return chain, fleet


def exchange_of(frame: bytes) -> Exchange:
    return Exchange(header=parse_request_header(frame), request_bytes=len(frame) + 4, received_at=0.0)


async def test_a_mutation_waits_for_the_fleets_charge_and_takes_its_verdict() -> None:
    chain, fleet = enforcement("creator")
    frame = create_topics(1, partitions=3)
    exchange = exchange_of(frame)
    wait = chain.hold(client_view(), exchange, frame)
    ((client, charges, future),) = fleet.claims
    assert wait is future
    assert (client.client_id, charges.mutations) == ("creator", ((exchange.mutation.request.topics[0].label, 3),))
    # The fleet refused the topic (its budget is spent elsewhere): the proxy answers for it.
    refused = chain.engine.mutations("1", "ANONYMOUS", "creator", charges.api_key, charges.api_version,
                                     [("other", 10_000)], 6_000.0)
    assert refused.accepted == [True]  # 10,000 partitions take the bucket into debt
    outcome = chain.engine.mutations("1", "ANONYMOUS", "creator", charges.api_key, charges.api_version,
                                     list(charges.mutations or ()), 6_500.0)
    future.set_result(FleetCharge(RequestOutcome(throttle_ms=outcome.throttle_ms, mutation=outcome), 6_500.0))
    verdict = chain.request(client_view(), exchange, frame)
    assert verdict is not None and verdict.answer is not None
    assert exchange.quota is not None and exchange.quota.request_now_ms == 6_500.0  # the fleet's charge time


async def test_no_hold_without_a_mutation_quota_or_for_other_apis() -> None:
    chain, fleet = enforcement("someone-else")
    frame = create_topics(1, partitions=3)
    assert chain.hold(client_view(), exchange_of(frame), frame) is None
    heartbeat = heartbeat_request(2)
    assert chain.hold(client_view(), exchange_of(heartbeat), heartbeat) is None
    assert fleet.claims == []
