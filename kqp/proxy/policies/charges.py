"""What Kafka's charging modules (kafka_charging, kafka_mutations) and the fleet's mutation
order share: the quota client of an exchange, its engine trace, a request's charge.

Not a policy: functions on an exchange and the registry, keeping nothing themselves.
"""

from __future__ import annotations

from kqp.protocol.mutations import read_mutation_request
from kqp.proxy.hooks import ClientView, Exchange, FleetCharge, MutationFindings
from kqp.proxy.policies.registry import PolicyRegistry
from kqp.quotas.recording import (
    QuotaClient,
    QuotaTrace,
    RequestCharges,
    RequestOutcome,
    broker_label,
    charge_request,
    request_charges,
)


def quota_client(client: ClientView, exchange: Exchange) -> QuotaClient:
    """The budget an exchange charges: the broker label names it, per broker, as each Kafka
    broker enforces its quota on the traffic it sees, or one for the cluster (`scope: cluster`)."""
    return QuotaClient(broker_label(client.broker), client.principal, exchange.header.client_id or "")


def trace(client: ClientView, exchange: Exchange) -> QuotaTrace:
    """The record of this exchange's engine calls, which the capture stores so that a replay
    can make the same calls in the same order (kqp.quotas.recording)."""
    if exchange.quota is None:
        exchange.quota = QuotaTrace(broker_label(client.broker))
    return exchange.quota


def charge_request_now(
    registry: PolicyRegistry, client: ClientView, exchange: Exchange, who: QuotaClient, charges: RequestCharges,
    now_ms: float, charged: FleetCharge | None = None,
) -> RequestOutcome:
    """Charge the request now, or record the charge the fleet already made (`charged`).

    The trace is kept unless the connection is known not to be captured
    (`ConnectionHookState.captured`); the calls are numbered either way, so the numbers a
    capture holds stay the process's."""
    now = now_ms if charged is None else charged.charged_at_ms
    registry.engine_calls += 1
    if client.state.captured is not False:
        record = trace(client, exchange)
        record.request_seq, record.request_now_ms, record.request = registry.engine_calls, now, charges
    outcome = charge_request(registry.engine, who, charges, now) if charged is None else charged.outcome
    # Kept for the response: a request-time throttle (a mutation's) is combined with the
    # response's own, as the broker returns the larger of its quotas' throttles.
    if outcome.throttle_ms:
        exchange.request_outcome = outcome
    return outcome


def mutation_charges(registry: PolicyRegistry, exchange: Exchange, frame: bytes) -> RequestCharges | None:
    """What a mutation request charges (None: nothing, validate-only); read once per request
    and kept on the exchange (`Exchange.mutation`), as a Fetch's limits are."""
    header = exchange.header
    settings = registry.settings
    if exchange.mutation is None:
        exchange.mutation = MutationFindings(read_mutation_request(
            header.api_key, header.api_version, memoryview(frame)[header.body_offset:],
            registry.topics.partitions, settings.default_partitions,
        ))
    request = exchange.mutation.request
    if request.validate_only and not settings.charge_validate_only:
        return None
    topics = [(t.label, t.partitions) for t in request.topics]
    return request_charges(header.api_key, header.api_version, exchange.request_bytes - 4, True, topics)
