"""Kafka's client quotas applied on the wire, the way a broker applies them (KIP-219).

For each request the hook works out the client's quota entity (principal from the SASL
exchange, client-id from the header), records what Kafka records, and computes the
throttle. The response goes back at once carrying max(broker throttle, proxy throttle) in
ThrottleTimeMs, then the connection is muted for the proxy's throttle: clients that honour
the field back off, and those that don't (librdkafka, acks=0 producers) find their next
requests unread until the throttle ends.

Where each quota is charged, following Kafka's KafkaApis:

* produce_byte_rate (KIP-13): the request's size, when its response comes back (the broker
  records it in the produce response callback); at arrival for acks=0, which has no response.
* fetch_byte_rate (KIP-13): the response's size, when it comes back; a Fetch's MaxBytes is
  first capped at what the quota window allows (`_cap_fetch`), as the broker caps it with
  ClientQuotaManager.getMaxValueInQuotaWindow, so one fetch cannot take a window's worth
  many times over.
* request_percentage (KIP-124): the request's time on the broker, which the proxy cannot see;
  it charges the round trip it measured (less a Fetch's MaxWaitMs, time the broker spent
  waiting, not working), see kqp.quotas.recording.
* controller_mutation_rate (KIP-599): partitions created or deleted, at arrival, so that a
  strict request can be refused topic by topic before the broker acts on it.

The arithmetic (rates, windows, throttle times) is kqp.quotas; this hook only decides when
to call it, where the throttle goes in the response, and which connections it mutes. The
same charging rules are used by the Spark replay (kqp.spark_jobs.quota_replay), through
kqp.quotas.recording.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from kqp.config.models import EnforcementSection
from kqp.protocol.api_keys import ApiKey
from kqp.protocol.close_reason import CloseReason
from kqp.protocol.errors import ProtocolError
from kqp.protocol.fast_path import patch_fetch_max_bytes
from kqp.protocol.gate import ONE_AT_A_TIME_AFTER_THROTTLE_S
from kqp.protocol.headers import encode_response_header
from kqp.protocol.mutations import (
    MUTATION_APIS,
    THROTTLING_QUOTA_EXCEEDED,
    MutationRequest,
    TopicMutation,
    merge_rejections,
    read_mutation_request,
    request_without,
    throttled_response,
)
from kqp.protocol.throttle_field import (
    patch_throttle_time,
    read_throttle_time,
    read_throttle_time_at,
    write_throttle_time,
)
from kqp.proxy.hooks import (
    ClientView,
    ConnectionControl,
    Exchange,
    FleetCharge,
    MutationFindings,
    MutationNote,
    RequestVerdict,
    ResponseVerdict,
    TrafficHooks,
    read_fetch_request,
)
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import QuotaEngine, QuotaType
from kqp.quotas.recording import (
    QuotaClient,
    QuotaTrace,
    RequestCharges,
    RequestOutcome,
    broker_label,
    charge_request,
    charge_response,
    exchange_throttle,
    request_charged_at_arrival,
    request_charges,
    response_charges,
)
from kqp.quotas.turns import ConnectionTurns

log = logging.getLogger(__name__)


class MutationOrder(Protocol):
    """Charges partition mutations in an order every proxy of a fleet shares (kqp.proxy.fleet)."""

    def claim(self, client: QuotaClient, charges: RequestCharges) -> asyncio.Future[FleetCharge | None] | None:
        """A future for the charge once the fleet has applied it; None to charge here at once."""
        ...


class QuotaEnforcement(TrafficHooks):
    """The quota hook: one per proxy (or per worker), shared by all its connections."""

    def __init__(
        self,
        engine: QuotaEngine,
        settings: EnforcementSection,
        clock_ms: Callable[[], float],
        topics: TopicDirectory,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self._now_ms = clock_ms
        self._topics = topics
        # (principal, client-id) -> when its latest throttle ends (ms). A client that opens a
        # new connection while throttled (librdkafka does after a request timeout) must not
        # pipeline its backlog through it: see `ClientGate.read_one_at_a_time` in kqp.protocol.gate.
        self._throttled_until: dict[tuple[str, str], float] = {}
        # Numbers every engine call, so a replay of the capture can order calls whose clock
        # readings tie (see kqp.quotas.recording.QuotaTrace).
        self._engine_calls = 0
        # (principal, client-id) -> its open connections, kept only while some quota has
        # `scope: cluster`: a throttle on that one budget holds every connection, as one broker.
        # Each connection keeps the keys it registered in its own state (ClientView.state).
        self._connections_of: dict[tuple[str, str], dict[int, ConnectionControl]] = {}
        self._scope_checked_for: object = None
        self._cluster_scope = False
        # Set when the proxy is one of a fleet: mutations wait for the fleet's order.
        self.mutation_order: MutationOrder | None = None
        # `fair_connection_turns`: the connections charging each byte-rate budget, muted
        # together until its latest throttle ends (kqp.quotas.turns).
        self._turns = ConnectionTurns(ONE_AT_A_TIME_AFTER_THROTTLE_S * 1000.0)
        self._controls: dict[int, ConnectionControl] = {}
        # The request verdict of each API that has one; every other API gets none.
        self._request_verdicts: dict[int, Callable[[ClientView, Exchange, bytes], RequestVerdict | None]] = {
            ApiKey.PRODUCE: self._produce_request,
            ApiKey.FETCH: self._cap_fetch,
            ApiKey.SHARE_FETCH: self._cap_fetch,
            **{api_key: self._mutations for api_key in MUTATION_APIS},
        }

    @staticmethod
    def _key(client: ClientView, exchange: Exchange) -> tuple[str, str]:
        """The (principal, client-id) pair a throttle follows across connections."""
        return client.principal, exchange.header.client_id or ""

    def _throttled(self, client: ClientView, exchange: Exchange, throttle_ms: int) -> None:
        """A throttle was given: remember it for the client's other and future connections,
        and hold its other connections when its quota is one cluster-wide budget."""
        key = self._key(client, exchange)
        self._note_throttle(key, throttle_ms, self._now_ms())
        self._hold_every_connection(client, key, throttle_ms)

    def _note_throttle(self, client: tuple[str, str], throttle_ms: int, now_ms: float) -> None:
        until = now_ms + throttle_ms
        if until > self._throttled_until.get(client, 0.0):
            self._throttled_until[client] = until

    def forget_expired_throttles(self, now_ms: float) -> None:
        """Drop clients whose one-at-a-time span has passed (called periodically by the app,
        so `_throttled_until` does not grow with every client ever throttled)."""
        cutoff = now_ms - ONE_AT_A_TIME_AFTER_THROTTLE_S * 1000.0
        expired = [client for client, until in self._throttled_until.items() if until < cutoff]
        for client in expired:
            del self._throttled_until[client]
        self._turns.expire(now_ms)

    def _turn_budget(self, client: ClientView, exchange: Exchange) -> tuple[str, str, str, int] | None:
        """The byte-rate budget a response charged, as `fair_connection_turns` groups
        connections: the sensor's broker label and entity, and Produce or Fetch (a consumer
        sharing a producer's client-id is not held by its throttles). None when off."""
        api_key = exchange.header.api_key
        if not self.settings.fair_connection_turns or api_key not in (ApiKey.PRODUCE, ApiKey.FETCH,
                                                                      ApiKey.SHARE_FETCH):
            return None
        quota_client = self._client(client, exchange)
        family = ApiKey.PRODUCE if api_key == ApiKey.PRODUCE else ApiKey.FETCH
        return quota_client.broker, quota_client.principal, quota_client.client_id, family

    def _turn_without_throttle(self, client: ClientView, exchange: Exchange) -> int:
        """Fair turns: a response Kafka does not throttle still waits for the budget's turn."""
        budget = self._turn_budget(client, exchange)
        if budget is None:
            return 0
        return self._apply_turns(budget, client, 0)

    def _apply_turns(self, budget: tuple[str, str, str, int], client: ClientView, throttle_ms: int) -> int:
        own, *others = self._turns.throttled(budget, client.connection_id, throttle_ms, self._now_ms())
        for other in others:
            control = self._controls.get(other.connection_id)
            if control is not None and other.mute_ms > 0:
                control.mute(other.mute_ms)
        return own.mute_ms

    def _mute_for(self, client: ClientView, exchange: Exchange, throttle_ms: int) -> int:
        """How long to mute this connection after a response throttled by `throttle_ms`:
        Kafka's throttle, or with fair turns the budget's latest end, which then also holds
        the client's other connections on that budget."""
        self._throttled(client, exchange, throttle_ms)
        budget = self._turn_budget(client, exchange)
        if budget is None:
            return throttle_ms
        return self._apply_turns(budget, client, throttle_ms)

    @staticmethod
    def _client(client: ClientView, exchange: Exchange) -> QuotaClient:
        # The broker label names the budget: per broker, as each Kafka broker enforces its
        # quota on the traffic it sees, or one for the cluster (`scope: cluster`). Kept in
        # the connection's state while its principal and client id stay the same.
        state = client.state
        client_id = exchange.header.client_id or ""
        known = state.quota_client
        if known is not None and known.client_id == client_id and known.principal == client.principal:
            return known
        state.quota_client = quota_client = QuotaClient(broker_label(client.broker), client.principal, client_id)
        return quota_client

    def _trace(self, client: ClientView, exchange: Exchange) -> QuotaTrace:
        """The record of this exchange's engine calls, which the capture stores so that a
        replay can make the same calls in the same order (kqp.quotas.recording). Kept unless
        the connection is known not to be captured (`ConnectionHookState.captured`); the
        calls are numbered either way, so the numbers a capture holds stay the process's."""
        if exchange.quota is None:
            exchange.quota = QuotaTrace(broker_label(client.broker))
        return exchange.quota

    def _charge_request(
        self, client: ClientView, exchange: Exchange, charges: RequestCharges, charged: FleetCharge | None = None
    ) -> RequestOutcome:
        """Charge the request now, or record the charge the fleet already made (`charged`)."""
        now = self._now_ms() if charged is None else charged.charged_at_ms
        self._engine_calls += 1
        if client.state.captured is not False:
            trace = self._trace(client, exchange)
            trace.request_seq, trace.request_now_ms, trace.request = self._engine_calls, now, charges
        if charged is None:
            outcome = charge_request(self.engine, self._client(client, exchange), charges, now)
        else:
            outcome = charged.outcome
        # Kept for the response: a request-time throttle (a mutation's) is combined with the
        # response's own, as the broker returns the larger of its quotas' throttles.
        if outcome.throttle_ms:
            exchange.request_outcome = outcome
        return outcome

    # ---- requests --------------------------------------------------------------------

    def _cluster_scope_in_use(self) -> bool:
        settings = self.engine.settings
        if settings is not self._scope_checked_for:  # once per configuration, not per request
            self._scope_checked_for = settings
            self._cluster_scope = settings.scope == "cluster" or any(e.scope == "cluster" for e in settings.entries)
        return self._cluster_scope

    def _hold_every_connection(self, client: ClientView, key: tuple[str, str], throttle: int) -> None:
        """`scope: cluster`: mute the client's other connections too, as a single broker would."""
        others = self._connections_of.get(key)
        if not others or len(others) < 2 or not self.engine.cluster_scoped(*key):
            return
        for connection_id, other in others.items():
            if connection_id != client.connection_id:
                other.mute(throttle, one_at_a_time=False)

    def connection_closed(self, client: ClientView, reason: CloseReason) -> None:
        self._turns.closed(client.connection_id)
        self._controls.pop(client.connection_id, None)
        for key in client.state.cluster_scope_keys:
            conns = self._connections_of.get(key)
            if conns is not None:
                conns.pop(client.connection_id, None)
                if not conns:
                    del self._connections_of[key]

    def request(self, client: ClientView, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        if self._cluster_scope_in_use():
            # Registered per request, not per connection: the client id comes with each
            # request header and may differ between requests of one connection.
            key = self._key(client, exchange)
            self._connections_of.setdefault(key, {})[client.connection_id] = client.control
            client.state.cluster_scope_keys.add(key)
        # A client throttled recently (on any connection) is read one request at a time here
        # too, until its throttle plus one quota span has passed.
        one_at_a_time_s = 0.0
        if self._throttled_until:
            until = self._throttled_until.get(self._key(client, exchange))
            if until is not None:
                remaining_ms = until + ONE_AT_A_TIME_AFTER_THROTTLE_S * 1000.0 - self._now_ms()
                if remaining_ms > 0:
                    one_at_a_time_s = remaining_ms / 1000.0
        decide = self._request_verdicts.get(exchange.header.api_key)
        verdict = decide(client, exchange, frame) if decide is not None else None
        if one_at_a_time_s:
            verdict = verdict or RequestVerdict()
            verdict.one_at_a_time_s = one_at_a_time_s
        return verdict

    def _produce_request(self, client: ClientView, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        """acks=0: no response will carry a throttle, so record now and mute at once. Every
        other Produce is charged when its response comes back, as the broker does."""
        if exchange.expects_response:
            return None
        header = exchange.header
        charges = request_charges(header.api_key, header.api_version, exchange.request_bytes - 4,
                                  expects_response=False)
        throttle = self._charge_request(client, exchange, charges).throttle_ms
        exchange.proxy_throttle_ms = throttle
        if not throttle:
            return None
        self._throttled(client, exchange, throttle)
        return RequestVerdict(mute_ms=throttle)

    def _cap_fetch(self, client: ClientView, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        header = exchange.header
        if not header.known:
            return None  # a ShareFetch version newer than the definitions may lay its limits out differently
        # request_bytes includes the 4-byte size prefix; Kafka's request size does not.
        charges = request_charges(header.api_key, header.api_version, exchange.request_bytes - 4, True)
        if not request_charged_at_arrival(self.engine, charges):
            return None  # nothing needs the request's limits: skip parsing it
        try:
            findings = read_fetch_request(exchange, frame)
        except ProtocolError:
            return None  # forwarded unchanged: the broker, not the proxy, rejects a bad Fetch
        fetch = findings.request
        cap = self._charge_request(client, exchange, charges).fetch_max_bytes_cap
        offset = fetch.max_bytes_offset
        if cap is None or offset is None or fetch.max_bytes is None or cap >= fetch.max_bytes:
            return None
        # As KafkaApis: max_bytes = min(max_bytes, quota window), min_bytes = min(min_bytes, max_bytes).
        # MinBytes is the int32 right before MaxBytes in every version that has MaxBytes.
        # At least one byte: the broker always returns the first batch whole anyway (KIP-74),
        # and MaxBytes 0 would read as "nothing wanted".
        cap = max(cap, 1)
        patched = bytearray(frame)
        patch_fetch_max_bytes(patched, header.body_offset + offset, cap)
        if fetch.min_bytes > cap:
            patch_fetch_max_bytes(patched, header.body_offset + offset - 4, cap)
            findings.forwarded_min_bytes = cap
        findings.forwarded_max_bytes = cap
        return RequestVerdict(frame=bytes(patched))

    def _mutation_charges(self, exchange: Exchange, frame: bytes) -> RequestCharges | None:
        """What a mutation request charges (None: nothing, validate-only); read once per request."""
        header = exchange.header
        if exchange.mutation is None:
            exchange.mutation = MutationFindings(read_mutation_request(
                header.api_key, header.api_version, memoryview(frame)[header.body_offset:],
                self._topics.partitions, self.settings.default_partitions,
            ))
        request = exchange.mutation.request
        if request.validate_only and not self.settings.charge_validate_only:
            return None
        topics = [(t.label, t.partitions) for t in request.topics]
        return request_charges(header.api_key, header.api_version, exchange.request_bytes - 4, True, topics)

    def hold(self, client: ClientView, exchange: Exchange, frame: bytes) -> asyncio.Future[FleetCharge | None] | None:
        """In a fleet, a mutation with a quota waits for the fleet to charge it in its order.

        Mutations are rare and their verdict is all-or-nothing per topic, so proxies of a fleet
        agree on one order instead of each charging its own copy of the budget: two proxies
        must not both accept the topic that exhausts it."""
        order = self.mutation_order
        header = exchange.header
        if order is None or header.api_key not in MUTATION_APIS:
            return None
        if self.engine.quota("controller_mutation_rate", client.principal, header.client_id or "") is None:
            return None  # nothing limits this client's mutations: no verdict to agree on
        try:
            charges = self._mutation_charges(exchange, frame)
        except ProtocolError:
            return None  # `request` reports it as for any proxy
        if charges is None:
            return None
        assert exchange.mutation is not None  # read by _mutation_charges
        claim = exchange.mutation.claim = order.claim(self._client(client, exchange), charges)
        return claim

    def _mutations(self, client: ClientView, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        header = exchange.header
        charges = self._mutation_charges(exchange, frame)
        findings = exchange.mutation
        assert findings is not None  # read by _mutation_charges
        request = findings.request
        if charges is None:
            return None
        claim = findings.claim
        # A claim that timed out or failed leaves `charged` None: the proxy then charges
        # locally, as a proxy outside a fleet would.
        charged = claim.result() if claim is not None and claim.done() and not claim.cancelled() else None
        outcome = self._charge_request(client, exchange, charges, charged).mutation
        assert outcome is not None  # a mutation API with topics to charge
        rejected = [t for t, accepted in zip(request.topics, outcome.accepted, strict=True) if not accepted]
        findings.rejected = rejected
        if not rejected:
            return None
        if len(rejected) == len(request.topics):
            # Nothing left to forward (an empty request would still reach the controller):
            # the proxy answers, carrying the throttle, and mutes once the answer is sent.
            body = throttled_response(request, rejected, outcome.throttle_ms)
            answer = encode_response_header(header.api_key, header.api_version, header.correlation_id) + body
            exchange.proxy_throttle_ms = outcome.throttle_ms
            findings.notes = _mutation_notes(request, rejected)
            return RequestVerdict(answer=answer, mute_ms=0)
        # Some topics pass: forward them alone; the rejected ones are merged into the
        # broker's answer in `response`.
        body = request_without(request, rejected)
        return RequestVerdict(frame=frame[: header.body_offset] + body)

    # ---- responses -------------------------------------------------------------------

    def response(
        self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int
    ) -> ResponseVerdict | None:
        header = exchange.header
        api_key = header.api_key
        if exchange.local_response is not None:
            # Answered by the proxy (every topic rejected): the throttle is already in it.
            throttle = exchange.proxy_throttle_ms
            if not throttle:
                return None
            self._throttled(client, exchange, throttle)
            return ResponseVerdict(mute_ms=throttle)
        response_throttle, now = self._charge_response(client, exchange, len(frame) - body_offset)
        outcome = exchange.request_outcome
        out: bytes | bytearray = frame
        mutation = exchange.mutation
        upstream_ms = _upstream_answer_ms(exchange) if outcome is not None else None
        if mutation is not None:
            rejected = mutation.rejected
            if rejected:
                mutation_throttle = outcome.throttle_after(now, upstream_ms) if outcome is not None else 0
                body = merge_rejections(mutation.request, memoryview(frame)[body_offset:], rejected, mutation_throttle)
                out = frame[:body_offset] + body
            mutation.notes = _mutation_notes(mutation.request, rejected)
        # Without a request outcome (the common case) the response's own throttle is all.
        throttle = (exchange_throttle(outcome, response_throttle, now, upstream_ms) if outcome is not None
                    else max(response_throttle, 0))
        exchange.proxy_throttle_ms = throttle
        # The session may have found ThrottleTimeMs already (Produce); that holds for `frame` only.
        known_offset = exchange.response_throttle_offset if out is frame else None
        broker_throttle = self._broker_throttle(exchange, out, body_offset, known_offset)
        if throttle <= 0:
            turn_ms = self._turn_without_throttle(client, exchange) if self.settings.fair_connection_turns else 0
            return ResponseVerdict(frame=out, mute_ms=turn_ms) if out is not frame or turn_ms else None
        mute_ms = self._mute_for(client, exchange, throttle)
        # ThrottleTimeMs carries the larger of the broker's and the proxy's throttle: the
        # client waits once, for the longer; the mute applies the proxy's own in any case.
        if broker_throttle is not None and throttle > broker_throttle:
            patched = bytearray(out)
            if known_offset is not None:
                write_throttle_time(patched, known_offset, throttle)
            else:
                patch_throttle_time(patched, body_offset, api_key, header.api_version, throttle)
            out = patched
        return ResponseVerdict(frame=out, mute_ms=mute_ms)

    def response_started(
        self, client: ClientView, exchange: Exchange, head: bytearray, body_offset: int, frame_size: int
    ) -> ResponseVerdict | None:
        """A streamed (cut-through) response: charged by the size its frame header gives, its
        ThrottleTimeMs (in the head) patched in place, as `response` does for a whole frame."""
        response_throttle, now = self._charge_response(client, exchange, frame_size - body_offset)
        throttle = exchange_throttle(exchange.request_outcome, response_throttle, now, _upstream_answer_ms(exchange))
        exchange.proxy_throttle_ms = throttle
        broker_throttle = self._broker_throttle(exchange, head, body_offset)
        if throttle <= 0:
            turn_ms = self._turn_without_throttle(client, exchange)
            return ResponseVerdict(mute_ms=turn_ms) if turn_ms else None
        mute_ms = self._mute_for(client, exchange, throttle)
        if broker_throttle is not None and throttle > broker_throttle:
            header = exchange.header
            patch_throttle_time(head, body_offset, header.api_key, header.api_version, throttle)
        return ResponseVerdict(mute_ms=mute_ms)

    def _charge_response(self, client: ClientView, exchange: Exchange, body_size: int) -> tuple[int, float]:
        """Charge what a response costs (bytes, request time); its throttle (ms) and the
        engine time it was charged at."""
        # The proxy's stand-in for the broker's request handling time (KIP-124): from when
        # the request was written upstream to when its response (or its head) arrived.
        round_trip_ms = (exchange.response_received_at - exchange.sent_at) * 1000.0
        charges = response_charges(
            exchange.header.api_key, exchange.request_bytes - 4, body_size, round_trip_ms,
            exchange.fetch_max_wait_ms,
        )
        now = self._now_ms()
        self._engine_calls += 1
        if client.state.captured is not False:
            trace = self._trace(client, exchange)
            trace.response_seq, trace.response_now_ms, trace.response = self._engine_calls, now, charges
        budget = self._turn_budget(client, exchange) if self.settings.fair_connection_turns else None
        if budget is not None:
            amount = exchange.request_bytes - 4 if exchange.header.api_key == ApiKey.PRODUCE else body_size
            quota_type: QuotaType = "producer_byte_rate" if budget[3] == ApiKey.PRODUCE else "consumer_byte_rate"
            limit = self.engine.quota(quota_type, budget[1], budget[2])
            self._turns.charged(budget, client.connection_id, amount, now, limit)
            self._controls[client.connection_id] = client.control
        return charge_response(self.engine, self._client(client, exchange), charges, now), now

    @staticmethod
    def _broker_throttle(
        exchange: Exchange, frame: bytes | bytearray, body_offset: int, known_offset: int | None = None
    ) -> int | None:
        """The broker's own ThrottleTimeMs in the response (None: the version has no such
        field, or the bytes do not read), noted on the exchange for metrics and capture."""
        header = exchange.header
        try:
            if known_offset is not None:
                broker_throttle: int | None = read_throttle_time_at(frame, known_offset)
            else:
                broker_throttle = read_throttle_time(frame, body_offset, header.api_key, header.api_version)
        except ProtocolError:
            return None
        if broker_throttle:
            exchange.broker_throttle_ms = broker_throttle
        return broker_throttle


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
