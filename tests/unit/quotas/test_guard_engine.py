"""The cluster guard's limits inside the engine (kqp/quotas/guard_limits.py): a guard limit throttles
with KIP-599's token bucket, started at the room Kafka's window had left under it; beside a
configured quota the larger throttle is the answer; the window still measures."""

from __future__ import annotations

import pytest

from kqp.quotas import QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings
from kqp.quotas.fair_share import FETCH, PRODUCE
from kqp.quotas.guard_limits import GuardRate
from kqp.quotas.stats import WindowedRate, token_bucket_throttle_time

# One produce of 10 kB every 100 ms for 30 s: 100 kB/s offered.
STEPS = [(index * 100, 10_000) for index in range(300)]


def configured(quota: float | None, quota_type: str = "producer_byte_rate") -> QuotaEngine:
    entries = () if quota is None else (QuotaEntry(QuotaEntity(client_id="app"), {quota_type: quota}),)  # type: ignore[dict-item]
    return QuotaEngine(QuotaSettings(entries=entries))


def guarded(guard_limit: float, quota: float | None = None, dry_run: bool = False) -> QuotaEngine:
    engine = configured(quota)
    guard = engine.set_guard("client-id", dry_run)
    assert guard is not None
    guard.set_limits({(QuotaEntity(client_id="app"), PRODUCE): guard_limit})
    return engine


def produce_throttles(engine: QuotaEngine) -> list[int]:
    return [engine.record_produce("1", "alice", "app", size, at) for at, size in STEPS]


def bucket_throttles(limit: float) -> list[int]:
    """STEPS against a token bucket of `limit` bytes/s (burst: 11 s of it) that starts, at the
    first request, with the room an empty window of 10 s leaves: limit x 10 s."""
    tokens, last, throttles = limit * 10.0, 0, []
    for at, size in STEPS:
        tokens = min(11.0 * limit, tokens + limit * (at - last) / 1000.0) - size
        last = at
        throttles.append(token_bucket_throttle_time(tokens, limit) if tokens < 0 else 0)
    return throttles


def test_a_guard_limit_throttles_with_a_token_bucket_of_its_value() -> None:
    expected = bucket_throttles(40_000)
    assert any(expected)  # 100 kB/s against 40 kB/s: throttled
    assert produce_throttles(guarded(40_000)) == expected


@pytest.mark.parametrize(("guard_limit", "quota"), [(40_000, 60_000), (60_000, 40_000)])
def test_beside_a_configured_quota_the_larger_throttle_is_the_answer(guard_limit: float, quota: float) -> None:
    expected = [max(guard, own) for guard, own in zip(bucket_throttles(guard_limit),
                                                      produce_throttles(configured(quota)), strict=True)]
    assert produce_throttles(guarded(guard_limit, quota)) == expected


