"""The seam between the byte-moving core and the features that look at the traffic.

A connection calls its hooks for every request and response. The default hooks change
nothing; quota enforcement, metrics and capture each implement some of them. Hooks run on
the event loop, inline with the data path, so they must not block.

The order of a connection's calls, for one request:

  hold -> (wait, if a future was returned) -> request -> forward or answer locally
       -> hold_response -> (wait, if a future was returned) -> response (whole frame)
       |  response_started ... response_streamed (cut-through)
       |  unanswered (acks=0: no response will come)

A hook that must do blocking work before it can answer (a file write-back) starts it off the
loop and gives the connection a future to wait for (`hold`, `hold_response`), instead of
doing it inline.

Every exchange ends in exactly one of `response`, `response_streamed` or `unanswered`
(or the connection closes first, then `connection_closed`). What a hook read from a request
(a Fetch's limits, a mutation's topics, the engine's inputs for the capture) it keeps on the
exchange's typed `Exchange` fields, read once and reused by later hooks and calls.

What one hook (or policy) leaves for another on an exchange is a typed record with one
writer per field, named where the field is declared; nothing else passes between them but
verdicts:

  field                               written by                read by
  proxy_throttle_ms                   the policy chain          observation
  broker_throttle_ms                  the policy chain          observation
  quota (QuotaTrace)                  kafka_charging, kafka_mutations (policies.charges)
                                                                observation (capture)
  fetch.forwarded_*_bytes             kafka_charging            observation (capture)
  mutation.claim                      fleet_mutation_order      kafka_mutations
  mutation.outcome, .rejected         kafka_mutations           kafka_mutations
  mutation.notes                      kafka_mutations           observation
  capture (CaptureFindings)           observation               observation
  quota_admin_request                 quota_admin               quota_admin
  ClientView.state.captured           observation               the policies (whether to trace)

Verdicts are data, not actions: a hook says "answer with these bytes", "mute for this long"
or "throttled this long", and the connection carries it out in its own order (see
kqp.proxy.connection), so a hook can be tested by calling it, without sockets. Decisions
pass between hooks as verdicts only: a chain folds them by one rule (`RequestVerdict.fold`,
`ResponseVerdict.fold`: the largest throttle, mute and one-at-a-time span, never the sum;
the later frame or answer).

Typed per API
-------------
A hook declares the API keys it wants (`api_keys`; None: every API, for what applies to all
requests, such as request-time quotas and metrics; or per call, `takes`), and `HookChain`
turns the declarations into a table from API key to the hooks that want it, per call: a hook
is only in the table of a call it overrides. So a Produce touches only what cares about
Produce, a hook never sees an API it did not declare, and an API no hook wants costs a
header parse and a write.

Per-connection state lives in the connection's `ConnectionHookState` (`ClientView.state`),
created once with the connection, as Kroxylicious gives each connection its own filter
instances, instead of in dicts keyed by connection id inside hooks every connection shares.
Enforcement keeps there its policies' per-connection objects (kqp.proxy.policies).

A request body is parsed at most once: the first hook that needs a Fetch's limits keeps what
it read in `Exchange.fetch` (`read_fetch_request`), and later hooks take it from there.

The order hooks run in, and why (kqp.proxy.app builds the chain):

  1. quota administration: a DescribeClientQuotas/AlterClientQuotas is answered from the
     proxy's quotas, so nothing after it must count it as forwarded as it was sent;
  2. quota enforcement (kqp.proxy.policies): its policies decide throttles, cap Fetch
     limits and refuse mutations by verdicts, which its chain folds; it records the folded
     throttle in `Exchange.proxy_throttle_ms` (the policies themselves write no such field)
     and the engine's inputs in `Exchange.quota`;
  3. observation (metrics and capture): reads what 1 and 2 decided, so it records the
     request as forwarded, the response as the client gets it and the folded throttle.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypedDict

from kqp.protocol.api_keys import ApiKey
from kqp.protocol.close_reason import CloseReason
from kqp.protocol.fast_path import FetchRequestSummary, parse_fetch_request, parse_share_fetch_request
from kqp.protocol.headers import RequestHeader
from kqp.protocol.mutations import MutationRequest, TopicMutation
from kqp.quotas.recording import QuotaTrace, RequestOutcome


class ConnectionControl(Protocol):
    """What a hook may do to a connection other than the one whose traffic it is looking at
    (a `scope: cluster` throttle holds every connection of the client)."""

    def mute(self, throttle_ms: int, *, one_at_a_time: bool = True) -> None: ...


@dataclass(slots=True)
class ConnectionHookState:
    """What hooks keep about one connection, made once with it and kept across the
    `ClientView`s that replace each other when the principal changes. One field per use,
    named by the hook that owns it."""

    # Enforcement: the connection's own policy objects (a kqp.proxy.policies.tables
    # ConnectionPolicies, which the chain checks it is: this module sits below the policies),
    # made by their factories on first use.
    policies: object = None
    # Observation, when the connection opens: whether the capture keeps this connection's
    # exchanges (None: not known, as when no observation hook runs). Enforcement keeps the
    # engine's inputs for the capture (`Exchange.quota`) unless it is False.
    captured: bool | None = None


@dataclass(frozen=True, slots=True)
class ClientView:
    """The client behind a connection, as hooks see it. A new view replaces the old one when
    the principal changes (SASL completes); the client id is per request (`Exchange.header`)."""

    connection_id: int
    peer: str  # host:port of the client
    listener: str  # the proxy listener's name
    broker: int | None  # node id of the upstream broker; None on the bootstrap listener
    principal: str
    control: ConnectionControl = field(compare=False, repr=False)
    state: ConnectionHookState = field(default_factory=ConnectionHookState, compare=False, repr=False)


@dataclass(slots=True)
class MutationNote:
    """A topic of a CreateTopics/CreatePartitions/DeleteTopics request and what it got."""

    topic: str
    partitions: int
    error_code: int


@dataclass(slots=True)
class FetchFindings:
    """A Fetch or ShareFetch request's limits as read (once, by the first hook that needs
    them: `read_fetch_request`), and MinBytes and MaxBytes as forwarded."""

    request: FetchRequestSummary
    # Written by kafka_charging alone (the quota's cap of the request sent upstream), read by
    # observation for the capture; the request's own until capped.
    forwarded_min_bytes: int
    forwarded_max_bytes: int | None


@dataclass(slots=True)
class MutationFindings:
    """A CreateTopics/CreatePartitions/DeleteTopics request as read (once, by whichever policy
    reads it first: kqp.proxy.policies.charges.mutation_charges), and what the policies that
    act on it recorded. Each field after `request` has one writer, named with it."""

    request: MutationRequest
    # Written by fleet_mutation_order (its hold), read by kafka_mutations, which records this
    # charge instead of charging again: the charge the fleet makes in its own order
    # (kqp.proxy.fleet), made before the request hooks run; its result is None when the fleet
    # did not answer in time.
    claim: asyncio.Future[FleetCharge | None] | None = None
    # Written and read by kafka_mutations: its charge's outcome when it throttled, combined
    # with the response's own throttle, as a broker returns the larger of its quotas'.
    outcome: RequestOutcome | None = None
    # Written and read by kafka_mutations: the topics refused here (THROTTLING_QUOTA_EXCEEDED)
    # before the rest was forwarded, merged into the broker's answer.
    rejected: list[TopicMutation] = field(default_factory=list)
    # Written by kafka_mutations, read by observation (metrics and capture): per topic, what
    # the client got; None until decided.
    notes: list[MutationNote] | None = None


class RequestColumns(TypedDict, total=False):
    """The capture record's columns read from a request (kqp.capture's schema names them)."""

    acks: int
    fetch_max_wait_ms: int
    fetch_min_bytes: int
    fetch_max_bytes: int | None
    group_id: str


class PartitionColumns(TypedDict):
    """One topic-partition of a captured Produce or Fetch (an entry of the `partitions` column)."""

    topic: str | None
    partition: int
    bytes: int
    records: int
    batches: int
    compression: int
    error_code: int


@dataclass(slots=True)
class CaptureFindings:
    """What the capture reads from a request while it is at hand (sampled connections only)."""

    # Columns of the record (acks, fetch limits, group id).
    details: RequestColumns
    # Produce partitions as read from the request, completed with the response's error codes.
    produce_partitions: list[PartitionColumns] | None = None


@dataclass(slots=True)
class Exchange:
    """One request and, later, its response, as the proxy saw them. The fields up to
    `response_throttle_offset` hold for every API; the ones after it are what a hook found in
    one API's request (None for every other API), so an exchange costs the same whatever
    features exist for APIs it is not."""

    header: RequestHeader
    request_bytes: int
    received_at: float  # event-loop clock, seconds
    expects_response: bool = True
    sent_at: float = 0.0
    response_received_at: float = 0.0
    # Set when the proxy answers the request itself instead of forwarding it.
    local_response: bytes | None = None
    # What the quota engine was given for this exchange (enforcement writes, capture reads).
    quota: QuotaTrace | None = None
    # The throttle the proxy's own quotas gave the exchange: the largest throttle of its folded
    # verdicts, request and response, written by the policy chain alone (kqp.proxy.policies.chain)
    # for observation to read; and the one the broker put in its response (ms).
    proxy_throttle_ms: int = 0
    broker_throttle_ms: int = 0
    # Where ThrottleTimeMs sits in the response frame the hooks are given, when the session
    # already found it (None: not known; read it from the frame's layout).
    response_throttle_offset: int | None = None
    # Fetch and ShareFetch: the request's limits, read once (`read_fetch_request`).
    fetch: FetchFindings | None = None
    # Partition mutations (enforcement).
    mutation: MutationFindings | None = None
    # A quota-admin request the proxy applies once the brokers have authorized it (the quota
    # admin hook's own record, kqp.proxy.quota_admin, which checks its type: it sits above).
    quota_admin_request: object = None
    # Sampled connections: what the capture read from the request.
    capture: CaptureFindings | None = None

    @property
    def fetch_max_wait_ms(self) -> int | None:
        """A Fetch's MaxWaitMs as asked, when read (a fetch that waits is not charged as
        request time for its wait)."""
        return self.fetch.request.max_wait_ms if self.fetch is not None else None


def read_fetch_request(exchange: Exchange, frame: bytes) -> FetchFindings:
    """The Fetch or ShareFetch request's limits, parsed on the first call and kept on the
    exchange for every later hook. Raises ProtocolError on a body that does not read."""
    findings = exchange.fetch
    if findings is None:
        header = exchange.header
        parse = parse_fetch_request if header.api_key == ApiKey.FETCH else parse_share_fetch_request
        request = parse(memoryview(frame)[header.body_offset:], header.api_version)
        findings = exchange.fetch = FetchFindings(request, request.min_bytes, request.max_bytes)
    return findings


@dataclass(frozen=True, slots=True)
class FleetCharge:
    """What a request's charges gave when the fleet applied them, and the engine time it did."""

    outcome: RequestOutcome
    charged_at_ms: float


