"""Fair turns between the connections of one budget (kqp.quotas.turns, opt-in)."""

from __future__ import annotations

from kqp.quotas.turns import ConnectionTurns, Mute

BUDGET = ("1", "", "app", 0)
SPAN_MS = 11_000.0


def test_one_connection_is_muted_for_kafkas_throttle() -> None:
    turns = ConnectionTurns(SPAN_MS)
    turns.charged(BUDGET, 1, 1_000_000, 0.0)
    assert turns.throttled(BUDGET, 1, 800, 0.0) == [Mute(1, 800)]


def test_a_throttle_that_moves_the_end_holds_the_other_connections_to_it() -> None:
    turns = ConnectionTurns(SPAN_MS)
    for connection_id in (1, 2, 3):
        turns.charged(BUDGET, connection_id, 1_000_000, 0.0)
    assert turns.throttled(BUDGET, 2, 5_000, 100.0) == [Mute(2, 5_000), Mute(1, 5_000), Mute(3, 5_000)]


def test_a_short_throttle_waits_for_the_budgets_latest_end() -> None:
    # Kafka would let connection 1 back after 200 ms while connection 2 waits 5 s: the short
    # throttles are what starve the long ones.
    turns = ConnectionTurns(SPAN_MS)
    turns.charged(BUDGET, 1, 1_000_000, 0.0)
    turns.charged(BUDGET, 2, 1_000_000, 0.0)
    turns.throttled(BUDGET, 2, 5_000, 0.0)
    assert turns.throttled(BUDGET, 1, 200, 1_000.0) == [Mute(1, 4_000)]  # the end did not move: nobody else


def test_other_budgets_and_quiet_connections_are_not_held() -> None:
    turns = ConnectionTurns(SPAN_MS)
    consumer = ("1", "", "app", 1)  # the same client-id's fetch budget
    turns.charged(BUDGET, 1, 1_000_000, 0.0)
    turns.charged(consumer, 2, 1_000_000, 20_000.0)
    turns.charged(BUDGET, 3, 1_000_000, 20_000.0)
    # Connection 1 last produced 20 s ago, longer than a quota span: it takes no part.
    assert turns.throttled(BUDGET, 3, 1_000, 20_000.0) == [Mute(3, 1_000)]


def test_closed_and_expired_connections_are_forgotten() -> None:
    turns = ConnectionTurns(SPAN_MS)
    turns.charged(BUDGET, 1, 1_000_000, 0.0)
    turns.charged(BUDGET, 2, 1_000_000, 0.0)
    turns.closed(2)
    assert turns.throttled(BUDGET, 1, 500, 0.0) == [Mute(1, 500)]
    turns.expire(SPAN_MS + 1_000.0)
    assert len(turns) == 0


def test_a_connection_of_small_requests_waits_its_part_of_the_turn() -> None:
    # Turns are fair in bytes: a connection whose requests are a tenth of the largest comes
    # back after a tenth of the hold, or it would get a tenth of the others' share.
    turns = ConnectionTurns(SPAN_MS)
    turns.charged(BUDGET, 1, 1_000_000, 0.0)
    turns.charged(BUDGET, 2, 100_000, 0.0)
    assert turns.throttled(BUDGET, 1, 5_000, 0.0) == [Mute(1, 5_000), Mute(2, 500)]
    turns.charged(BUDGET, 2, 100_000, 600.0)
    assert turns.throttled(BUDGET, 2, 3_000, 600.0) == [Mute(2, 440)]  # a tenth of the 4.4 s left


def test_a_turn_lasts_at_least_as_long_as_its_bytes_take_at_the_quota() -> None:
    # Kafka's window lets a whole turn's burst through once the previous one has left the
    # window; pacing the turns at the quota does not (10 MB at 1 MB/s: 10 s).
    turns = ConnectionTurns(SPAN_MS)
    for connection_id in range(10):
        turns.charged(BUDGET, connection_id, 1_000_000, 0.0, limit=1_000_000)
    mutes = turns.throttled(BUDGET, 9, 0, 0.0)  # Kafka does not throttle this one
    assert mutes[0] == Mute(9, 10_000)
    assert {m.mute_ms for m in mutes[1:]} == {10_000} and len(mutes) == 10


def test_a_fetch_answered_empty_sizes_its_turn_but_does_not_pace_it() -> None:
    # A throttled fetch is answered empty (Kafka's answer): no byte passed, so the turn is not
    # paced by it, but the connection will ask for as much again, so it waits a whole turn.
    turns = ConnectionTurns(SPAN_MS)
    turns.charged(BUDGET, 1, 1_000_000, 0.0, limit=1_000_000)
    turns.charged(BUDGET, 2, 1_000_000, 0.0, limit=1_000_000, delivered=False)
    assert turns.throttled(BUDGET, 2, 3_000, 0.0) == [Mute(2, 3_000), Mute(1, 3_000)]  # paced 1 s, not 2 s
    turns.charged(BUDGET, 1, 1_000_000, 100.0, limit=1_000_000)
    # Paced by the two delivered megabytes only (2 s); the 3 s end of the throttle still holds.
    assert turns.throttled(BUDGET, 1, 500, 100.0) == [Mute(1, 2_900)]


def test_the_connections_taking_part_are_those_of_the_last_span() -> None:
    turns = ConnectionTurns(SPAN_MS)
    turns.charged(BUDGET, 1, 1_000, 0.0)
    turns.charged(BUDGET, 2, 1_000, 5_000.0, delivered=False)
    assert turns.taking_part(BUDGET, 5_000.0) == 2
    assert turns.taking_part(BUDGET, SPAN_MS + 1_000.0) == 1  # connection 1 charged over a span ago
    assert turns.taking_part(("other",), 0.0) == 0
