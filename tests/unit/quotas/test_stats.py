"""Metric primitives against Kafka's own tests (spec §9 A, B, C)."""

from __future__ import annotations

import pytest

from kqp.quotas.stats import (
    LONG_MAX,
    TokenBucket,
    WindowedRate,
    java_round,
    throttle_time,
    token_bucket_throttle_time,
)


def test_java_round_rounds_halves_up_unlike_python_round() -> None:
    assert [java_round(x) for x in (0.5, 1.5, 2.5, -0.5, -1.5, -1720.588)] == [1, 2, 3, 0, -1, -1721]


# A1-A4: RateTest.testRateWithNoPriorAvailableSamples — record 50 at 0, measure at W*1000-1.
@pytest.mark.parametrize(
    ("samples", "window_s", "window_size_ms", "rate"),
    [
        pytest.param(1, 1, 999, 50.05005005, id="A1-N1-W1"),
        pytest.param(1, 11, 10999, 4.54586781, id="A2-N1-W11"),
        pytest.param(11, 1, 10999, 4.54586781, id="A3-N11-W1"),
        pytest.param(11, 11, 120999, 0.41322656, id="A4-N11-W11"),
    ],
)
def test_rate_test_rate_with_no_prior_available_samples(
    samples: int, window_s: int, window_size_ms: int, rate: float
) -> None:
    stat = WindowedRate(samples, window_s * 1000)
    stat.record(50.0, 0)
    now = window_s * 1000 - 1
    assert stat.window_size(now) == window_size_ms
    assert stat.measure(now) == pytest.approx(rate, abs=1e-8)


def test_rate_test_rate_is_consistent_after_the_first_window_a5() -> None:
    stat = WindowedRate(2, 1000)
    for t in [0, *range(99, 1000, 100)]:
        stat.record(1.0, t)
    expected = [10.909, 10.842, 10.778, 10.722, 10.674, 10.632, 10.594, 10.561, 10.532, 10.505, 10.481]
    times = [1100, *range(1199, 2100, 100)]
    for t, rate in zip(times, expected, strict=True):
        stat.record(1.0, t)
        first = stat.measure(t)
        assert 10 <= first <= 11
        assert stat.measure(t) == first  # measuring twice at the same t gives the same value
        assert first == pytest.approx(rate, abs=5e-4)
        assert stat.window_size(t) == t


def test_metrics_test_rate_windowing_a6() -> None:
    stat = WindowedRate(3, 30_000)
    stat.record(100, 0)
    stat.record(100, 30_000)
    assert stat.window_size(75_000) == 75_000
    assert stat.measure(75_000) == pytest.approx(200 / 75)
    assert stat.measure(165_000) == 0


def test_metrics_test_time_windowing_a7() -> None:
    stat = WindowedRate(2, 1)  # counting events: each records 1
    stat.record(1, 0)
    stat.record(1, 1)
    assert stat.total(1) == 2
    stat.record(1, 2)
    assert stat.total(2) == 2  # the event at 0 aged out


def _complete_sample(stat: WindowedRate, start: int) -> int:
    """SampledStatTest.completeSample: events at start and start + 999; clock left at start + 1000."""
    stat.record(1, start)
    stat.record(1, start + 999)
    return start + 1000


# A8-A10: SampledStatTest. Its SampleCount stat counts live samples; a windowed count of the
# same events gives 2 per live complete sample, which pins the same purge/overlap rule.
def test_sampled_stat_test_sample_is_purged_if_it_does_not_overlap_a8() -> None:
    stat = WindowedRate(2, 1000)
    now = _complete_sample(stat, 0) + 2500
    assert stat.total(now) == 0


def test_sampled_stat_test_sample_is_kept_if_it_overlaps_a9() -> None:
    stat = WindowedRate(2, 1000)
    now = _complete_sample(stat, 0) + 1500
    assert stat.total(now) == 2
    assert stat.sample_count == 1


def test_sampled_stat_test_overlapping_extra_sample_is_kept_a10() -> None:
    stat = WindowedRate(2, 1000)
    now = _complete_sample(stat, 0) + 100
    now = _complete_sample(stat, now) + 100
    stat.record(1, now)
    # Kafka >= 3.8 keeps samples + 1 slots: all three samples count (the legacy ring gave 3 events).
    assert stat.total(now) == 5
    assert stat.sample_count == 3


