"""guard.fleet_wide through the fleet exchange (kqp.proxy.fleet): another instance's guard deltas go into
this instance's guard sensors, its own echo and a proxy without the guard add nothing."""

from __future__ import annotations

from kqp.proxy.fleet import FleetExchange, FleetOptions
from kqp.quotas import QuotaEngine, QuotaSettings
from kqp.quotas.fleet import GuardDelta, UsageReport, encode_report

TAGS = (("user", ""), ("client-id", "app"))


# One instant for the whole test: the rate below is exact only if nothing ticks between the
# records and the measurement (on the real clock a millisecond boundary made it 10.001 s).
NOW_MS = 5_000_000.0


def now_ms() -> float:
    return NOW_MS


def guard_report(instance: str, amount: float) -> bytes:
    return encode_report(UsageReport(instance, 1, (), (GuardDelta("producer_byte_rate", "1", TAGS, amount, 1),)))


def exchange_for(engine: QuotaEngine, same_host: set[str] | None = None) -> FleetExchange:
    options = FleetOptions.model_validate({"bootstrap_servers": ("k:9092",), "instance_id": "me"})
    return FleetExchange(options, engine, now_ms, lambda: 11_000.0,
                         same_host=(lambda instance: instance in same_host) if same_host is not None else None)


def test_others_guard_deltas_count_in_this_instances_guard_sensors_and_its_own_echo_does_not() -> None:
    engine = QuotaEngine(QuotaSettings())
    engine.set_guard("client-id")
    exchange = exchange_for(engine, same_host={"sibling"})
    for instance, amount in (("other", 300_000.0), ("sibling", 200_000.0), ("me", 1_000_000.0)):
        exchange._apply(guard_report(instance, amount), "me", now_ms())
    assert engine.guard is not None
    [flow] = engine.guard.measured(int(now_ms()))
    # The other host's and the sibling's (the host's relay does not carry the guard's), not its own.
    assert flow.rates[1] * 10 == 500_000.0  # bytes over Kafka's shortest elapsed window, 10 s
    assert flow.throttled


def test_without_the_guard_the_deltas_are_ignored() -> None:
    engine = QuotaEngine(QuotaSettings())
    exchange_for(engine)._apply(guard_report("other", 300_000.0), "me", now_ms())
    assert engine.guard is None
