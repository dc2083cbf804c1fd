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
(kqp.proxy.hook_chain) turns the declarations into a table from API key to the hooks that want it, per call: a hook
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
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from mypy_extensions import mypyc_attr

from kqp.protocol.close_reason import CloseReason

# What hooks record on an exchange lives in kqp.proxy.exchange (compiled, kqp/compiled_modules.py);
# re-exported here, the seam's one import.
from kqp.proxy.exchange import CaptureFindings as CaptureFindings
from kqp.proxy.exchange import Exchange as Exchange
from kqp.proxy.exchange import FetchFindings as FetchFindings
from kqp.proxy.exchange import FleetCharge as FleetCharge
from kqp.proxy.exchange import MutationFindings as MutationFindings
from kqp.proxy.exchange import MutationNote as MutationNote
from kqp.proxy.exchange import PartitionColumns as PartitionColumns
from kqp.proxy.exchange import RequestColumns as RequestColumns
from kqp.proxy.exchange import read_fetch_request as read_fetch_request


class ConnectionControl(Protocol):
    """What a hook may do to a connection other than the one whose traffic it is looking at
    (a `scope: cluster` throttle holds every connection of the client)."""

    def mute(self, throttle_ms: int, *, one_at_a_time: bool = True) -> None: ...


class ConnectionHookState:
    """What hooks keep about one connection, made once with it and kept across the
    `ClientView`s that replace each other when the principal changes. One field per use,
    named by the hook that owns it. (A plain class: mypyc 2.4 fails to build a dataclass
    with a field typed `object`.)"""

    __slots__ = ("captured", "policies")

    def __init__(self, policies: object = None, captured: bool | None = None) -> None:
        # Enforcement: the connection's own policy objects (a kqp.proxy.policies.tables
        # ConnectionPolicies, which the chain checks it is: this module sits below the policies),
        # made by their factories on first use.
        self.policies = policies
        # Observation, when the connection opens: whether the capture keeps this connection's
        # exchanges (None: not known, as when no observation hook runs). Enforcement keeps the
        # engine's inputs for the capture (`Exchange.quota`) unless it is False.
        self.captured = captured


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


# Compiled (kqp/compiled_modules.py), a native class that interpreted classes may subclass
# (tests and the simulator do): the compiled hooks that subclass it are native classes too,
# whose fields and methods are reached without a lookup by name.
@mypyc_attr(allow_interpreted_subclasses=True)
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
