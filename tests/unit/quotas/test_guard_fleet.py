"""The cluster guard across a fleet (guard.fleet_wide; kqp.quotas.fleet GuardDelta): each instance's use of
the guard's sensors travels in its usage report, so that every instance's guard measures the fleet's
load per broker and entity, and sees which flows the guard held back anywhere."""

from __future__ import annotations

import json

import pytest

from kqp.quotas import QuotaEngine, QuotaEntity, QuotaSettings
from kqp.quotas.fair_share import FETCH, PRODUCE
from kqp.quotas.fleet import GuardDelta, ReportError, UsageReport, decode_report, encode_report

APP = QuotaEntity(client_id="app")


def instance(share: bool = True) -> QuotaEngine:
    engine = QuotaEngine(QuotaSettings())
    engine.set_guard("client-id")
    engine.share_guard_usage(share)
    return engine


def exchange(sender: QuotaEngine, receiver: QuotaEngine, now_ms: float) -> list[GuardDelta]:
    deltas = sender.take_guard_usage()
    receiver.record_remote_guard(deltas, now_ms)
    return deltas


def rates(engine: QuotaEngine, now_ms: int) -> dict[tuple[QuotaEntity, str], dict[int, float]]:
    assert engine.guard is not None
    return {flow.key: dict(flow.rates) for flow in engine.guard.measured(now_ms)}


def test_each_instance_measures_the_fleets_rate_per_entity_and_broker() -> None:
    a, b = instance(), instance()
    # 100 kB/s through each instance to broker 1 for 12 s, and 50 kB/s through a to broker 2.
    for at in range(0, 12_000, 100):
        a.record_produce("1", "", "app", 10_000, at)
        b.record_produce("1", "", "app", 10_000, at)
        a.record_produce("2", "", "app", 5_000, at)
        if at % 500 == 0:  # every report interval, both ways
            exchange(a, b, at)
            exchange(b, a, at)
    exchange(a, b, 12_000)
    exchange(b, a, 12_000)
    seen_a, seen_b = rates(a, 12_000), rates(b, 12_000)
    assert seen_a[(APP, PRODUCE)][1] == pytest.approx(200_000, rel=0.02)
    assert seen_b[(APP, PRODUCE)][1] == pytest.approx(seen_a[(APP, PRODUCE)][1])
    # b hears of a's use of broker 2 a report interval late, in one lump at the report's time:
    # its windowed rate differs by at most one report's bytes over the window (10 s at least).
    assert abs(seen_b[(APP, PRODUCE)][2] - seen_a[(APP, PRODUCE)][2]) <= 5 * 5_000 / 10
    assert seen_a[(APP, PRODUCE)][2] == pytest.approx(50_000, rel=0.02)


def test_a_throttle_anywhere_marks_the_flow_held_back_on_every_instance() -> None:
    a, b = instance(), instance()
    for engine in (a, b):
        assert engine.guard is not None
        engine.guard.set_limits({(APP, PRODUCE): 20_000})
    throttles = [a.record_produce("1", "", "app", 300_000, at) for at in (0, 100)]
    assert any(throttles)
    b.record_produce("1", "", "app", 1, 0)  # b serves the client too, far under its limit
    [delta] = exchange(a, b, 200)
    assert delta.throttles >= 1 and delta.amount == 600_000
    assert b.guard is not None
    [flow] = b.guard.measured(200)
    assert flow.throttled and flow.throttled_brokers == frozenset({1})
    # The next report carries no throttle it already counted.
    a.record_produce("1", "", "app", 1, 20_000)
    [again] = a.take_guard_usage()
    assert again.throttles == 0


def test_a_throttled_fetch_travels_net_of_what_it_unrecorded() -> None:
    a, b = instance(), instance()
    assert a.guard is not None
    a.guard.set_limits({(APP, FETCH): 10_000})
    a.record_fetch("1", "", "app", 500_000, 0)  # over at once: answered empty, unrecorded
    [delta] = exchange(a, b, 10)
    assert delta.amount == 0 and delta.throttles == 1
    assert rates(b, 10)[(APP, FETCH)][1] == 0


def test_nothing_is_kept_for_the_fleet_unless_guard_fleet_is_on() -> None:
    alone = instance(share=False)
    alone.record_produce("1", "", "app", 10_000, 0)
    assert alone.take_guard_usage() == []


def test_the_guard_part_of_a_report_round_trips_and_is_optional() -> None:
    delta = GuardDelta("producer_byte_rate", "1", (("user", ""), ("client-id", "app")), 12_345.0, 2)
    report = UsageReport("i1", 7, (), (delta,))
    assert decode_report(encode_report(report)) == report
    plain = UsageReport("i1", 8)
    assert "guard" not in json.loads(encode_report(plain))
    assert decode_report(encode_report(plain)).guard == ()


def test_a_malformed_guard_entry_is_named() -> None:
    body = {"format": 1, "instance": "i1", "seq": 1, "usage": [], "guard": [["producer_byte_rate", "1", [], "x", 0]]}
    with pytest.raises(ReportError, match="malformed guard entry 0"):
        decode_report(json.dumps(body).encode())


