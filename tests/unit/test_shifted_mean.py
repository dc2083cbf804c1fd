"""bench/quota_shapes.shifted_mean: the system test's figure that the phase of a throttled
shape's bursts does not move (docs/quotas.md, the `ten` finding)."""

from __future__ import annotations

from bench.quota_shapes import QUOTA, shifted_mean

SECONDS, WARMUP = 90, 25
PERIOD = 12  # one throttling cycle: a window's worth at once, then a trickle


def cycles(phase: int) -> list[int]:
    """Ten producers as the wire shows them: 10 quota-seconds in one second every PERIOD
    seconds from `phase`, a tenth of the quota every other second."""
    return [10 * QUOTA if s % PERIOD == phase % PERIOD else QUOTA // 10 for s in range(SECONDS)]


def plain(per_second: list[int]) -> float:
    return sum(per_second[WARMUP:]) / (SECONDS - WARMUP) / QUOTA


def test_the_plain_mean_moves_with_the_phase_of_the_burst() -> None:
    # The premise: a burst just before the measured seconds (Kafka's at 23 s) or just inside
    # them moves the plain figure by about a burst over the span.
    figures = [plain(cycles(phase)) for phase in range(PERIOD)]
    assert max(figures) - min(figures) > 0.12


def test_the_shifted_mean_does_not() -> None:
    figures = [shifted_mean(cycles(phase), WARMUP, SECONDS) for phase in range(PERIOD)]
    assert all(f is not None for f in figures)
    values = [f for f in figures if f is not None]
    assert max(values) - min(values) < 1e-9
    # ... and it is the rate over whole cycles: 10 + 11 x 0.1 quota-seconds every 12 s.
    assert abs(values[0] - (10 + 11 * 0.1) / PERIOD) < 0.01


def test_a_run_too_short_for_the_shifts_has_none() -> None:
    assert shifted_mean([QUOTA] * 20, warmup_s=3, seconds=20) is None
    assert shifted_mean([QUOTA] * 10, warmup_s=8, seconds=10) is None
