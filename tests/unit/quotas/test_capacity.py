"""Capacity arithmetic (pure, no Spark)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kqp.config.capacity_file import load_capacity
from kqp.quotas import capacity as cap

REPO = Path(__file__).resolve().parents[3]


def test_example_capacity_file_parses_in_cruise_control_units() -> None:
    parsed = load_capacity(REPO / "config" / "capacity.json")
    assert parsed.for_broker(0).nw_in_bytes_per_s == 12_500 * 1024
    assert parsed.for_broker(7).nw_out_bytes_per_s == 10_000 * 1024  # from the -1 default
    assert parsed.for_broker(7).disk_mb == 500_000


def test_jbod_and_cores_variants_and_missing_default() -> None:
    document = {
        "brokerCapacities": [
            {
                "brokerId": "1",
                "capacity": {
                    "DISK": {"/d1": "1000", "/d2": "3000"},
                    "CPU": {"num.cores": "16"},
                    "NW_IN": "100",
                    "NW_OUT": "200",
                },
            }
        ]
    }
    parsed = cap.parse_capacity(json.loads(json.dumps(document)))
    assert parsed.for_broker(1).disk_mb == 4000
    assert parsed.for_broker(1).cpu == 16
    with pytest.raises(cap.CapacityFileError, match="broker 2"):
        parsed.for_broker(2)
    with pytest.raises(cap.CapacityFileError, match="NW_OUT"):
        cap.parse_capacity({"brokerCapacities": [{"brokerId": "-1", "capacity": {"NW_IN": "1"}}]})


def test_runway_months_is_compound_growth_to_the_limit() -> None:
    assert cap.runway_months(100.0, 200.0, 2.0) == pytest.approx(1.0)
    assert cap.runway_months(100.0, 121.0, 1.1) == pytest.approx(2.0)
    assert cap.runway_months(300.0, 200.0, 1.1) == 0.0
    assert cap.runway_months(100.0, 200.0, 1.0) is None


def test_headroom_and_binding_constraint() -> None:
    capacity = cap.CapacityFile(
        brokers={}, default=cap.BrokerCapacity(broker_id=-1, nw_in_bytes_per_s=1000.0, nw_out_bytes_per_s=2000.0)
    )
    thresholds = {cap.NW_IN: 0.8, cap.NW_OUT: 0.8}
    rows = cap.headroom(
        [(1, cap.NW_IN, 400.0), (1, cap.NW_OUT, 1200.0), (2, cap.NW_IN, 0.0)], capacity, thresholds, 1.1
    )
    assert rows[0].utilisation == pytest.approx(0.4)
    assert rows[0].growth_to_limit == pytest.approx(2.0)
    assert rows[1].headroom_bytes_per_s == pytest.approx(400.0)
    assert math.isinf(rows[2].growth_to_limit) and rows[2].as_dict()["growth_to_limit"] is None
    binding = cap.binding_constraint(rows)
    assert binding is not None and (binding.broker, binding.resource) == (1, cap.NW_OUT)


def test_brokers_needed_at_a_target_utilisation() -> None:
    capacity = {cap.NW_IN: 100.0, cap.NW_OUT: 200.0}
    # NW_IN binds: 250 / (100 x 0.5) = 5 brokers; NW_OUT would need 3.
    assert cap.brokers_needed({cap.NW_IN: 250.0, cap.NW_OUT: 300.0}, capacity, 0.5) == 5
    assert cap.brokers_needed({cap.NW_IN: 251.0, cap.NW_OUT: 0.0}, capacity, 0.5) == 6
    # Never fewer than the replication factor.
    assert cap.brokers_needed({cap.NW_IN: 1.0, cap.NW_OUT: 1.0}, capacity, 0.5, minimum=3) == 3
