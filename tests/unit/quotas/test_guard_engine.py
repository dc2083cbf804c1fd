"""The cluster guard's limits inside the engine (kqp/quotas/guard_limits.py): a guard limit throttles
exactly as a configured quota of the same value, and the lower of the two binds."""

from __future__ import annotations

import pytest

from kqp.quotas import QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings
from kqp.quotas.fair_share import FETCH, PRODUCE

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


@pytest.mark.parametrize(("guard_limit", "quota", "binding"), [
    (40_000, None, 40_000),  # the guard alone
    (40_000, 60_000, 40_000),  # the guard is lower
    (60_000, 40_000, 40_000),  # the configured quota is lower
])
def test_the_lower_limit_throttles_exactly_as_a_configured_quota_of_that_value(
    guard_limit: float, quota: float | None, binding: float
) -> None:
    expected = produce_throttles(configured(binding))
    assert any(expected)  # 100 kB/s against 40 kB/s: throttled
    assert produce_throttles(guarded(guard_limit, quota)) == expected


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
    reference = configured(50_000, "consumer_byte_rate")
    for at, size in STEPS:
        expected = reference.record_fetch("1", "alice", "app", size, at, delivered=True)
        assert engine.record_fetch("1", "alice", "app", size, at, delivered=True) == expected


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