def test_metrics_test_quotas_value_stays_recorded_after_a_violation_a11() -> None:
    stat = WindowedRate(11, 1000, bound=0.5)  # 5 per 10 s padded window
    assert stat.record_and_throttle(5, 0) == 0  # 0.5 <= 0.5: at the bound passes
    assert stat.record_and_throttle(1, 0) > 0
    assert stat.total(0) == 6  # the violating value is kept


# B: QuotaUtilsTest, with a fresh Rate (window size = (N - 1) x 1000 ms).
@pytest.mark.parametrize(
    ("observed", "bound", "samples", "expected"),
    [
        pytest.param(16.5, 16.5, 10, 0, id="B1-at-quota-N10"),
        pytest.param(16.5, 16.5, 11, 0, id="B1-at-quota-N11"),
        pytest.param(16.5, 20.4, 10, -1721, id="B2-below-quota-negative"),
        pytest.param(100, 50, 3, 2000, id="B3-worked-number"),
    ],
)
def test_quota_utils_test_throttle_time(observed: float, bound: float, samples: int, expected: int) -> None:
    window = WindowedRate(samples, 1000).window_size(0)
    assert window == (samples - 1) * 1000
    assert throttle_time(observed, bound, window) == expected


def test_quota_utils_unbounded_throttle_would_exceed_the_cap_b6() -> None:
    assert throttle_time(100, 50, 9000) == 9000


def test_throttle_time_with_a_zero_bound_saturates_like_java() -> None:
    assert throttle_time(1, 0, 1000) == LONG_MAX
    assert WindowedRate(2, 1000, bound=0.0).record_and_throttle(1, 0) == LONG_MAX


# C: TokenBucketTest — quota 5/s, W = 2 s, N = 10: burst 100.
def test_token_bucket_test_record_c1() -> None:
    bucket = TokenBucket(10, 2000, 5.0, now_ms=0)
    assert bucket.burst == 100
    assert bucket.measure(0) == 100
    bucket.record(60, 0)
    assert bucket.measure(0) == 40
    bucket.record(5, 2000)
    assert bucket.measure(2000) == 45
    bucket.record(60, 4000)
    assert bucket.measure(4000) == -5


def test_token_bucket_test_negative_record_is_capped_at_burst_c2() -> None:
    bucket = TokenBucket(10, 2000, 5.0, now_ms=0)
    bucket.record(-60, 0)
    assert bucket.measure(0) == 100
    bucket.record(60, 2000)
    assert bucket.measure(2000) == 40
    bucket.record(-60, 4000)
    assert bucket.measure(4000) == 100


def test_token_bucket_starts_full_with_a_clock_near_zero_c3() -> None:
    # Kafka's bucket relies on epoch milliseconds to fill on first use; ours starts full.
    bucket = TokenBucket(10, 2000, 5.0, now_ms=0)
    assert bucket.measure(0) == 100
    assert bucket.measure(1000) == 100


def test_token_bucket_peek_does_not_move_its_clock() -> None:
    bucket = TokenBucket(10, 1000, 10.0, now_ms=0)
    bucket.record(100, 0)
    assert bucket.peek(5000) == 50
    assert bucket.last_update_ms == 0
    assert bucket.measure(5000) == 50


@pytest.mark.parametrize(
    ("tokens", "rate", "throttle"),
    [
        pytest.param(0, 10, 0, id="F1-empty"),
        pytest.param(-5, 10, 500, id="F1-half"),
        pytest.param(-10, 10, 1000, id="F1-one-second"),
    ],
)
def test_controller_mutation_quota_manager_test_throttle_time_ms_f1(tokens: float, rate: float, throttle: int) -> None:
    assert token_bucket_throttle_time(tokens, rate) == throttle


def test_rate_peek_matches_measure_without_purging() -> None:
    stat = WindowedRate(11, 1000)
    for t in range(0, 20_000, 700):
        stat.record(t % 13, t)
    for now in (20_000, 25_000, 40_000):
        starts_before = list(stat._starts)
        peeked = stat.peek(now)
        assert list(stat._starts) == starts_before
        assert stat.measure(now) == pytest.approx(peeked)