@dataclass(slots=True)
class RequestVerdict:
    """What a hook decided for a request: forward it (possibly changed) or answer it here."""

    # Replacement request frame (header + body, no size prefix); None keeps the original.
    frame: bytes | None = None
    # Complete response frame (no size prefix) to send instead of forwarding.
    answer: bytes | None = None
    # Stop reading from the client for this long after the request (acks=0 throttling).
    mute_ms: int = 0
    # Forward this connection's requests one at a time for this long: its client is being
    # throttled, maybe on another connection, and a broker would not let it pipeline past that.
    one_at_a_time_s: float = 0.0
    # The throttle the proxy's quotas gave the request itself (acks=0 Produce: no response will
    # carry one), which policies that follow throttles are told of.
    throttle_ms: int = 0

    def fold(self, later: RequestVerdict) -> None:
        """Fold a later hook's verdict into this one, the one rule every chain uses:

        * throttle, mute and one-at-a-time span: the largest, never the sum (a broker
          returns the largest of its quotas' throttles, and two mutes are one wait);
        * frame and answer: the later one's when it gives one (it saw the request as the
          earlier ones left it)."""
        if later.frame is not None:
            self.frame = later.frame
        if later.answer is not None:
            self.answer = later.answer
        self.mute_ms = max(self.mute_ms, later.mute_ms)
        self.one_at_a_time_s = max(self.one_at_a_time_s, later.one_at_a_time_s)
        self.throttle_ms = max(self.throttle_ms, later.throttle_ms)


