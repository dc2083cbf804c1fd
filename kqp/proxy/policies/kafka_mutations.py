"""Kafka's controller mutation quota (KIP-599), charged as KafkaApis and the controller do.

Partitions created or deleted are charged at arrival, so that a strict request (CreateTopics
v6+, CreatePartitions v3+, DeleteTopics v5+) can be refused topic by topic before the broker
acts on it: the refused topics get THROTTLING_QUOTA_EXCEEDED, the rest is forwarded alone
and the refusals are merged into the broker's answer; when every topic is refused the proxy
answers itself. The throttle the response carries is the mutation's, less the upstream's
answer time as Kafka's controller reduces it by its own span (`RequestOutcome.throttle_after`);
the chain folds it with the response's own by max, as `exchange_throttle` does for the replay.
"""

from __future__ import annotations

from kqp.protocol.headers import encode_response_header
from kqp.protocol.mutations import (
    MUTATION_APIS,
    THROTTLING_QUOTA_EXCEEDED,
    MutationRequest,
    TopicMutation,
    merge_rejections,
    request_without,
    throttled_response,
)
from kqp.proxy.hooks import ClientView, Exchange, MutationNote, RequestVerdict, ResponseVerdict
from kqp.proxy.policies.charges import charge_request_now, mutation_charges, quota_client
from kqp.proxy.policies.policy import Policy
from kqp.proxy.policies.registry import PolicyRegistry


class KafkaMutations(Policy):
    """CreateTopics, CreatePartitions and DeleteTopics against controller_mutation_rate."""

    request_apis = MUTATION_APIS
    response_apis = MUTATION_APIS

    def __init__(self, registry: PolicyRegistry) -> None:
        self._registry = registry

    def request(self, client: ClientView, exchange: Exchange, frame: bytes, now_ms: float) -> RequestVerdict | None:
        header = exchange.header
        charges = mutation_charges(self._registry, exchange, frame)
        findings = exchange.mutation
        assert findings is not None  # read by mutation_charges
        request = findings.request
        if charges is None:
            return None
        claim = findings.claim
        # A fleet's claim (kqp.proxy.policies.fleet_mutation_order) that timed out or failed
        # leaves `charged` None: the proxy then charges locally, as one outside a fleet would.
        charged = claim.result() if claim is not None and claim.done() and not claim.cancelled() else None
        charge = charge_request_now(self._registry, client, exchange, quota_client(client, exchange), charges,
                                    now_ms, charged)
        if charge.throttle_ms:
            # Kept for the response: the mutation's throttle is combined with the response's
            # own, as the broker returns the larger of its quotas' throttles.
            findings.outcome = charge
        outcome = charge.mutation
        assert outcome is not None  # a mutation API with topics to charge
        rejected = [t for t, accepted in zip(request.topics, outcome.accepted, strict=True) if not accepted]
        findings.rejected = rejected
        if not rejected:
            return None
        if len(rejected) == len(request.topics):
            # Nothing left to forward (an empty request would still reach the controller):
            # the proxy answers, carrying the throttle, and mutes once the answer is sent
            # (`response` gives that throttle, when the answer goes out).
            body = throttled_response(request, rejected, outcome.throttle_ms)
            answer = encode_response_header(header.api_key, header.api_version, header.correlation_id) + body
            findings.notes = _mutation_notes(request, rejected)
            return RequestVerdict(answer=answer)
        # Some topics pass: forward them alone; the rejected ones are merged into the
        # broker's answer in `response`.
        body = request_without(request, rejected)
        return RequestVerdict(frame=frame[: header.body_offset] + body)

    def response(
        self, client: ClientView, exchange: Exchange, frame: bytes | bytearray, body_offset: int, body_size: int,
        now_ms: float,
    ) -> ResponseVerdict | None:
        outcome = exchange.mutation.outcome if exchange.mutation is not None else None
        if exchange.local_response is not None:
            # Answered by the proxy (every topic rejected): the throttle is already in it.
            throttle = outcome.throttle_ms if outcome is not None else 0
            return ResponseVerdict(mute_ms=throttle, throttle_ms=throttle) if throttle else None
        throttle = outcome.throttle_after(now_ms, _upstream_answer_ms(exchange)) if outcome is not None else 0
        merged: bytes | None = None
        mutation = exchange.mutation
        if mutation is not None:
            rejected = mutation.rejected
            if rejected:
                body = merge_rejections(mutation.request, memoryview(frame)[body_offset:], rejected, throttle)
                merged = bytes(frame[:body_offset]) + body
            mutation.notes = _mutation_notes(mutation.request, rejected)
        if throttle <= 0 and merged is None:
            return None
        throttle = max(throttle, 0)
        return ResponseVerdict(frame=merged, mute_ms=throttle, throttle_ms=throttle)


def _upstream_answer_ms(exchange: Exchange) -> float | None:
    """How long the upstream took to answer (request written to answer read), in ms; what a
    mutation's throttle is reduced by, as Kafka's controller reduces it by its own span."""
    if not exchange.sent_at or not exchange.response_received_at:
        return None
    return max(exchange.response_received_at - exchange.sent_at, 0.0) * 1000.0


def _mutation_notes(request: MutationRequest, rejected: list[TopicMutation]) -> list[MutationNote]:
    """Per topic of the request, what it got from the proxy (0 when passed to the broker)."""
    rejected_labels = {t.label for t in rejected}
    return [
        MutationNote(t.label, t.partitions, THROTTLING_QUOTA_EXCEEDED if t.label in rejected_labels else 0)
        for t in request.topics
    ]