# B1, B3, B5, B6 through the path the engine really takes (record_and_throttle, then the
# request quota's cap), not through the standalone helpers: a fresh Rate, W = 1 s, so the
# window is (N - 1) x 1000 ms and recording O x (N - 1) gives an observed rate of O.
@pytest.mark.parametrize(
    ("observed", "bound", "samples", "cap", "expected"),
    [
        (16.5, 16.5, 10, None, 0),  # B1: at the bound is not over it
        (100.0, 50.0, 3, None, 2000),  # B3: (100 - 50) / 50 x 2000
        (55.0, 50.0, 2, 500, 100),  # B5: (55 - 50) / 50 x 1000, under the cap
        (100.0, 50.0, 10, 500, 500),  # B6: 9000 unbounded, capped at 500
    ],
)
def test_quota_utils_vectors_on_the_hot_path(
    observed: float, bound: float, samples: int, cap: int | None, expected: int
) -> None:
    rate = WindowedRate(samples=samples, window_ms=1000, bound=bound)
    throttle = rate.record_and_throttle(observed * (samples - 1), 0)
    assert (throttle if cap is None else min(throttle, cap)) == expected


def test_recent_total_counts_what_was_recorded_over_the_span_not_since_the_oldest_sample() -> None:
    # A client sending 1,000,000 bytes every 2,200 ms (a large request each time it is unmuted):
    # Kafka's rate divides by the time since the oldest sample's start, which is a request's time,
    # and reads high; the bytes over the last 11 s are the requests inside them.
    rate = WindowedRate(samples=11, window_ms=1000)
    for t in range(0, 30_001, 2200):
        rate.record(1_000_000.0, t)
    now = 30_000
    inside = sum(1 for t in range(0, 30_001, 2200) if t >= now - 11_000)  # 19,800 ... 28,600: 5
    assert rate.recent_total(now, 11_000) == 1_000_000.0 * inside
    assert rate.peek(now) > rate.recent_total(now, 11_000) / 11  # Kafka's reading: over the carried rate


def test_recent_total_prorates_the_sample_that_straddles_the_span_start() -> None:
    # 100 bytes every 100 ms up to 19,500 ms. Over the last 11 s (from 8,500): the samples that
    # started at 9,000 ... 18,000 whole (1,000 bytes each), the one of 19,000 (600 bytes so far),
    # and of the one of 8,000 (events 8,000 ... 8,900) the share of its events' time after 8,500.
    rate = WindowedRate(samples=11, window_ms=1000)
    for t in range(0, 19_501, 100):
        rate.record(100.0, t)
    total = rate.recent_total(19_500, 11_000)
    assert total == pytest.approx(10 * 1000.0 + 600.0 + 1000.0 * (8900 - 8500) / 900)


# -- record_at: another fleet instance's usage, recorded late but dated when it happened -------


def test_a_value_dated_into_the_current_sample_leaves_the_window_a_window_after_its_date() -> None:
    # 11 samples of 1 s, as Kafka's quota window: a value keeps its sample until 11 s after its last event.
    stat = WindowedRate(11, 1000)
    stat.record(1, 0)
    stat.record_at(100, 300, 450)  # recorded at 300 by another instance, heard of here at 450
    assert stat.total(11_299) == 101
    assert stat.total(11_300) == 0
    # Recorded at its arrival instead, it would hold its sample 150 ms longer.
    late = WindowedRate(11, 1000)
    late.record(1, 0)
    late.record(100, 450)
    assert late.total(11_300) == 101


def test_a_value_dated_before_the_current_sample_goes_to_the_sample_it_was_recorded_in() -> None:
    stat = WindowedRate(11, 1000)
    stat.record(1, 0)
    stat.record(1, 1_000)  # a second sample starts at 1 s
    stat.record_at(100, 900, 1_050)
    # With the first sample, 11 s after 900; the second sample's own value stays until 12 s.
    assert stat.total(11_899) == 102
    assert stat.total(11_900) == 1


def test_a_value_dated_past_the_current_samples_span_starts_the_sample_it_would_have() -> None:
    stat = WindowedRate(11, 1000)
    stat.record(1, 0)
    stat.record_at(100, 1_200, 1_300)
    stat.record(1, 1_300)  # in the sample the dated value started at 1.2 s, not a new one
    assert stat.total(10_999) == 102
    assert stat.total(11_000) == 101
    # One sample, whose last event is the record at 1.3 s (apart, the dated value would go at 12.2 s).
    assert stat.total(12_299) == 101
    assert stat.total(12_300) == 0


def test_a_value_dated_now_or_later_or_into_an_empty_rate_is_recorded_now() -> None:
    stat = WindowedRate(11, 1000)
    stat.record_at(5, 900, 500)
    assert stat.total(11_499) == 5 and stat.total(11_500) == 0
    empty = WindowedRate(11, 1000)
    empty.record_at(5, 100, 500)  # the rate's first sample starts when it is created
    assert empty.total(11_499) == 5 and empty.total(11_500) == 0
