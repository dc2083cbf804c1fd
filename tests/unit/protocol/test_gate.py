"""The client side's flow control without IO (kqp.protocol.gate): each row of the tables
below is a history of events, one more event, and what the IO layer must then do."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from kqp.protocol.gate import (
    FORWARD,
    NOTHING,
    ONE_AT_A_TIME_AFTER_THROTTLE_S,
    PAUSE,
    RESUME,
    TRANSITIONS,
    Actions,
    Blocker,
    ClientGate,
    ClientState,
    Event,
)

Step = Callable[[ClientGate], Actions]
T0 = 100.0  # event-loop time the history happens at


@dataclass(frozen=True)
class Row:
    history: tuple[Step, ...]
    event: Step
    actions: Actions
    blockers: Blocker
    state: ClientState


def accepted(gate: ClientGate) -> Actions:
    return gate.accepted()


def upstream_open(gate: ClientGate) -> Actions:
    return gate.upstream_open()


def backlog(gate: ClientGate) -> Actions:
    return gate.upstream_backlog(True)


def caught_up(gate: ClientGate) -> Actions:
    return gate.upstream_backlog(False)


def mute(ms: int, at: float = T0, *, one_at_a_time: bool = True) -> Step:
    return lambda gate: gate.mute(at, ms, one_at_a_time=one_at_a_time)


def unmute(gate: ClientGate) -> Actions:
    return gate.unmute()


def hold(gate: ClientGate) -> Actions:
    return gate.hold()


def release(gate: ClientGate) -> Actions:
    return gate.release()


def next_request(in_flight: int = 0, local_answer_waiting: bool = False, at: float = T0) -> Step:
    return lambda gate: gate.next_request(at, in_flight, local_answer_waiting)


def decided(in_flight: int, mute_ms: int = 0, one_at_a_time_s: float = 0.0, at: float = T0) -> Step:
    return lambda gate: gate.decided(at, in_flight, mute_ms, one_at_a_time_s)


def response_sent(in_flight: int, mute_ms: int = 0, at: float = T0) -> Step:
    return lambda gate: gate.response_sent(at, in_flight, mute_ms)


def drain(in_flight: int) -> Step:
    return lambda gate: gate.drain(in_flight)


def close(gate: ClientGate) -> Actions:
    return gate.close()


OPEN = (accepted, upstream_open)
THROTTLED = (*OPEN, mute(500))
UNMUTED = (*THROTTLED, unmute)  # one at a time from here, until T0 + 0.5 + 11 s
IN_HANDLING = (*UNMUTED, next_request(), decided(in_flight=1))
AFTER_SPAN = T0 + 0.5 + ONE_AT_A_TIME_AFTER_THROTTLE_S
NO = Blocker(0)

ROWS = {
    # Connecting: nothing is read until a broker connection is open.
    "accept pauses reading": Row((), accepted, PAUSE, Blocker.CONNECTING, ClientState.CONNECTING),
    "upstream open resumes it": Row((accepted,), upstream_open, RESUME, NO, ClientState.OPEN),
    "nothing is handed on while connecting": Row(
        (accepted,), next_request(), NOTHING, Blocker.CONNECTING, ClientState.CONNECTING),
    # The common path.
    "an open connection forwards": Row(OPEN, next_request(), FORWARD, NO, ClientState.OPEN),
    "pipelining is fine unthrottled": Row(OPEN, next_request(in_flight=4), FORWARD, NO, ClientState.OPEN),
    "an unthrottled request needs nothing": Row(OPEN, decided(in_flight=1), NOTHING, NO, ClientState.OPEN),
    "an unthrottled response needs nothing": Row(OPEN, response_sent(in_flight=0), NOTHING, NO, ClientState.OPEN),
    "a local answer waiting holds what follows": Row(
        OPEN, next_request(in_flight=1, local_answer_waiting=True), NOTHING, NO, ClientState.OPEN),
    # Back-pressure from the broker's side.
    "a full upstream buffer pauses": Row(OPEN, backlog, PAUSE, Blocker.UPSTREAM_BACKLOG, ClientState.BACKLOGGED),
    "its draining resumes": Row((*OPEN, backlog), caught_up, RESUME, NO, ClientState.OPEN),
    "backlog while connecting is no edge": Row(
        (accepted,), backlog, NOTHING, Blocker.CONNECTING | Blocker.UPSTREAM_BACKLOG, ClientState.CONNECTING),
    "one blocker ending does not resume under another": Row(
        (accepted, backlog), upstream_open, NOTHING, Blocker.UPSTREAM_BACKLOG, ClientState.BACKLOGGED),
    # KIP-219 mutes.
    "a throttled response mutes": Row(
        OPEN, response_sent(in_flight=0, mute_ms=500), Actions(pause_reading=True, unmute_at=T0 + 0.5),
        Blocker.THROTTLED, ClientState.THROTTLED),
    "a throttle on the request mutes once it is on its way": Row(
        OPEN, decided(in_flight=0, mute_ms=200), Actions(pause_reading=True, unmute_at=T0 + 0.2),
        Blocker.THROTTLED, ClientState.THROTTLED),
    "a longer mute extends the deadline": Row(
        THROTTLED, mute(900), Actions(unmute_at=T0 + 0.9), Blocker.THROTTLED, ClientState.THROTTLED),
    "a shorter mute never shortens it": Row(
        THROTTLED, mute(100), NOTHING, Blocker.THROTTLED, ClientState.THROTTLED),
    "a later mute ending earlier changes nothing": Row(
        THROTTLED, mute(300, at=T0 + 0.1), NOTHING, Blocker.THROTTLED, ClientState.THROTTLED),
    "a zero throttle is no mute": Row(OPEN, mute(0), NOTHING, NO, ClientState.OPEN),
    "nothing is handed on while muted": Row(
        THROTTLED, next_request(), NOTHING, Blocker.THROTTLED, ClientState.THROTTLED),
    "the unmute timer resumes reading": Row(THROTTLED, unmute, RESUME, NO, ClientState.ONE_AT_A_TIME),
    # One at a time after a throttle.
    "one at a time forwards when none is in flight": Row(
        UNMUTED, next_request(), FORWARD, NO, ClientState.ONE_AT_A_TIME),
    "a forwarded request blocks the next while one at a time": Row(
        (*UNMUTED, next_request()), decided(in_flight=1), PAUSE, Blocker.IN_HANDLING, ClientState.IN_HANDLING),
    "requests pipelined before the throttle hold the next": Row(
        UNMUTED, next_request(in_flight=3), PAUSE, Blocker.IN_HANDLING, ClientState.IN_HANDLING),
    "a response with more still in flight keeps it blocked": Row(
        IN_HANDLING, response_sent(in_flight=1), NOTHING, Blocker.IN_HANDLING, ClientState.IN_HANDLING),
    "the last response in flight resumes reading": Row(
        IN_HANDLING, response_sent(in_flight=0), RESUME, NO, ClientState.ONE_AT_A_TIME),
    "the span's end resumes reading with requests in flight": Row(
        IN_HANDLING, response_sent(in_flight=2, at=AFTER_SPAN), RESUME, NO, ClientState.OPEN),
    "after the span pipelining is back": Row(
        UNMUTED, next_request(in_flight=3, at=AFTER_SPAN), FORWARD, NO, ClientState.OPEN),
    "a cluster-wide mute has no span of its own": Row(
        OPEN, mute(500, one_at_a_time=False), Actions(pause_reading=True, unmute_at=T0 + 0.5),
        Blocker.THROTTLED, ClientState.THROTTLED),
    "a hook's span holds the next request": Row(
        (*OPEN, next_request()), decided(in_flight=1, one_at_a_time_s=5.0), PAUSE, Blocker.IN_HANDLING,
        ClientState.IN_HANDLING),
    # Holds.
    "a hold pauses": Row(OPEN, hold, PAUSE, Blocker.HELD, ClientState.HELD),
    "nothing is handed on while held": Row((*OPEN, hold), next_request(), NOTHING, Blocker.HELD, ClientState.HELD),
    "its release resumes": Row((*OPEN, hold), release, RESUME, NO, ClientState.OPEN),
    "a release under a mute does not resume": Row(
        (*OPEN, hold, mute(500)), release, NOTHING, Blocker.THROTTLED, ClientState.THROTTLED),
    # Graceful shutdown.
    "drain owed nothing is drained at once": Row(
        OPEN, drain(0), Actions(pause_reading=True, drained=True), Blocker.SHUTDOWN, ClientState.DRAINING),
    "drain with requests in flight waits": Row(OPEN, drain(2), PAUSE, Blocker.SHUTDOWN, ClientState.DRAINING),
    "drain waits for a held request": Row(
        (*OPEN, hold), drain(0), NOTHING, Blocker.HELD | Blocker.SHUTDOWN, ClientState.DRAINING),
    "the last response drains": Row(
        (*OPEN, drain(1)), response_sent(in_flight=0), Actions(drained=True), Blocker.SHUTDOWN,
        ClientState.DRAINING),
    "a response with more in flight does not": Row(
        (*OPEN, drain(2)), response_sent(in_flight=1), NOTHING, Blocker.SHUTDOWN, ClientState.DRAINING),
    "a held request decided without a response drains": Row(
        (*OPEN, hold, drain(0), release), decided(in_flight=0), Actions(drained=True), Blocker.SHUTDOWN,
        ClientState.DRAINING),
    "a held acks=0 request throttled while draining drains": Row(
        (*OPEN, hold, drain(0), release), decided(in_flight=0, mute_ms=300),
        Actions(unmute_at=T0 + 0.3, drained=True), Blocker.SHUTDOWN | Blocker.THROTTLED, ClientState.DRAINING),
    "nothing is handed on while draining": Row(
        (*OPEN, drain(1)), next_request(), NOTHING, Blocker.SHUTDOWN, ClientState.DRAINING),
    "draining never resumes reading": Row(
        (*OPEN, drain(1), mute(100)), unmute, NOTHING, Blocker.SHUTDOWN, ClientState.DRAINING),
    # Closed.
    "close cancels the timer and ends a drain": Row(
        THROTTLED, close, Actions(cancel_unmute=True, drained=True), Blocker.THROTTLED, ClientState.CLOSED),
    "close twice is once": Row((*OPEN, close), close, NOTHING, NO, ClientState.CLOSED),
    "nothing is handed on once closed": Row((*OPEN, close), next_request(), NOTHING, NO, ClientState.CLOSED),
    "a mute after close is ignored": Row((*OPEN, close), mute(500), NOTHING, NO, ClientState.CLOSED),
    "a drain after close is drained": Row((*OPEN, close), drain(3), Actions(drained=True), NO, ClientState.CLOSED),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_transition(row: Row) -> None:
    gate = ClientGate()
    for step in row.history:
        step(gate)
    assert row.event(gate) == row.actions
    assert gate.blockers == row.blockers
    assert gate.reads_paused == bool(row.blockers)
    # The state at the event's time: rows after the span ask at AFTER_SPAN.
    at = AFTER_SPAN if row.state is ClientState.OPEN and gate.one_at_a_time_until > T0 else T0
    assert gate.state(at) == row.state


def test_every_event_moves_exactly_one_blocker() -> None:
    # What lets overlapping reasons coexist: no event sets or clears another's blocker.
    assert set(TRANSITIONS) == set(Event)
    for sets, clears in TRANSITIONS.values():
        assert bool(sets) != bool(clears)
        assert len(list(sets or clears)) == 1
    assert {blocker for pair in TRANSITIONS.values() for blocker in pair if blocker} == set(Blocker)


def test_every_blocker_is_set_and_cleared_except_shutdown() -> None:
    # A shutdown is never taken back: draining ends in a close.
    set_by = {sets for sets, _ in TRANSITIONS.values() if sets}
    cleared_by = {clears for _, clears in TRANSITIONS.values() if clears}
    assert set_by == set(Blocker)
    assert cleared_by == set(Blocker) - {Blocker.SHUTDOWN}


def test_mute_starts_one_at_a_time_at_its_end() -> None:
    gate = ClientGate()
    gate.mute(T0, 2_000)
    assert gate.muted_until == T0 + 2.0
    assert gate.one_at_a_time_until == T0 + 2.0 + ONE_AT_A_TIME_AFTER_THROTTLE_S
    gate.mute(T0 + 1.0, 2_000)
    assert gate.muted_until == T0 + 3.0
    assert gate.one_at_a_time_until == T0 + 3.0 + ONE_AT_A_TIME_AFTER_THROTTLE_S
    gate.read_one_at_a_time(T0, 1.0)  # a hook's span only ever extends it
    assert gate.one_at_a_time_until == T0 + 3.0 + ONE_AT_A_TIME_AFTER_THROTTLE_S


def test_a_streamed_responses_mute_starts_when_it_ends() -> None:
    gate = ClientGate()
    for step in OPEN:
        step(gate)
    gate.stream_started(700)
    assert not gate.muted  # its bytes are still going to the client
    assert gate.stream_ended(T0 + 5.0, 0) == Actions(pause_reading=True, unmute_at=T0 + 5.7)
    assert gate.muted
    gate.unmute()
    assert gate.stream_ended(T0 + 6.0, 0) == NOTHING  # the mute was taken once


def test_the_common_path_allocates_nothing() -> None:
    gate = ClientGate()
    for step in OPEN:
        step(gate)
    assert gate.next_request(T0, 0, False) is FORWARD
    assert gate.decided(T0, 1) is NOTHING
    assert gate.response_sent(T0, 0) is NOTHING
