"""The `guard` section: off by default, validated with file, line, field and reason, shown by check-config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kqp.cli import main
from kqp.config import load_config
from kqp.config.errors import ConfigError
from kqp.quotas.fair_share import NW_IN, NW_OUT
from kqp.quotas.settings import QuotaEntity


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def capacity(tmp_path: Path) -> Path:
    # Broker 1 declares 1500 KB/s in and 3000 KB/s out; every other broker takes the -1 default.
    document = {"brokerCapacities": [
        {"brokerId": "-1", "capacity": {"DISK": "1000", "CPU": "100", "NW_IN": "1000", "NW_OUT": "2000"}},
        {"brokerId": "1", "capacity": {"DISK": "1000", "CPU": "100", "NW_IN": "1500", "NW_OUT": "3000"}},
    ]}
    return write(tmp_path, "capacity.json", json.dumps(document))


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config([write(tmp_path, "kqp.yaml", text)])
    return [str(problem) for problem in caught.value.problems]


def test_off_by_default(tmp_path: Path) -> None:
    guard = load_config([write(tmp_path, "kqp.yaml", "quotas: {}\n")]).guard
    assert guard.enabled is False
    assert guard.dry_run is False
    assert (guard.nw_in_threshold, guard.nw_out_threshold) == (0.8, 0.8)


def test_the_settings_of_the_control_step(tmp_path: Path) -> None:
    path = capacity(tmp_path)
    config = load_config([write(tmp_path, "kqp.yaml", (
        f"guard:\n  enabled: true\n  capacity_file: {path}\n  nw_in_threshold: 0.5\n  granularity: user\n"
        "  weights:\n    - entity: {user: etl}\n      weight: 2\n"
        "  protected:\n    - {user: replicator}\n  floor: 1024\n  replication_factor: 2\n"
    ))])
    settings = config.guard.settings([1, 2])
    # capacity (KB/s x 1024) x threshold: broker 1 from its own entry, broker 2 from the default.
    assert settings.limits == {
        (1, NW_IN): 1500 * 1024 * 0.5, (1, NW_OUT): 3000 * 1024 * 0.8,
        (2, NW_IN): 1000 * 1024 * 0.5, (2, NW_OUT): 2000 * 1024 * 0.8,
    }
    assert settings.weights == {QuotaEntity(user="etl"): 2.0}
    assert settings.protected == frozenset({QuotaEntity(user="replicator")})
    assert (settings.floor, settings.replication_factor) == (1024, 2)


def test_enabled_without_a_capacity_file_names_the_field(tmp_path: Path) -> None:
    found = problems(tmp_path, "guard:\n  enabled: true\n")
    assert len(found) == 1
    assert "kqp.yaml" in found[0]
    assert "guard.capacity_file: the guard needs capacity_file" in found[0]


def test_guard_fleet_wide_needs_the_fleet_section(tmp_path: Path) -> None:
    path = capacity(tmp_path)
    found = problems(tmp_path, f"guard:\n  enabled: true\n  capacity_file: {path}\n  fleet_wide: true\n")
    assert len(found) == 1
    assert "kqp.yaml" in found[0]
    assert "guard.fleet_wide: guard.fleet_wide shares the guard's measurements over the fleet exchange" in found[0]
    config = load_config([write(tmp_path, "kqp.yaml", (
        f"guard:\n  enabled: true\n  capacity_file: {path}\n  fleet_wide: true\nfleet:\n  enabled: true\n"))])
    assert config.guard.fleet_wide and config.fleet.enabled


def test_a_capacity_file_that_is_not_cruise_controls(tmp_path: Path) -> None:
    bad = write(tmp_path, "capacity.json", json.dumps({"brokers": []}))
    found = problems(tmp_path, f"guard:\n  enabled: true\n  capacity_file: {bad}\n")
    assert len(found) == 1
    assert "kqp.yaml:3:3: guard.capacity_file:" in found[0]
    assert "is not a Cruise Control capacity file: expected a non-empty 'brokerCapacities' list" in found[0]


def test_a_missing_capacity_file(tmp_path: Path) -> None:
    found = problems(tmp_path, f"guard:\n  enabled: true\n  capacity_file: {tmp_path / 'nope.json'}\n")
    assert len(found) == 1
    assert "guard.capacity_file: cannot read" in found[0]


def test_entities_must_have_the_granularitys_keys(tmp_path: Path) -> None:
    found = problems(tmp_path, (
        "guard:\n  granularity: client-id\n  weights:\n    - entity: {user: etl}\n      weight: 2\n"
    ))
    assert len(found) == 1
    assert "guard.weights[0].entity: the guard's entities are client-id" in found[0]
    assert "got user" in found[0]


def test_bad_values_are_refused_with_their_field(tmp_path: Path) -> None:
    found = problems(tmp_path, "guard:\n  nw_in_threshold: 1.5\n  interval_seconds: 0\n  granularity: topic\n")
    joined = "\n".join(found)
    assert "guard.nw_in_threshold: expected a value less than or equal to 1" in joined
    assert "guard.interval_seconds: expected a value greater than or equal to 0.1" in joined
    assert "guard.granularity:" in joined


def test_check_config_shows_the_guard(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = capacity(tmp_path)
    config = write(tmp_path, "kqp.yaml", (
        f"guard:\n  enabled: true\n  dry_run: true\n  capacity_file: {path}\n"
        "  protected:\n    - {client-id: replicator}\n"
    ))
    assert main(["check-config", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("Guard: DRY RUN") and "per client-id" in line for line in lines)
    rows = [line.split() for line in lines if line.strip().startswith(("1 ", "every other"))]
    # 1500 KB/s x 0.8 = 1228800 B/s; 3000 KB/s x 0.8 = 2457600 B/s.
    assert rows[0][:2] == ["1", "1228800"]
    assert "2457600" in rows[0]
    assert rows[1][:3] == ["every", "other", "819200"]
    assert "  protected (never limited): client-id=replicator" in lines
