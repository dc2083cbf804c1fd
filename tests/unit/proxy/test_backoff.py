"""The retry delays shared by the supervisor's restarts and the fleet exchange's reconnects."""

from __future__ import annotations

import pytest

from kqp.proxy.backoff import Backoff


def test_delays_double_up_to_the_cap() -> None:
    backoff = Backoff(initial_s=0.5, max_s=3.0)
    # uniform 0.5 is the middle of the jitter range: no spread at all.
    assert [backoff.delay_s(attempt, 0.5) for attempt in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_jitter_spreads_each_delay_by_a_fifth_either_way() -> None:
    backoff = Backoff(initial_s=1.0, max_s=100.0)
    assert backoff.delay_s(2, 0.0) == pytest.approx(3.2)
    assert backoff.delay_s(2, 0.999999) == pytest.approx(4.8, rel=1e-5)
    # With a multiplier of 2 and a jitter of 0.2, the next delay is longer whatever the draws.
    assert backoff.delay_s(3, 0.0) > backoff.delay_s(2, 0.999999)


def test_a_huge_attempt_number_stays_at_the_cap() -> None:
    assert Backoff(initial_s=0.1, max_s=30.0).delay_s(10_000, 0.5) == 30.0


@pytest.mark.parametrize(("initial", "maximum"), [(0.0, 1.0), (2.0, 1.0)])
def test_nonsense_is_refused(initial: float, maximum: float) -> None:
    with pytest.raises(ValueError, match="initial_s"):
        Backoff(initial_s=initial, max_s=maximum)
