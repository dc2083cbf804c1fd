"""whatif's Spark glue (grouping, ordering, aggregation) with a deterministic throttle function.

The quota arithmetic itself belongs to kqp.quotas and is tested there; here a simple
throttle rule stands in for it so the figures can be recomputed with pandas.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle

from kqp.spark_jobs.capture_source import read_capture
from kqp.spark_jobs.whatif import broker_peaks, calibration, client_outcomes, prepare_requests, simulate

pytestmark = pytest.mark.spark
# Executors cannot import the tests package: ship this module's functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

THROTTLED_CLIENT = "app-0"
THROTTLE_MS = 40.0


def every_produce_of_one_client():  # type: ignore[no-untyped-def]
    def throttle(api_key, broker, principal, client_id, nbytes, request_ms, now_ms):  # type: ignore[no-untyped-def]
        return THROTTLE_MS if api_key == 0 and client_id == THROTTLED_CLIENT else 0.0

    return throttle


@pytest.fixture(scope="module")
def simulated(spark: Any, capture_dir: Path) -> pd.DataFrame:
    requests = prepare_requests(read_capture(spark, str(capture_dir)))
    frame = simulate(spark, requests, every_produce_of_one_client, "open_loop")
    return frame


def test_open_loop_outcomes_per_client(simulated: Any, capture_rows: pd.DataFrame) -> None:
    clients = client_outcomes(simulated).toPandas().set_index("client_id")
    produce = capture_rows[(capture_rows["client_id"] == THROTTLED_CLIENT) & (capture_rows["api_key"] == 0)]
    row = clients.loc[THROTTLED_CLIENT]
    assert row["throttled_requests"] == len(produce)
    assert row["throttle_ms_total"] == len(produce) * THROTTLE_MS
    assert row["bytes_delayed"] == (produce["request_bytes"] - 4).sum()
    assert row["requests"] == (capture_rows["client_id"] == THROTTLED_CLIENT).sum()
    assert clients.drop(index=THROTTLED_CLIENT)["throttled_requests"].sum() == 0


def test_calibration_against_recorded_throttles(simulated: Any, capture_rows: pd.DataFrame) -> None:
    table = calibration(simulated).toPandas().set_index("client_id")
    recorded = capture_rows.groupby("client_id")["proxy_throttle_ms"].sum()
    assert table["recorded_throttle_ms_total"].to_dict() == pytest.approx(recorded.astype(float).to_dict())
    expected_agreement = {
        client: ((rows["api_key"] == 0) & (client == THROTTLED_CLIENT)).eq(rows["proxy_throttle_ms"] > 0).sum()
        for client, rows in capture_rows.groupby("client_id")
    }
    assert table["agreeing_requests"].to_dict() == expected_agreement


def test_deferral_moves_throttled_traffic_later(spark: Any, capture_dir: Path, capture_rows: pd.DataFrame) -> None:
    requests = prepare_requests(read_capture(spark, str(capture_dir)))
    deferred = simulate(spark, requests, every_produce_of_one_client, "deferral")
    shifts = deferred.where("client_id = 'app-0'").selectExpr("max(sim_ts_ms - ts_ms) as shift").first()
    others = deferred.where("client_id != 'app-0'").selectExpr("max(abs(sim_ts_ms - ts_ms)) as shift").first()
    produce_per_connection = capture_rows[capture_rows["client_id"] == THROTTLED_CLIENT].groupby("connection_id").size()
    assert shifts is not None and others is not None
    # Every produce of app-0 adds 40 ms, so the last request of a busy connection moves by a lot.
    assert shifts["shift"] >= THROTTLE_MS
    assert shifts["shift"] <= THROTTLE_MS * produce_per_connection.max()
    assert others["shift"] == 0
    peaks = broker_peaks(deferred).toPandas()
    assert (peaks["simulated_peak_bytes_per_s"] > 0).all()
