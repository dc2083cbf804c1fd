"""The fleet exchange paces its reports by its own reports' round trip through the topic
(kqp.proxy.fleet.FleetExchange with kqp.quotas.fleet.ReportPacer)."""

from __future__ import annotations

from kqp.proxy.fleet import FleetExchange, FleetOptions
from kqp.quotas import QuotaEngine, QuotaSettings
from kqp.quotas.fleet import UsageReport, encode_report


def test_its_own_reports_coming_back_set_the_interval_and_the_others_do_not() -> None:
    clock = [1_000.0]
    options = FleetOptions.model_validate({"bootstrap_servers": ("k:9092",), "instance_id": "me"})
    exchange = FleetExchange(options, QuotaEngine(QuotaSettings()), lambda: clock[0], lambda: 11_000.0)
    assert exchange.pacer.interval_ms == options.report_interval_seconds * 1000.0 == 50.0
    exchange.pacer.sent(7, 1_000.0)
    exchange._apply(encode_report(UsageReport("other", 7)), "me", 1_450.0)
    assert exchange.pacer.round_trip_ms is None
    exchange._apply(encode_report(UsageReport("me", 7)), "me", 1_450.0)
    assert exchange.pacer.round_trip_ms == 450.0
    assert exchange.pacer.interval_ms == 900.0
