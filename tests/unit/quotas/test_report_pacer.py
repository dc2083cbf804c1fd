"""How often a fleet instance reports its usage (kqp.quotas.fleet.ReportPacer): the configured
interval, or twice the round trip of its own reports through the topic when that is longer."""

from __future__ import annotations

from kqp.config.models import FleetSection
from kqp.quotas.fleet import ReportPacer, longest_silence_s

DEFAULTS = FleetSection()


def default_pacer() -> ReportPacer:
    return ReportPacer.for_settings(DEFAULTS.report_interval_seconds, DEFAULTS.unreachable_after_seconds)


def round_trips(pacer: ReportPacer, *milliseconds: float, first_seq: int = 1, at_ms: float = 0.0) -> float:
    """Send one report per round trip given, each seen back that much later; the time after the last."""
    for seq, round_trip in enumerate(milliseconds, first_seq):
        pacer.sent(seq, at_ms)
        at_ms += round_trip
        pacer.echoed(seq, at_ms)
    return at_ms


def test_the_configured_interval_until_a_report_comes_back() -> None:
    pacer = default_pacer()
    assert pacer.interval_ms == 50.0 and pacer.round_trip_ms is None
    pacer.sent(1, 0.0)
    assert pacer.interval_ms == 50.0


def test_a_fast_topic_keeps_the_configured_interval() -> None:
    pacer = default_pacer()
    round_trips(pacer, 2.0, 3.0, 24.9)
    assert pacer.round_trip_ms == 24.9
    assert pacer.interval_ms == 50.0


def test_a_slow_topic_lengthens_the_interval_to_twice_its_round_trip() -> None:
    # Finding f's exchange: a 500 ms round trip against 50 ms reports would have ten of them crossing at once.
    pacer = default_pacer()
    round_trips(pacer, 10.0, 400.0, 30.0)
    assert pacer.interval_ms == 800.0
    round_trips(pacer, 500.0, first_seq=4)
    assert pacer.interval_ms == 1000.0


def test_never_longer_than_an_instance_may_stay_silent() -> None:
    # Its own echo keeps it out of the fallback only if it reports at least every third of unreachable_after.
    pacer = default_pacer()
    round_trips(pacer, 2_000.0)
    assert pacer.interval_ms == longest_silence_s(DEFAULTS.unreachable_after_seconds) * 1000.0 == 1000.0
    short = ReportPacer.for_settings(0.05, unreachable_after_s=0.9)
    round_trips(short, 2_000.0)
    assert short.interval_ms == 300.0
    # A configured interval longer than that is the operator's choice, kept.
    slow = ReportPacer.for_settings(2.0, DEFAULTS.unreachable_after_seconds)
    round_trips(slow, 5.0)
    assert slow.interval_ms == 2000.0


def test_a_slow_round_trip_counts_for_the_next_16_reports() -> None:
    pacer = default_pacer()
    at = round_trips(pacer, 300.0)
    at = round_trips(pacer, *[5.0] * 15, first_seq=2, at_ms=at)
    assert pacer.interval_ms == 600.0
    round_trips(pacer, 5.0, first_seq=17, at_ms=at)
    assert pacer.interval_ms == 50.0


def test_lost_and_foreign_reports() -> None:
    pacer = default_pacer()
    for seq in (1, 2, 3):
        pacer.sent(seq, seq * 50.0)
    # Report 1 never comes back: 3's echo says the topic's order has passed it.
    pacer.echoed(3, 150.0 + 120.0)
    assert pacer.round_trip_ms == 120.0
    pacer.echoed(2, 400.0)  # forgotten with 1 when 3 came back (a duplicate, say)
    pacer.echoed(99, 400.0)  # never sent by this process (its previous life's, under the same name)
    assert pacer.round_trip_ms == 120.0 and pacer.interval_ms == 240.0


def test_reports_that_never_come_back_are_not_kept_for_ever() -> None:
    pacer = default_pacer()
    for seq in range(1, 10_001):
        pacer.sent(seq, float(seq))
    pacer.echoed(1, 10_000.0)  # long forgotten
    assert pacer.round_trip_ms is None
    pacer.echoed(10_000, 10_030.0)
    assert pacer.round_trip_ms == 30.0


def test_the_others_reports_are_dated_by_the_shortest_round_trip_kept() -> None:
    # The shortest: another instance's usage is never dated earlier than it happened.
    pacer = default_pacer()
    assert pacer.least_round_trip_ms == 0.0
    round_trips(pacer, 40.0, 25.0, 60.0)
    assert pacer.least_round_trip_ms == 25.0
    round_trips(pacer, *[70.0] * 16, first_seq=4)  # 25 ms is no longer among the last 16
    assert pacer.least_round_trip_ms == 70.0