def backlogged_requests(rate: WindowedRate, seconds: int) -> list[int]:
    """A client with a backlog of 1 MB requests that obeys each throttle: requests per second."""
    muted_until, per_second = 0, [0] * seconds
    for now in range(0, seconds * 1000, 20):
        if now >= muted_until:
            muted_until = now + rate.record_and_throttle(1_000_000, now)
            per_second[now // 1000] += 1
    return per_second


def test_a_backlogged_client_with_large_requests_is_paced_evenly() -> None:
    """Why the guard throttles with a bucket: under Kafka's windowed throttle of the same constant
    limit, a request's place in the window echoes a window later, and the requests in successive
    11 s windows go from 2 to 7; under the bucket one request each 1 MB / 440 kB/s = 2.27 s, 4 or
    5 in every window."""

    def per_window(per_second: list[int]) -> set[int]:
        return {sum(per_second[end - 11:end]) for end in range(60, len(per_second) + 1)}

    assert per_window(backlogged_requests(GuardRate(11, 1000, 440_000), 200)) == {4, 5}
    assert per_window(backlogged_requests(WindowedRate(11, 1000, 440_000), 200)) == {2, 3, 4, 5, 6, 7}


def test_dry_run_computes_and_throttles_nothing() -> None:
    seen: list[tuple[str, int, bool]] = []
    engine = guarded(40_000, dry_run=True)
    engine.on_throttle = lambda quota_type, tags, ms, enforced: seen.append((quota_type, ms, enforced))
    assert not any(produce_throttles(engine))
    assert seen and all(quota_type == "producer_byte_rate" and not enforced for quota_type, _, enforced in seen)


def test_a_fetch_is_throttled_by_the_guard_and_its_max_bytes_capped() -> None:
    engine = configured(None)
    guard = engine.set_guard("client-id")
    assert guard is not None
    guard.set_limits({(QuotaEntity(client_id="app"), FETCH): 50_000})
    assert engine.quota_enabled("consumer_byte_rate")
    # maxValueInQuotaWindow: limit x (samples - 1) x window seconds = 50000 x 10 x 1.
    assert engine.fetch_max_bytes_cap("1", "alice", "app", 0) == 500_000
    # Delivered (a ShareFetch through the proxy), every fetch is charged: the bucket's throttles.
    throttles = [engine.record_fetch("1", "alice", "app", size, at, delivered=True) for at, size in STEPS]
    assert throttles == bucket_throttles(50_000)


def test_the_guard_measures_each_entity_per_broker_with_its_configured_quota() -> None:
    engine = guarded(1e12, quota=60_000)
    for at, size in STEPS[:110]:  # 11 s at 100 kB/s on broker 1, half as much on broker 2
        engine.record_produce("1", "alice", "app", size, at)
        engine.record_produce("2", "bob", "app", size // 2, at)
    engine.record_produce("bootstrap", "alice", "app", 10, 0)  # not a broker: not judged
    guard = engine.guard
    assert guard is not None
    [flow] = guard.measured(11_000)
    assert flow.entity == QuotaEntity(client_id="app")
    assert flow.quota_type == PRODUCE
    assert set(flow.rates) == {1, 2}
    assert flow.rates[1] == pytest.approx(100_000, rel=0.01)
    assert flow.rates[2] == pytest.approx(50_000, rel=0.01)
    assert flow.configured_quota == 60_000


def test_guard_off_leaves_the_engine_as_kafkas() -> None:
    engine = configured(None)
    assert engine.set_guard(None) is None
    assert not engine.quota_enabled("producer_byte_rate")
    assert not any(produce_throttles(engine))


def test_measured_says_which_flows_the_guard_throttled_within_the_last_window() -> None:
    engine = guarded(40_000)
    guard = engine.guard
    assert guard is not None
    assert any(produce_throttles(engine))  # 100 kB/s against 40 kB/s until 29.9 s
    [flow] = guard.measured(30_000)
    assert flow.throttled
    # A quota window (11 s) with no throttle later, it is no longer held back.
    [later] = guard.measured(30_000 + 11_001)
    assert not later.throttled


def backlogged_together(clients: dict[str, int], limit: float, seconds: int, spread: bool,
                        spread_from_s: int = 1) -> list[int]:
    """Backlogged clients of 1 MB requests that obey each throttle, each starting at its own ms,
    all under one guard limit, the guard stepping every second (spreading from `spread_from_s`):
    their requests per second."""
    engine = QuotaEngine(QuotaSettings())
    guard = engine.set_guard("client-id", False)
    assert guard is not None
    guard.set_limits({(QuotaEntity(client_id=client), PRODUCE): limit for client in clients})
    muted_until, per_second = dict(clients), [0] * seconds
    for now in range(0, seconds * 1000, 20):
        if spread and now >= spread_from_s * 1000 and now % 1000 == 0:
            guard.spread_admissions(now)
        for client in clients:
            if now >= muted_until[client]:
                muted_until[client] = now + engine.record_produce("1", "", client, 1_000_000, now)
                per_second[now // 1000] += 1
    return per_second


def windows_of(per_second: list[int], first: int = 40) -> set[int]:
    return {sum(per_second[end - 11:end]) for end in range(first, len(per_second) + 1)}


@pytest.mark.parametrize("starts", [{"noisy-1": 0, "noisy-2": 0}, {"noisy-1": 0, "noisy-2": 300}])
def test_two_backlogged_clients_held_back_together_are_spaced_half_a_period_apart(starts: dict[str, int]) -> None:
    """Two library-default producers given the same share (1 MB requests, 440 kB/s: one each
    2.27 s, 4.8 an 11 s window) that start together keep that phase under the bucket: every
    window holds 4 or 5 of each, together 8 or 10 (0.85x or 1.00x of what they may send), never
    9. Spread, the second comes half a period after the first: 9 or 10 in every window."""
    assert windows_of(backlogged_together(starts, 440_000, 120, spread=False)) >= {8, 10}
    assert windows_of(backlogged_together(starts, 440_000, 120, spread=True)) == {9, 10}


def test_three_are_spaced_a_third_of_a_period_apart_and_spaced_clients_are_left_alone() -> None:
    # 1 MB against 300 kB/s: one request each 3.33 s, 9.9 per window from the three.
    together = dict.fromkeys(("a", "b", "c"), 0)
    assert windows_of(backlogged_together(together, 300_000, 120, spread=False)) == {9, 12}
    assert windows_of(backlogged_together(together, 300_000, 120, spread=True)) == {9, 10}
    # A third of a period apart, all three held back: nothing moves them, and they send as they
    # would without the spreading.
    apart = {"a": 0, "b": 1111, "c": 2222}
    assert backlogged_together(apart, 300_000, 120, spread=True, spread_from_s=3) == \
        backlogged_together(apart, 300_000, 120, spread=False)


def test_clients_with_small_requests_or_other_periods_are_not_spread() -> None:
    engine = QuotaEngine(QuotaSettings())
    guard = engine.set_guard("client-id", False)
    assert guard is not None
    guard.set_limits({(QuotaEntity(client_id=client), PRODUCE): 440_000 for client in ("a", "b", "c", "d")})
    for client, size in (("a", 200_000), ("b", 200_000), ("c", 1_000_000), ("d", 1_200_000)):
        for at in (0, 20):  # over the bucket's room: both in deficit, admissions due together
            engine.record_produce("1", "", client, size * 20, at)
            engine.record_produce("1", "", client, size, at + 20)
    sensors = guard.managers[PRODUCE].sensors.values()
    assert all(isinstance(s.rate, GuardRate) and s.rate.admission_in_s(1000) for s in sensors)  # all held back
    # a and b: a request is under a second of their limit; c and d: 2.3 s and 2.7 s, not one period.
    assert guard.spread_admissions(1000) == 0
