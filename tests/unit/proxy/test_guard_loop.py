"""The cluster guard's control loop (kqp/proxy/guard.py) on the engine's own measurements, virtual time."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from kqp.config.quota_sections import GuardSection
from kqp.proxy.guard import GuardLoop
from kqp.proxy.metrics import ProxyMetrics
from kqp.quotas import QuotaEngine, QuotaEntity, QuotaSettings
from kqp.quotas.fair_share import PRODUCE

# One broker, NW_IN 1500 KB/s: the limit is 1500 x 1024 x 0.8 = 1,228,800 B/s.
LIMIT = 1500 * 1024 * 0.8
QUIET, NOISY = 102_400, 819_200  # B/s offered
# 3 x QUIET + 2 x L = LIMIT
FAIR = (LIMIT - 3 * QUIET) / 2


class Clock:
    def __init__(self) -> None:
        self.ms = 0.0

    def __call__(self) -> float:
        return self.ms


def section(tmp_path: Path, dry_run: bool = False) -> GuardSection:
    path = tmp_path / "capacity.json"
    path.write_text(json.dumps({"brokerCapacities": [
        {"brokerId": "-1", "capacity": {"DISK": "1", "CPU": "100", "NW_IN": "1500", "NW_OUT": "100000"}},
    ]}))
    return GuardSection(enabled=True, capacity_file=str(path), replication_factor=1, dry_run=dry_run)


def offer(engine: QuotaEngine, clock: Clock, seconds: float, rates: dict[str, float]) -> int:
    """Every client sends its rate in produces every 100 ms; returns the throttles' total (ms)."""
    throttled = 0
    for _ in range(int(seconds * 10)):
        for name, rate in rates.items():
            throttled += engine.record_produce("1", "", name, int(rate / 10), clock.ms)
        clock.ms += 100
    return throttled


def rates() -> dict[str, float]:
    return {"q1": QUIET, "q2": QUIET, "q3": QUIET, "n1": NOISY, "n2": NOISY}


def test_the_loop_engages_limits_the_noisy_and_logs_them(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock, engine, metrics = Clock(), QuotaEngine(QuotaSettings()), ProxyMetrics()
    loop = GuardLoop(engine, section(tmp_path), lambda: [1], clock, metrics)
    offer(engine, clock, 11, rates())
    with caplog.at_level(logging.INFO, logger="kqp.guard"):
        decision = loop.tick()
    assert decision.resources[0].load == pytest.approx(3 * QUIET + 2 * NOISY, rel=0.01)
    # The target is the fair share; a new limit starts at the flow's rate less 10 % and falls from there.
    n1 = next(f for f in decision.flows if f.entity == QuotaEntity(client_id="n1"))
    assert n1.target == pytest.approx(FAIR, rel=0.01)
    first = decision.limits[(QuotaEntity(client_id="n1"), PRODUCE)]
    assert first == pytest.approx(0.9 * NOISY, rel=0.01)
    assert (QuotaEntity(client_id="q1"), PRODUCE) not in decision.limits
    assert "guard engaged on broker 1 NW_IN" in caplog.text
    assert "client-id=n1 producer_byte_rate" in caplog.text
    assert "client-id=q1" not in caplog.text
    sample = metrics.registry.get_sample_value
    assert sample("kqp_guard_active", {"broker": "1", "resource": "NW_IN"}) == 1
    assert sample("kqp_guard_limit_bytes_per_second", {"broker": "1", "resource": "NW_IN"}) == pytest.approx(LIMIT)
    assert sample("kqp_guard_entity_limit_bytes_per_second",
                  {"entity": "client-id=n1", "quota_type": "producer_byte_rate", "dry_run": "false"}
                  ) == pytest.approx(first)
    # The engine now throttles the noisy producers and not the quiet ones.
    assert offer(engine, clock, 1, {"n1": NOISY}) > 0
    assert offer(engine, clock, 1, {"q1": QUIET}) == 0


def test_dry_run_reports_the_limits_and_throttles_nothing(tmp_path: Path) -> None:
    clock, engine, metrics = Clock(), QuotaEngine(QuotaSettings()), ProxyMetrics()
    loop = GuardLoop(engine, section(tmp_path, dry_run=True), lambda: [1], clock, metrics)
    offer(engine, clock, 11, rates())
    decision = loop.tick()
    limit = decision.limits[(QuotaEntity(client_id="n2"), PRODUCE)]
    assert limit == pytest.approx(0.9 * NOISY, rel=0.01)  # falling to the fair share by 10 % a second
    assert metrics.registry.get_sample_value(
        "kqp_guard_entity_limit_bytes_per_second",
        {"entity": "client-id=n2", "quota_type": "producer_byte_rate", "dry_run": "true"},
    ) == pytest.approx(limit)
    assert offer(engine, clock, 5, rates()) == 0


def test_releases_when_the_noisy_stop_and_closing_drops_the_guard(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    clock, engine = Clock(), QuotaEngine(QuotaSettings())
    loop = GuardLoop(engine, section(tmp_path), lambda: [1], clock)
    offer(engine, clock, 11, rates())
    loop.tick()
    # The noisy ones stop; after a quota window the load is the quiet ones' alone.
    offer(engine, clock, 12, {"q1": QUIET, "q2": QUIET, "q3": QUIET})
    with caplog.at_level(logging.INFO, logger="kqp.guard"):
        decision = loop.tick()
    assert decision.released_now == [(1, "NW_IN")]
    assert decision.limits == {}
    assert "guard released broker 1 NW_IN" in caplog.text
    loop.close()
    assert engine.guard is None


def test_the_loop_reads_no_file_at_its_steps_the_capacity_is_read_at_load(tmp_path: Path) -> None:
    # The section read the capacity file when it was validated (at start or reload); the steps,
    # on the event loop, use that. With the file gone, a step that meets a broker it had not
    # seen (which recomputes the limits) still finds that broker's limit.
    clock, engine = Clock(), QuotaEngine(QuotaSettings())
    brokers = [1]
    loop = GuardLoop(engine, section(tmp_path), lambda: brokers, clock)
    (tmp_path / "capacity.json").unlink()
    offer(engine, clock, 11, rates())
    loop.tick()
    brokers.append(2)
    decision = loop.tick()
    assert {(r.broker, r.resource) for r in decision.resources} >= {(1, "NW_IN"), (2, "NW_IN")}
    n1 = next(f for f in decision.flows if f.entity == QuotaEntity(client_id="n1"))
    assert n1.target == pytest.approx(FAIR, rel=0.01)
