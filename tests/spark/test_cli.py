"""`kqp replay ...` end to end: the exit code gates CI on a budget, and the outputs land on disk."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kqp.cli import main as kqp_main
from tests.spark.helpers import QUOTAS_YAML

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def keep_test_shuffle_partitions(spark: Any) -> Iterator[None]:
    """The jobs' own session settings apply to the shared test session; undo them after."""
    before = spark.conf.get("spark.sql.shuffle.partitions")
    yield
    spark.conf.set("spark.sql.shuffle.partitions", before)


def test_whatif_exit_code_follows_the_throttled_share_budget(spark: Any, capture_dir: Path, tmp_path: Path) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(QUOTAS_YAML)
    common = ["replay", "whatif", str(capture_dir), "--quotas", str(quotas), "--master", "local[2]"]
    strict = kqp_main([*common, "--output", str(tmp_path / "strict"), "--budget-max-throttled-share", "0.0"])
    lenient = kqp_main([*common, "--output", str(tmp_path / "lenient"), "--budget-max-throttled-share", "1.0"])
    assert (strict, lenient) == (3, 0)
    summary = json.loads((tmp_path / "strict" / "summary.json").read_text())
    throttled = [c for c in summary["top_clients"] if c["throttled_share"] > 0]
    assert len(summary["budget"]["violations"]) == len(throttled) > 0
    assert (tmp_path / "lenient" / "report.html").exists()


def test_analyze_exit_code_follows_the_runway_budget(spark: Any, capture_dir: Path, tmp_path: Path) -> None:
    code = kqp_main(
        [
            "replay",
            "analyze",
            str(capture_dir),
            "--output",
            str(tmp_path),
            "--capacity",
            str(REPO / "config" / "capacity.json"),
            "--budget-min-runway-months",
            "1000",
            "--master",
            "local[2]",
        ]
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert code == 3
    assert summary["headroom"]["runway_months"] < 1000
    assert summary["budget"]["violations"]
