"""What a request and its response charge to which quota, and when: the one copy of the rules.

The proxy's Kafka policies (kqp/proxy/policies/kafka_*.py) and the what-if replay
(kqp/spark_jobs/quota_replay.py) both call these functions, so a replay of the inputs the
proxy recorded takes the proxy's decisions exactly. Each exchange has up to two moments:

* when the request arrives: Produce with acks=0 (no response will come) records its size;
  CreateTopics / CreatePartitions / DeleteTopics charge the controller-mutation bucket
  (KIP-599); a Fetch looks up the cap on its MaxBytes (the quota window's worth of bytes);
* when the response comes back: Produce records its request size, Fetch and ShareFetch their
  response size (4 + body, as Kafka counts it) to the consumer byte rate, every API its
  request time (the broker round trip, less a long-poll Fetch's wait in purgatory, which
  Kafka does not count). A Fetch that either throttles is answered empty and its bytes are
  unrecorded again (`answered_empty`), as KafkaApis does.

The exchange's throttle is the largest of the two moments' throttles (`exchange_throttle`),
never their sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kqp.frozen_value import FrozenValue
from kqp.protocol.api_keys import MUTATION_API_KEYS, ApiKey
from kqp.quotas.engine import MutationOutcome, QuotaManagers

# Handled by the broker's network-layer authenticator (SaslServerAuthenticator), before and
# outside KafkaApis: their time is never charged to a request quota.
AUTHENTICATOR_API_KEYS: frozenset[int] = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
# The 4-byte size prefix Kafka adds back when it counts a Fetch response (4 + body size).
SIZE_PREFIX_BYTES = 4
# Responses whose size Kafka 4.3 charges to the consumer byte rate (quotas.fetch): Fetch, and
# ShareFetch (KIP-932; KafkaApis.processShareFetchResponse records 4 + body the same way).
FETCH_QUOTA_API_KEYS: frozenset[int] = frozenset({ApiKey.FETCH, ApiKey.SHARE_FETCH})
# Responses that, when throttled by any quota, go to the client empty (no partitions) and whose
# bytes are then unrecorded, as KafkaApis.handleFetchRequest answers with
# FetchContext.getThrottledResponse and calls quotas.fetch.unrecordQuotaSensor.
THROTTLED_EMPTY_API_KEYS: frozenset[int] = frozenset({ApiKey.FETCH})


def broker_label(node_id: int | None) -> str:
    """The budget name of a broker: its node id, or `bootstrap` before the proxy knows the node.

    The engine turns it into a budget per broker or one for the cluster (quotas.scope).
    """
    return "bootstrap" if node_id is None or node_id < 0 else str(node_id)


@dataclass(frozen=True, slots=True)
class QuotaClient(FrozenValue):
    """Whose sensors a charge goes to: the broker label (`bootstrap`, `1`, ...) and the entity."""

    broker: str
    principal: str
    client_id: str


@dataclass(frozen=True, slots=True)
class RequestCharges(FrozenValue):
    """What a request charges when it arrives."""

    api_key: int
    api_version: int
    # Produce with acks=0: the request size (frame less its size prefix).
    produce_bytes: int | None = None
    # Controller mutations: (topic label, partitions) in request order.
    mutations: tuple[tuple[str, int], ...] | None = None
    # A Fetch whose MaxBytes the proxy may cap.
    fetch: bool = False


@dataclass(frozen=True, slots=True)
class RequestOutcome(FrozenValue):
    throttle_ms: int = 0
    fetch_max_bytes_cap: int | None = None
    mutation: MutationOutcome | None = None

    def throttle_at(self, now_ms: float) -> int:
        """The request's throttle as a response sent at `now_ms` reports it: a controller
        mutation's shrinks by the time since it was charged, as Kafka's controller reports it."""
        return self.mutation.throttle_at(now_ms) if self.mutation is not None else self.throttle_ms

    def throttle_after(self, now_ms: float, upstream_ms: float | None) -> int:
        """The request's throttle in a response the upstream took `upstream_ms` to answer.

        Kafka's controller reports a mutation throttle less the time from its quota check to
        its answer (AbstractControllerMutationQuota.throttleTime, read in
        RequestHandlerHelper.sendResponseMaybeThrottleWithControllerQuota); the broker that
        forwarded the request passes that figure on unchanged (sendForwardedResponse). What
        happened around the controller is not subtracted: the client's time to the proxy, the
        proxy's own queueing (a fleet's mutation order, a mute), the broker's forwarding legs.
        The closest the proxy sees to the controller's span is the upstream's answer time, from
        the request written upstream to its answer read, so that is what it subtracts. A request
        not forwarded (`upstream_ms` None: answered by the proxy) subtracts the time since the
        charge, as before.
        """
        if self.mutation is None or upstream_ms is None:
            return self.throttle_at(now_ms)
        return self.mutation.throttle_at(self.mutation.computed_at_ms + upstream_ms)


def exchange_throttle(
    request: RequestOutcome | None, response_throttle_ms: int, response_now_ms: float,
    upstream_ms: float | None = None,
) -> int:
    """The throttle an exchange's response carries and the client is muted for.

    Kafka takes the max of every quota a request violated, never the sum: produce or fetch
    bandwidth against the request quota (KafkaApis), the controller-mutation throttle against
    the request quota (RequestHandlerHelper.sendResponseMaybeThrottleWithControllerQuota, and
    sendForwardedResponse on the broker for the controller's answer). `upstream_ms`: how long
    the upstream took to answer (see `RequestOutcome.throttle_after`), None when unknown.
    """
    request_throttle = request.throttle_after(response_now_ms, upstream_ms) if request is not None else 0
    return max(request_throttle, response_throttle_ms, 0)


def upstream_answer_ms(request_sent_us: int, response_received_us: int) -> float:
    """The upstream's answer time in ms, from the microsecond instants the capture stores.

    The proxy computes it from the same two instants, rounded the same way, so the replay's
    mutation throttles are the proxy's (`exchange_throttle`)."""
    return max(response_received_us - request_sent_us, 0) / 1000.0


@dataclass(frozen=True, slots=True)
class ResponseCharges(FrozenValue):
    """What a response charges: bytes to the byte-rate quotas, time to the request quota."""

    api_key: int
    produce_bytes: int | None = None
    fetch_bytes: int | None = None
    request_time_ms: float | None = None


def request_charges(
    api_key: int,
    api_version: int,
    request_size: int,
    expects_response: bool,
    mutations: Sequence[tuple[str, int]] | None = None,
) -> RequestCharges:
    """The charges of a request on arrival.

    Args:
        request_size: the request frame's size without its 4-byte size prefix.
        mutations: the topics a mutation request creates or deletes, None when it is not
            charged (not a mutation API, or validate-only where that is free).
    """
    if api_key == ApiKey.PRODUCE and not expects_response:
        return RequestCharges(api_key, api_version, produce_bytes=request_size)
    if api_key in FETCH_QUOTA_API_KEYS:  # KafkaApis caps Fetch and ShareFetch MaxBytes at the quota window
        return RequestCharges(api_key, api_version, fetch=True)
    if api_key in MUTATION_API_KEYS and mutations is not None:
        return RequestCharges(api_key, api_version, mutations=tuple(mutations))
    return RequestCharges(api_key, api_version)


def charge_request(
    engine: QuotaManagers, client: QuotaClient, charges: RequestCharges, now_ms: float
) -> RequestOutcome:
    """Apply a request's charges; its throttle (acks=0 Produce, mutations) and fetch cap."""
    if charges.produce_bytes is not None:
        throttle = engine.record_produce(
            client.broker, client.principal, client.client_id, charges.produce_bytes, now_ms
        )
        return RequestOutcome(throttle_ms=throttle)
    if charges.mutations is not None:
        outcome = engine.mutations(
            client.broker, client.principal, client.client_id, charges.api_key, charges.api_version,
            list(charges.mutations), now_ms,
        )
        return RequestOutcome(throttle_ms=outcome.throttle_ms, mutation=outcome)
    if charges.fetch and request_charged_at_arrival(engine, charges):
        cap = engine.fetch_max_bytes_cap(client.broker, client.principal, client.client_id, now_ms)
        return RequestOutcome(fetch_max_bytes_cap=cap)
    return RequestOutcome()


def request_charged_at_arrival(engine: QuotaManagers, charges: RequestCharges) -> bool:
    """Whether `charge_request` touches the engine: a Fetch only when a quota needs its limits."""
    if charges.fetch:
        return engine.quota_enabled("consumer_byte_rate") or engine.quota_enabled("request_percentage")
    return charges.produce_bytes is not None or charges.mutations is not None


def response_charges(
    api_key: int,
    request_size: int,
    response_body_size: int | None,
    round_trip_ms: float | None,
    fetch_max_wait_ms: int | None = None,
) -> ResponseCharges:
    """The charges of a response that came back from a broker.

    Args:
        request_size: the request frame's size without its 4-byte size prefix.
        response_body_size: the response frame less its size prefix and response header.
        round_trip_ms: from forwarding the request to receiving the response.
        fetch_max_wait_ms: a Fetch or ShareFetch request's MaxWaitMs, when the proxy read it.
    """
    return ResponseCharges(api_key, *response_amounts(api_key, request_size, response_body_size, round_trip_ms,
                                                       fetch_max_wait_ms))


def response_amounts(
    api_key: int,
    request_size: int,
    response_body_size: int | None,
    round_trip_ms: float | None,
    fetch_max_wait_ms: int | None = None,
) -> tuple[int | None, int | None, float | None]:
    """`response_charges`' fields after the API key (produce bytes, fetch bytes, request time),
    for a caller that charges them with `charge_response_of` and keeps no ResponseCharges: the
    proxy on a connection the capture does not keep (a frozen dataclass's generated `__init__`
    stays interpreted in the compiled build, and costs more than the rule)."""
    produce_bytes = request_size if api_key == ApiKey.PRODUCE else None
    fetch_bytes = None
    if api_key in FETCH_QUOTA_API_KEYS and response_body_size is not None:
        fetch_bytes = SIZE_PREFIX_BYTES + response_body_size
    request_ms = round_trip_ms
    if request_ms is not None and api_key in AUTHENTICATOR_API_KEYS:
        request_ms = None
    elif (request_ms is not None and api_key in FETCH_QUOTA_API_KEYS and fetch_max_wait_ms
          and request_ms >= fetch_max_wait_ms):
        # A long-poll (share) fetch waits in the broker's purgatory, which Kafka does not count.
        request_ms -= fetch_max_wait_ms
    return produce_bytes, fetch_bytes, request_ms


def charge_response(engine: QuotaManagers, client: QuotaClient, charges: ResponseCharges, now_ms: float) -> int:
    """Apply a response's charges; the largest throttle they give (0 when none).

    The rule is `charge_response_of`'s, given the fields of `client` and `charges`."""
    return charge_response_of(engine, client.broker, client.principal, client.client_id, charges.api_key,
                              charges.produce_bytes, charges.fetch_bytes, charges.request_time_ms, now_ms)


def charge_response_of(
    engine: QuotaManagers,
    broker: str,
    principal: str,
    client_id: str,
    api_key: int,
    produce_bytes: int | None,
    fetch_bytes: int | None,
    request_time_ms: float | None,
    now_ms: float,
) -> int:
    """`charge_response` on the fields of a QuotaClient and a ResponseCharges, for a caller that
    has them apart: the whatif replay charges one response per row of a capture, and building
    the two objects for each would cost it more than the engine's work (a dataclass's generated
    `__init__` stays interpreted in the compiled build).

    A Fetch throttled by either quota is answered empty (`answered_empty`), so, as in
    KafkaApis.handleFetchRequest, its request time is recorded first and its bytes are
    unrecorded from the consumer byte rate when either throttle is > 0."""
    # The largest of the throttles, kept as it goes (no list and max() per response).
    throttle = 0
    if produce_bytes is not None:
        throttle = engine.record_produce(broker, principal, client_id, produce_bytes, now_ms)
    if request_time_ms is not None:
        request = engine.record_request_time(broker, principal, client_id, api_key, request_time_ms, now_ms)
        if request > throttle:
            throttle = request
    if fetch_bytes is not None:
        # A ShareFetch's records were acquired for the member by the broker that answered: the
        # proxy delivers them, so they stay recorded (answering empty would leave them locked
        # until their acquisition lock times out).
        empty = api_key in THROTTLED_EMPTY_API_KEYS
        fetch = engine.record_fetch(broker, principal, client_id, fetch_bytes, now_ms,
                                    throttle if empty else 0, delivered=not empty)
        if fetch > throttle:
            throttle = fetch
    return throttle


def answered_empty(api_key: int, throttle_ms: int) -> bool:
    """Whether a response with this throttle goes to the client as Kafka's empty throttled
    Fetch response (kqp.protocol.throttled_fetch) instead of the broker's data."""
    return throttle_ms > 0 and api_key in THROTTLED_EMPTY_API_KEYS


@dataclass(slots=True)
class QuotaTrace:
    """The exact inputs the engine got for one exchange, in the order it got them.

    `*_seq` numbers every engine call of one proxy process, so a replay can put calls whose
    clock readings tie (one event-loop iteration) back in the order they were made. Times are
    the proxy's engine clock (monotonic ms), comparable only within one proxy process.
    """

    broker: str
    request_seq: int | None = None
    request_now_ms: float | None = None
    response_seq: int | None = None
    response_now_ms: float | None = None
    request: RequestCharges | None = None
    response: ResponseCharges | None = None
