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
    ResponseCharges,
    broker_label,
    charge_request,
    request_charges,
)


def quota_client(client: ClientView, exchange: Exchange) -> QuotaClient:
    """The budget an exchange charges: the broker label names it, per broker, as each Kafka
    broker enforces its quota on the traffic it sees, or one for the cluster (`scope: cluster`)."""
    return QuotaClient(broker_label(client.broker), client.principal, exchange.header.client_id or "")


def trace_engine_call(
    registry: PolicyRegistry, client: ClientView, exchange: Exchange, now_ms: float, *,
    request: RequestCharges | None = None, response: ResponseCharges | None = None,
) -> None:
    """Number an engine call and keep its inputs in the exchange's trace (`Exchange.quota`),
    which the capture stores so that a replay can make the same calls in the same order
    (kqp.quotas.recording). Its two halves, `numbered_and_traced` and `keep_trace`, are the
    one place the trace is numbered and written, for requests and responses.

    The trace is kept unless the connection is known not to be captured
    (`ConnectionHookState.captured`); the calls are numbered either way, so the numbers a
    capture holds stay the process's."""
    if numbered_and_traced(registry, client):
        keep_trace(client, exchange, registry.engine_calls, now_ms, request=request, response=response)


def numbered_and_traced(registry: PolicyRegistry, client: ClientView) -> bool:
    """Number an engine call (`trace_engine_call`'s first half); whether its inputs are to be
    kept (`keep_trace`), for a caller that builds them only then."""
    registry.engine_calls += 1
    return client.state.captured is not False


def keep_trace(
    client: ClientView, exchange: Exchange, seq: int, now_ms: float, *,
    request: RequestCharges | None = None, response: ResponseCharges | None = None,
) -> None:
    """Keep a numbered engine call's inputs in the exchange's trace (`trace_engine_call`'s second half)."""
    record = exchange.quota
    if record is None:
        record = exchange.quota = QuotaTrace(broker_label(client.broker))
    if response is not None:
        record.response_seq, record.response_now_ms, record.response = seq, now_ms, response
    else:
        record.request_seq, record.request_now_ms, record.request = seq, now_ms, request


def charge_request_now(
    registry: PolicyRegistry, client: ClientView, exchange: Exchange, who: QuotaClient, charges: RequestCharges,
    now_ms: float, charged: FleetCharge | None = None,
) -> RequestOutcome:
    """Charge the request now, or record the charge the fleet already made (`charged`), and
    trace it (`trace_engine_call`)."""
    now = now_ms if charged is None else charged.charged_at_ms
    trace_engine_call(registry, client, exchange, now, request=charges)
    return charge_request(registry.engine, who, charges, now) if charged is None else charged.outcome


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
