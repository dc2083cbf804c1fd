"""live: the schedule and dry-run figures (the send path needs a broker: integration later)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from kqp.spark_jobs.capture_source import read_capture
from kqp.spark_jobs.live import dry_run_figures, schedule
from tests.spark.conftest import exploded

pytestmark = pytest.mark.spark


def test_dry_run_figures_scale_with_speedup_and_copies(
    spark: Any, capture_dir: Path, capture_rows: pd.DataFrame
) -> None:
    entries = schedule(read_capture(spark, str(capture_dir)), speedup=2.0, copies=3)
    figures = dry_run_figures(entries)
    produce = capture_rows[capture_rows["api_key"] == 0]
    parts = exploded(capture_rows)
    produce_parts = parts[parts["api_key"] == 0]
    span_ms = (produce["ts_request_received_us"].max() - produce["ts_request_received_us"].min()) / 1000.0
    assert figures["duration_s"] == pytest.approx(span_ms / 2 / 1000.0)
    assert figures["bytes"] == 3 * produce_parts["bytes"].sum()
    assert figures["batches"] == 3 * len(produce_parts)
    assert figures["requests"] == 3 * len(produce)
    offset_s = (produce_parts["ts_request_received_us"] - produce["ts_request_received_us"].min()) / 1e6 / 2
    peak = produce_parts.groupby(offset_s.astype(int))["bytes"].sum().max() * 3
    assert figures["peak_bytes_per_s"] == peak
