"""When the proxy reads a client and hands its next request on: the client side's flow
control as a state machine without IO (in the manner of h11's `_state.py`).

The gate never touches a socket or a clock: the caller (kqp.proxy.connection) tells it what
happened, with the event loop's time where time matters, and gets back `Actions`, a small
frozen value saying what to do: pause or resume reading the client, arm or cancel the
unmute timer, hand the next queued request on, wake a graceful shutdown. So every rule below
is unit-tested by calling methods (tests/unit/protocol/test_gate.py).

Theory of operation
-------------------
A broker stops reading a connection by muting its channel (Kafka's KafkaChannel and its
ChannelMuteState): while a request of it is being handled and, since KIP-219, for the
throttle time after a throttled response has been sent. The proxy cannot mute the broker's
channel for it, so it stops reading its own client socket instead: the client's socket
buffer fills and TCP pushes back on the client, as behind a muted broker channel.

Reading is paused while any `Blocker` holds. Each blocker is set and cleared on its own, so
one ending never resumes reading while another holds, and the caller is told only about the
edges (the first blocker in: pause; the last one out: resume). Which event sets or clears
which blocker is data, `TRANSITIONS`; the guards that decide whether an event happens at all
(a mute only extends, one-at-a-time only while its span lasts) are code, in the method that
fires the event. A new blocker is a new Flag member and two table rows:

  CONNECTING        from accept until an upstream broker connection is open.
  UPSTREAM_BACKLOG  the upstream transport's write buffer passed its high-water mark: the
                    broker reads slower than the client sends, so stop reading the client
                    instead of buffering without bound.
  THROTTLED         the KIP-219 mute: from a throttled response (or an acks=0 request, which
                    gets no response to carry its throttle) until `muted_until`. A mute only
                    extends the deadline, never shortens it: a later, shorter throttle does
                    not cut an earlier, longer one.
  HELD              a hook holds a request (a partition mutation the fleet orders): as on a
                    broker, nothing behind a request in handling is read.
  SHUTDOWN          graceful shutdown: no new request is taken; in-flight ones are answered.
  IN_HANDLING       while the connection is read one request at a time, a request is with
                    the broker: a broker's channel stays muted while it handles a request,
                    so the client's next requests wait in its own socket, not in the proxy's
                    memory. Cleared when the last response in flight has been sent or the
                    one-at-a-time span is over.

One at a time. Until `one_at_a_time_until` at most one request is in flight to the broker.
A broker never processes two requests of one connection at once, so a throttled client
cannot pipeline past its throttle there; the proxy forwards pipelined requests (the broker
serialises them), which would let a burst read before the throttle through. A mute starts
this span at its end for ONE_AT_A_TIME_AFTER_THROTTLE_S (one default quota span); a hook
starts it when the client is throttled on another of its connections.

Before a client's first throttle its connections still pipeline, so an idle librdkafka can
have more requests handled before the first throttle than a broker would (finding (c) in
docs/quotas.md). Reading one at a time from the start instead, for every Produce under a
quota or only once the bytes a connection has with the broker could throttle the client,
gives Kafka's first seconds but not its figures: in the simulator both time out several
times as often as Kafka's model and fail rows that pass as it is (the figures are there).

The stream mute. A Fetch response cut through to the client (kqp.protocol.session) has its
ThrottleTimeMs in its head, so its mute is decided when it starts but applies only once its
last byte has gone: KIP-219 mutes after the throttled response is sent.

Handing requests on. Requests the session framed stay queued in it while reading is paused,
so a client that pipelined requests before its throttle does not get them through during
the mute. `next_request` says whether the oldest may go now: not while any blocker holds;
not while a local answer waits for the responses ahead of it (its throttle must hold the
requests behind it); and, one at a time, not while another is in flight (which sets
IN_HANDLING).

Drained. A graceful shutdown waits until the client is owed nothing: no request in flight to
the broker, no local answer waiting, none held. The gate says so (`Actions.drained`) from
the calls that can end the wait, once SHUTDOWN is set, and on close.

The states, as the client sees them (`state(now)`; when several blockers hold at once, the
first in `ClientState`'s priority order names the state):

           accepted
              |
              v
         CONNECTING
              | upstream open
              v
  +-------> OPEN ------------ a throttled response sent ------------> THROTTLED
  |         |  ^                                                          |
  |  a hook |  | released                                                 | unmute timer
  |   holds |  |                                                          v
  |     one v  |                  +---------- request forwarded ---- ONE_AT_A_TIME
  |        HELD                   v                                   ^    |
  |                          IN_HANDLING ---- its response sent ------+    |
  |                                                                        |
  +------------------------------ span over -------------------------------+

  any state --upstream write buffer full--> BACKLOGGED --drained--> the state it left
  any state --drain--> DRAINING (nothing new is handed on; `drained` once nothing is owed)
  any state --close--> CLOSED (every later event is ignored)
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from kqp.frozen_value import FrozenValue

__all__ = [
    "FORWARD",
    "NOTHING",
    "ONE_AT_A_TIME_AFTER_THROTTLE_S",
    "PAUSE",
    "RESUME",
    "TRANSITIONS",
    "Actions",
    "Blocker",
    "ClientGate",
    "ClientState",
    "Event",
]

# How long a throttled connection keeps reading one request at a time: a default quota span
# (11 windows of 1 s). The enforcement hook holds a client's new connections for as long.
ONE_AT_A_TIME_AFTER_THROTTLE_S = 11.0


class Blocker(enum.Flag):
    """A reason not to read the client (see the module docstring for each)."""

    CONNECTING = enum.auto()
    UPSTREAM_BACKLOG = enum.auto()
    THROTTLED = enum.auto()
    HELD = enum.auto()
    SHUTDOWN = enum.auto()
    IN_HANDLING = enum.auto()


NO_BLOCKER: Final = Blocker(0)


class Event(enum.Enum):
    """What happened to the connection, as far as reading the client goes."""

    ACCEPTED = "accepted"
    UPSTREAM_OPEN = "upstream open"
    UPSTREAM_BACKLOG = "upstream write buffer full"
    UPSTREAM_CAUGHT_UP = "upstream write buffer drained"
    MUTED = "muted"  # a throttle extended the mute
    UNMUTED = "unmuted"  # the unmute timer fired
    HELD = "held"
    RELEASED = "released"
    ONE_IN_HANDLING = "one in handling"  # one at a time, and a request is with the broker
    HANDLED = "handled"  # no request in flight any more, or the one-at-a-time span is over
    DRAIN = "drain"


# The transitions, as data: event -> (blockers it sets, blockers it clears). Every event
# touches only its own blocker, which is what lets overlapping reasons coexist; pausing and
# resuming follow from the edges of the whole set (`_EDGES`), never from one event.
TRANSITIONS: Final[Mapping[Event, tuple[Blocker, Blocker]]] = MappingProxyType({
    Event.ACCEPTED: (Blocker.CONNECTING, NO_BLOCKER),
    Event.UPSTREAM_OPEN: (NO_BLOCKER, Blocker.CONNECTING),
    Event.UPSTREAM_BACKLOG: (Blocker.UPSTREAM_BACKLOG, NO_BLOCKER),
    Event.UPSTREAM_CAUGHT_UP: (NO_BLOCKER, Blocker.UPSTREAM_BACKLOG),
    Event.MUTED: (Blocker.THROTTLED, NO_BLOCKER),
    Event.UNMUTED: (NO_BLOCKER, Blocker.THROTTLED),
    Event.HELD: (Blocker.HELD, NO_BLOCKER),
    Event.RELEASED: (NO_BLOCKER, Blocker.HELD),
    Event.ONE_IN_HANDLING: (Blocker.IN_HANDLING, NO_BLOCKER),
    Event.HANDLED: (NO_BLOCKER, Blocker.IN_HANDLING),
    Event.DRAIN: (Blocker.SHUTDOWN, NO_BLOCKER),
})

# The same table as plain ints, which is what the gate computes with: an enum.Flag operation
# is a Python-level call that builds a member, and these run on the data path.
_BITS: Final[dict[Event, tuple[int, int]]] = {
    event: (sets.value, clears.value) for event, (sets, clears) in TRANSITIONS.items()
}
_THROTTLED: Final = Blocker.THROTTLED.value
_HELD: Final = Blocker.HELD.value
_SHUTDOWN: Final = Blocker.SHUTDOWN.value
_IN_HANDLING: Final = Blocker.IN_HANDLING.value


@dataclass(frozen=True, slots=True)
class Actions(FrozenValue):
    """What the IO layer must do after telling the gate something. Most calls return one of
    the shared constants below, so the common path allocates nothing."""

    forward: bool = False  # hand the oldest queued request on now
    pause_reading: bool = False  # the first blocker came in
    resume_reading: bool = False  # the last blocker went
    unmute_at: float | None = None  # (re)arm the unmute timer at this event-loop time, cancelling any other
    cancel_unmute: bool = False  # the connection closed: no timer may fire any more
    drained: bool = False  # shutting down and nothing is owed: a graceful shutdown may end


NOTHING: Final = Actions()
FORWARD: Final = Actions(forward=True)
PAUSE: Final = Actions(pause_reading=True)
RESUME: Final = Actions(resume_reading=True)
_DRAINED: Final = Actions(drained=True)
_CLOSED: Final = Actions(cancel_unmute=True, drained=True)

def _actions(*, pause: bool = False, resume: bool = False, unmute_at: float | None = None,
             drained: bool = False) -> Actions:
    """One of the shared constants when it says it all; a new value only for a timer or a drain."""
    if unmute_at is None and not drained:
        return PAUSE if pause else RESUME if resume else NOTHING
    return Actions(pause_reading=pause, resume_reading=resume, unmute_at=unmute_at, drained=drained)


# (was any blocker holding, is any holding now) -> what reading must do; no edge, nothing.
_EDGES: Final[Mapping[tuple[bool, bool], Actions]] = MappingProxyType({
    (False, False): NOTHING, (False, True): PAUSE, (True, False): RESUME, (True, True): NOTHING,
})


class ClientState(enum.Enum):
    """A name for where the client side stands, for logs, tests and the diagram above. In
    priority order: when several blockers hold, the first one listed names the state."""

    CLOSED = "closed"
    DRAINING = "draining"
    CONNECTING = "connecting"
    HELD = "held"
    THROTTLED = "throttled"
    BACKLOGGED = "backlogged"
    IN_HANDLING = "in handling"
    ONE_AT_A_TIME = "one at a time"
    OPEN = "open"


_STATE_OF_BLOCKER: Final = (
    (Blocker.SHUTDOWN, ClientState.DRAINING),
    (Blocker.CONNECTING, ClientState.CONNECTING),
    (Blocker.HELD, ClientState.HELD),
    (Blocker.THROTTLED, ClientState.THROTTLED),
    (Blocker.UPSTREAM_BACKLOG, ClientState.BACKLOGGED),
    (Blocker.IN_HANDLING, ClientState.IN_HANDLING),
)


class ClientGate:
    """The flow control of one client connection (see the module docstring).

    Times are the caller's event-loop clock, in seconds; in-flight counts are the session's
    (`KafkaSession.in_flight`: requests forwarded or answered locally whose response the
    client has not had yet)."""

    __slots__ = ("_blocked", "_closed", "_muted_until", "_one_at_a_time_until", "_stream_mute_ms")

    def __init__(self) -> None:
        self._blocked = 0  # Blocker bits
        self._closed = False
        self._muted_until = 0.0
        self._one_at_a_time_until = 0.0
        self._stream_mute_ms = 0  # the mute due once the streaming response has passed

    # ---- what the caller reads -------------------------------------------------------

    @property
    def blockers(self) -> Blocker:
        return Blocker(self._blocked)

    @property
    def reads_paused(self) -> bool:
        return bool(self._blocked)

    @property
    def muted(self) -> bool:
        return bool(self._blocked & _THROTTLED)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def muted_until(self) -> float:
        return self._muted_until

    @property
    def one_at_a_time_until(self) -> float:
        return self._one_at_a_time_until

    def state(self, now: float) -> ClientState:
        if self._closed:
            return ClientState.CLOSED
        blockers = self.blockers
        for blocker, state in _STATE_OF_BLOCKER:
            if blocker in blockers:
                return state
        return ClientState.ONE_AT_A_TIME if self._one_at_a_time_until > now else ClientState.OPEN

    # ---- the table -------------------------------------------------------------------

    def _fire(self, event: Event) -> Actions:
        sets, clears = _BITS[event]
        before = self._blocked
        after = self._blocked = (before | sets) & ~clears
        return _EDGES[bool(before), bool(after)]

    def _owes_nothing(self, in_flight: int) -> bool:
        # Local answers waiting are in flight too (they hold their request's turn).
        return not in_flight and not self._blocked & _HELD

    # ---- connecting and back-pressure ------------------------------------------------

    def accepted(self) -> Actions:
        """The client's connection is accepted: read nothing until an upstream is open."""
        return NOTHING if self._closed else self._fire(Event.ACCEPTED)

    def upstream_open(self) -> Actions:
        """An upstream broker connection is open (the caller then asks `next_request`: the
        client may have sent requests before it was)."""
        return NOTHING if self._closed else self._fire(Event.UPSTREAM_OPEN)

    def upstream_backlog(self, full: bool) -> Actions:
        """The upstream transport's write buffer passed its high-water mark, or drained below it."""
        if self._closed:
            return NOTHING
        return self._fire(Event.UPSTREAM_BACKLOG if full else Event.UPSTREAM_CAUGHT_UP)

    # ---- throttles -------------------------------------------------------------------

    def mute(self, now: float, throttle_ms: int, *, one_at_a_time: bool = True) -> Actions:
        """KIP-219: read nothing from this client for `throttle_ms` from `now`.

        `one_at_a_time=False` mutes without the one-request-at-a-time span that follows a
        throttle on this connection itself (a cluster-wide budget throttled elsewhere)."""
        if throttle_ms <= 0 or self._closed:
            return NOTHING
        until = now + throttle_ms / 1000.0
        if until <= self._muted_until:
            return NOTHING  # an earlier, longer mute already covers this one
        self._muted_until = until
        if one_at_a_time:
            # A broker reads one request per connection at a time, so a throttled client's
            # pipelined requests wait in the socket; the same here, or requests read before
            # the throttle would all go through at once. Set, not extended: as before the
            # gate, a mute on this connection starts its own span from its end.
            self._one_at_a_time_until = until + ONE_AT_A_TIME_AFTER_THROTTLE_S
        edge = self._fire(Event.MUTED)
        return Actions(pause_reading=edge.pause_reading, unmute_at=until)

    def unmute(self) -> Actions:
        """The unmute timer fired (armed at `muted_until`, re-armed whenever that moved)."""
        return NOTHING if self._closed else self._fire(Event.UNMUTED)

    def read_one_at_a_time(self, now: float, seconds: float) -> None:
        """Forward one request at a time for `seconds`: this client is being throttled, maybe
        on another connection, and a broker would not let it pipeline past its throttles."""
        until = now + seconds
        if until > self._one_at_a_time_until:
            self._one_at_a_time_until = until

    # ---- requests --------------------------------------------------------------------

    def next_request(self, now: float, in_flight: int, local_answer_waiting: bool) -> Actions:
        """May the oldest queued request be handed on now? `FORWARD` if so; otherwise it
        stays queued, and the caller does what the answer says (maybe pause reading)."""
        if self._blocked or self._closed:
            return NOTHING
        if in_flight and self._one_at_a_time_until > now:
            # Requests pipelined before the client was throttled are still in flight.
            return self._fire(Event.ONE_IN_HANDLING)
        if local_answer_waiting:
            # Its throttle must hold the requests behind it: read no more until it is sent.
            return NOTHING
        return FORWARD

    def hold(self) -> Actions:
        """A hook holds the request just taken: nothing behind it is read until it is decided."""
        return NOTHING if self._closed else self._fire(Event.HELD)

    def release(self) -> Actions:
        """The hold ended (the caller then decides the request and calls `decided`)."""
        return NOTHING if self._closed else self._fire(Event.RELEASED)

    def decided(self, now: float, in_flight: int, mute_ms: int = 0, one_at_a_time_s: float = 0.0) -> Actions:
        """A request was forwarded or answered locally, and its verdict asks for this mute
        and one-at-a-time span (a throttle decided on a request, such as an acks=0 Produce
        that gets no response to carry it, applies once the request is on its way)."""
        if not mute_ms and not one_at_a_time_s and (not in_flight or self._one_at_a_time_until <= now):
            # The common path: no throttle, nothing to wait for (unless a drain is).
            return self._drained_if_owed_nothing(in_flight) if self._blocked & _SHUTDOWN else NOTHING
        if self._closed:
            return NOTHING
        if one_at_a_time_s:
            self.read_one_at_a_time(now, one_at_a_time_s)
        muting = self.mute(now, mute_ms) if mute_ms else NOTHING
        pause = muting.pause_reading
        if in_flight and self._one_at_a_time_until > now:
            # As a broker mutes a channel while it handles one of its requests: without this
            # a client that pipelines (librdkafka writes requests as long as its socket takes
            # them) would move its whole backlog into the proxy's memory as small requests,
            # which then each wait out a throttle of their own.
            pause = self._fire(Event.ONE_IN_HANDLING).pause_reading or pause
        drained = bool(self._blocked & _SHUTDOWN) and self._owes_nothing(in_flight)
        return _actions(pause=pause, unmute_at=muting.unmute_at, drained=drained)

    # ---- responses -------------------------------------------------------------------

    def stream_started(self, mute_ms: int) -> None:
        """A cut-through response began; its mute waits until its last byte has gone."""
        self._stream_mute_ms = mute_ms

    def stream_ended(self, now: float, in_flight: int) -> Actions:
        """The cut-through response's last byte went to the client: its mute starts now."""
        mute_ms, self._stream_mute_ms = self._stream_mute_ms, 0
        return self.response_sent(now, in_flight, mute_ms)

    def response_sent(self, now: float, in_flight: int, mute_ms: int = 0) -> Actions:
        """A response (and the local answers that were waiting behind it) went to the client,
        and it asks for this mute. The caller then asks `next_request` if requests are queued."""
        blocked = self._blocked
        if not blocked and not mute_ms:
            return NOTHING  # the common path: nothing blocks, nothing to start
        if self._closed:
            return NOTHING
        muting = self.mute(now, mute_ms) if mute_ms else NOTHING
        edge = NOTHING
        if self._blocked & _IN_HANDLING and (not in_flight or self._one_at_a_time_until <= now):
            edge = self._fire(Event.HANDLED)
        drained = bool(self._blocked & _SHUTDOWN) and self._owes_nothing(in_flight)
        # A mute can only pause and HANDLED only resume, and never both: HANDLED resumes only
        # when no other blocker holds, and a mute just set THROTTLED.
        return _actions(pause=muting.pause_reading, resume=edge.resume_reading, unmute_at=muting.unmute_at,
                        drained=drained)

    def settled(self, in_flight: int) -> Actions:
        """Nothing to decide, only whether a graceful shutdown may end (after local answers
        went out, or a held request was decided)."""
        return self._drained_if_owed_nothing(in_flight)

    def _drained_if_owed_nothing(self, in_flight: int) -> Actions:
        if self._blocked & _SHUTDOWN and self._owes_nothing(in_flight):
            return _DRAINED
        return NOTHING

    # ---- the end ---------------------------------------------------------------------

    def drain(self, in_flight: int) -> Actions:
        """Graceful shutdown: take no new request; `drained` once nothing is owed (now, or
        from a later call)."""
        if self._closed:
            return _DRAINED
        edge = self._fire(Event.DRAIN)
        return _actions(pause=edge.pause_reading, drained=self._owes_nothing(in_flight))

    def close(self) -> Actions:
        """The connection closed: no timer may fire, a shutdown waiting on it may end, and
        every later event is ignored."""
        if self._closed:
            return NOTHING
        self._closed = True
        return _CLOSED