def test_the_others_bytes_throttle_this_instances_clients_as_the_fleets_rate() -> None:
    """The remote bytes land in the very sensor a local request records into (not a twin that
    only the measurement adds up), so the guard limit throttles on the fleet's rate."""
    a, b = instance(), instance()
    for engine in (a, b):
        assert engine.guard is not None
        engine.guard.set_limits({(APP, PRODUCE): 50_000})
    a.record_produce("1", "alice", "app", 400_000, 0)  # under the limit over Kafka's 10 s: 40 kB/s
    exchange(a, b, 100)
    b.record_produce("1", "bob", "app", 1_000, 200)  # b's own first request
    assert b.record_produce("1", "bob", "app", 200_000, 300) > 0  # 601 kB in the fleet's window: over
    alone = instance()
    assert alone.guard is not None
    alone.guard.set_limits({(APP, PRODUCE): 50_000})
    alone.record_produce("1", "bob", "app", 1_000, 200)
    assert alone.record_produce("1", "bob", "app", 200_000, 300) == 0  # 201 kB alone: under


def fleet_of_backlogged(clients: dict[str, int], limit: float, seconds: int, spread: bool) -> list[int]:
    """Backlogged clients of 1 MB requests that obey each throttle, each through its own instance
    (client -> the ms it starts), the instances exchanging their guard deltas every 100 ms (20 ms
    on the way) and stepping, so spreading, every second, each half a second after the one before:
    the fleet's requests per second."""
    names = sorted(clients)
    engines = [instance() for _ in names]
    for engine in engines:
        assert engine.guard is not None
        engine.guard.set_limits({(QuotaEntity(client_id=name), PRODUCE): limit for name in names})
    muted_until, per_second = dict(clients), [0] * seconds
    in_flight: list[tuple[int, int, list[GuardDelta]]] = []
    for now in range(0, seconds * 1000, 20):
        if now % 100 == 0:
            in_flight += [(now + 20, index, engine.take_guard_usage()) for index, engine in enumerate(engines)]
        for _, sender, deltas in [report for report in in_flight if report[0] <= now]:
            for index, engine in enumerate(engines):
                if index != sender:
                    engine.record_remote_guard(deltas, now)
        in_flight = [report for report in in_flight if report[0] > now]
        for index, engine in enumerate(engines):
            if spread and now >= 1000 and (now - index * 500) % 1000 == 0:
                assert engine.guard is not None
                engine.guard.spread_admissions(now)
        for index, name in enumerate(names):
            if now >= muted_until[name]:
                muted_until[name] = now + engines[index].record_produce("1", "", name, 1_000_000, now)
                per_second[now // 1000] += 1
    return per_second


def windows_of(per_second: list[int], first: int = 40) -> set[int]:
    return {sum(per_second[end - 11:end]) for end in range(first, len(per_second) + 1)}


@pytest.mark.parametrize("starts", [{"noisy-1": 0, "noisy-2": 0}, {"noisy-1": 300, "noisy-2": 0}])
def test_two_backlogged_clients_through_two_instances_are_spaced_half_a_period_apart(starts: dict[str, int]) -> None:
    """The wire's fleet shape (bench/guard_fleet.py): two library-default producers given the same
    share, each through its own instance. Alone, neither instance sees a pair to spread, and two
    that start together send together: 8 or 10 of their 1 MB requests in an 11 s window, never 9.
    With the other's requests known through the exchange, the one whose name sorts later yields
    half a period (whichever of the two is due first): 9 or 10 in every window."""
    assert windows_of(fleet_of_backlogged(starts, 440_000, 120, spread=False)) >= {8, 10}
    assert windows_of(fleet_of_backlogged(starts, 440_000, 120, spread=True)) == {9, 10}


def test_three_through_three_instances_are_spaced_a_third_of_a_period_apart() -> None:
    # 1 MB against 300 kB/s: one request each 3.33 s, 9.9 per window from the three.
    together = dict.fromkeys(("a", "b", "c"), 0)
    assert windows_of(fleet_of_backlogged(together, 300_000, 120, spread=False)) == {9, 12}
    assert windows_of(fleet_of_backlogged(together, 300_000, 120, spread=True)) == {9, 10}


def held_back_pair(starts: dict[str, int], until_ms: int) -> list[QuotaEngine]:
    """x through one instance and y through another, backlogged 1 MB requests under a 440 kB/s
    guard limit from their start (ms) until `until_ms`, the instances exchanging every 100 ms."""
    engines = [instance(), instance()]
    for engine in engines:
        assert engine.guard is not None
        engine.guard.set_limits({(QuotaEntity(client_id=name), PRODUCE): 440_000 for name in ("x", "y")})
    muted_until = dict(starts)
    for now in range(0, until_ms + 1, 10):
        for index, name in enumerate(("x", "y")):
            if now >= muted_until[name]:
                muted_until[name] = now + engines[index].record_produce("1", "", name, 1_000_000, now)
        if now % 100 == 0:
            exchange(engines[0], engines[1], now)
            exchange(engines[1], engines[0], now)
    return engines


@pytest.mark.parametrize("starts", [{"x": 0, "y": 50}, {"x": 50, "y": 0}])
def test_of_a_pair_due_together_only_the_later_name_yields_on_either_instance(starts: dict[str, int]) -> None:
    """Each instance sees the other's client a report late: by time each could take its own for
    the later one and both would move, still together. By name, y moves, whether it is due a
    little before x or a little after, and x never does."""
    through_x, through_y = held_back_pair(starts, 12_000)
    assert through_x.guard is not None and through_y.guard is not None
    assert through_x.guard.spread_admissions(12_000) == 0
    assert through_y.guard.spread_admissions(12_000) == 1
    # Once it moved, the stale view of it the other instance holds moves nobody.
    assert through_x.guard.spread_admissions(12_000) == 0 and through_y.guard.spread_admissions(12_000) == 0