@dataclass(slots=True)
class ResponseVerdict:
    """What a hook decided for a response: a replacement frame (no size prefix; None keeps
    the broker's), the throttle it gave, and how long to mute the client once the response
    has been sent."""

    frame: bytes | bytearray | None = None
    mute_ms: int = 0
    throttle_ms: int = 0
    # Answer the client with Kafka's empty throttled response instead of the broker's data (a
    # throttled Fetch, kqp.protocol.throttled_fetch). The enforcement chain turns it into
    # `frame`; for a streamed response, that frame replaces the whole stream.
    empty: bool = False

    def fold(self, later: ResponseVerdict) -> None:
        """As `RequestVerdict.fold`: throttle and mute the largest, the later frame wins, and
        the response is answered empty if any hook says so."""
        if later.frame is not None:
            self.frame = later.frame
        self.mute_ms = max(self.mute_ms, later.mute_ms)
        self.throttle_ms = max(self.throttle_ms, later.throttle_ms)
        self.empty = self.empty or later.empty


class TrafficHooks:
    """No-op hooks; subclasses override what they need and declare the APIs they want."""

    # The API keys whose exchanges this hook is given (hold, request, response, unanswered
    # and the streaming calls); None: every API.
    api_keys: ClassVar[frozenset[int] | None] = None

    def takes(self, call: str, api_key: int) -> bool:
        """Whether the per-API call `call` (a method name) wants `api_key`'s exchanges; asked
        once per API by `HookChain`. By default, what `api_keys` declares for every call."""
        return self.api_keys is None or api_key in self.api_keys

    def connection_opened(self, client: ClientView) -> None:
        return None

    def hold(self, client: ClientView, exchange: Exchange, frame: bytes) -> asyncio.Future[Any] | None:
        """Something the request must wait for before the hooks decide it (None: nothing).

        The connection reads no further request meanwhile, as a broker reads none from a
        connection whose request is being handled."""
        return None

    def request(self, client: ClientView, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        return None

    def hold_response(
        self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int
    ) -> asyncio.Future[Any] | None:
        """Something a whole response must wait for before the hooks decide it (None: nothing):
        work its answer depends on that must not run on the event loop (a file write-back).

        The connection sends nothing behind it meanwhile (responses keep their requests' order)
        and reads no more from the broker; every other connection is served as usual."""
        return None

    def response(
        self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int
    ) -> ResponseVerdict | None:
        return None

    def unanswered(self, client: ClientView, exchange: Exchange) -> None:
        """A request was forwarded that gets no response (Produce with acks=0)."""
        return None

    # Cut-through: a large response goes to the client while it streams in, so a hook sees
    # its head (the response header and at least the body's first field) when it starts,
    # may patch the head in place (same length), and hears when the last byte has passed.

    def needs_whole_response(self, client: ClientView, exchange: Exchange) -> bool:
        """True when this hook must see the response frame whole (no cut-through)."""
        return False

    def response_started(
        self, client: ClientView, exchange: Exchange, head: bytearray, body_offset: int, frame_size: int
    ) -> ResponseVerdict | None:
        """A streamed response began; `frame_size` is its whole size (without the size prefix).
        A verdict that is `empty` (with its `frame`) replaces the whole stream: the client gets
        that frame now, and the rest of the broker's is dropped as it arrives; the hooks then
        hear `response_streamed` with the replacement's size."""
        return None

    def response_streamed(
        self, client: ClientView, exchange: Exchange, frame_size: int, body_offset: int
    ) -> None:
        """The last byte of a streamed response went to the client."""
        return None

    def connection_closed(self, client: ClientView, reason: CloseReason) -> None:
        return None


_PER_API_CALLS = (
    "hold", "request", "hold_response", "response", "unanswered", "needs_whole_response", "response_started",
    "response_streamed",
)


class _CallsByApi(dict[int, tuple[Callable[..., Any], ...]]):
    """One hook call's bound methods by API key, for `HookChain`: an API's entry is made the
    first time it is looked up (`__missing__`), from the hooks that override the call and take
    part in it for that API."""

    def __init__(self, hooks: list[TrafficHooks], name: str) -> None:
        super().__init__()
        self._hooks = hooks
        self._name = name

    def __missing__(self, api_key: int) -> tuple[Callable[..., Any], ...]:
        name = self._name
        base = getattr(TrafficHooks, name)
        calls = self[api_key] = tuple(
            getattr(hook, name) for hook in self._hooks
            if getattr(type(hook), name) is not base and hook.takes(name, api_key)
        )
        return calls


class HookChain(TrafficHooks):
    """Several hooks in order; the first to answer a request wins, later ones see its changes.

    The app chains quota administration, then enforcement, then observation (see "The order
    hooks run in" above). Verdicts fold by `RequestVerdict.fold`/`ResponseVerdict.fold`:
    mutes and throttles by max, not sum: two hooks throttling the same response mean one
    wait, as a broker returns the largest of its quotas' throttles rather than their total.

    Each per-API call goes only to the hooks that declared the exchange's API and override
    that call: `_calls[name][api_key]` holds their bound methods, in chain order, filled the
    first time an API is seen (API keys are few, and an unknown one costs one entry). The
    lookup is two dict subscripts, no Python call: it runs for every request and response.
    """

    def __init__(self, hooks: list[TrafficHooks]) -> None:
        self.hooks = hooks
        self._calls: dict[str, _CallsByApi] = {name: _CallsByApi(hooks, name) for name in _PER_API_CALLS}

    def calls_for(self, name: str, api_key: int) -> tuple[Callable[..., Any], ...]:
        """The bound `name` methods of the hooks that want `api_key`, in chain order."""
        return self._calls[name][api_key]

    def connection_opened(self, client: ClientView) -> None:
        for hook in self.hooks:
            hook.connection_opened(client)

    def hold(self, client: ClientView, exchange: Exchange, frame: bytes) -> asyncio.Future[Any] | None:
        for hold in self._calls["hold"][exchange.header.api_key]:
            wait: asyncio.Future[Any] | None = hold(client, exchange, frame)
            if wait is not None:
                return wait
        return None

    def request(self, client: ClientView, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        combined: RequestVerdict | None = None
        for request in self._calls["request"][exchange.header.api_key]:
            verdict: RequestVerdict | None = request(client, exchange, frame)
            if verdict is None:
                continue
            if combined is None:
                combined = verdict
            else:
                combined.fold(verdict)
            if combined.frame is not None:
                frame = combined.frame  # later hooks see the request as it will be sent
            if combined.answer is not None:
                break  # answered here: nothing is forwarded, so later hooks have no say
        return combined

    def hold_response(
        self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int
    ) -> asyncio.Future[Any] | None:
        for hold in self._calls["hold_response"][exchange.header.api_key]:
            wait: asyncio.Future[Any] | None = hold(client, exchange, frame, body_offset)
            if wait is not None:
                return wait
        return None

    def response(
        self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int
    ) -> ResponseVerdict | None:
        combined: ResponseVerdict | None = None
        for response in self._calls["response"][exchange.header.api_key]:
            verdict: ResponseVerdict | None = response(client, exchange, frame, body_offset)
            if verdict is None:
                continue
            if combined is None:
                combined = ResponseVerdict()
            combined.fold(verdict)
            if verdict.frame is not None:
                frame = combined.frame = bytes(verdict.frame)  # later hooks see it as the client will
                exchange.response_throttle_offset = None  # it described the frame replaced
        return combined

    def unanswered(self, client: ClientView, exchange: Exchange) -> None:
        for unanswered in self._calls["unanswered"][exchange.header.api_key]:
            unanswered(client, exchange)

    def needs_whole_response(self, client: ClientView, exchange: Exchange) -> bool:
        return any(needs(client, exchange) for needs in self._calls["needs_whole_response"][exchange.header.api_key])

    def response_started(
        self, client: ClientView, exchange: Exchange, head: bytearray, body_offset: int, frame_size: int
    ) -> ResponseVerdict | None:
        combined: ResponseVerdict | None = None
        for started in self._calls["response_started"][exchange.header.api_key]:
            verdict: ResponseVerdict | None = started(client, exchange, head, body_offset, frame_size)
            if verdict is not None:
                combined = combined or ResponseVerdict()
                combined.fold(verdict)
                if not combined.empty:
                    combined.frame = None  # a streamed head is patched in place, never replaced
        return combined

    def response_streamed(
        self, client: ClientView, exchange: Exchange, frame_size: int, body_offset: int
    ) -> None:
        for streamed in self._calls["response_streamed"][exchange.header.api_key]:
            streamed(client, exchange, frame_size, body_offset)

    def connection_closed(self, client: ClientView, reason: CloseReason) -> None:
        for hook in self.hooks:
            hook.connection_closed(client, reason)
