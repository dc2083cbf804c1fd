"""kqp.spark_jobs.replay_partials: a replay task's partial sums, checked by hand on a few rows.

The Spark side (merging the parts into whatif's and advise's tables, the same as from the rows)
is tests/spark/test_whatif.py::test_partial_sums_give_the_tables_the_rows_give.
"""

from __future__ import annotations

import pandas as pd

from kqp.spark_jobs.replay_partials import PARTIAL_COLUMNS, task_partials

PRODUCE, FETCH, METADATA = 0, 1, 3


def replayed(rows: list[tuple[str, int, int, int, int, float, float]]) -> pd.DataFrame:
    """Rows as a replay task returns them: (client-id, API, ts_ms, sim_ts_ms, nbytes, throttle, recorded throttle)."""
    return pd.DataFrame(
        {
            "ts_ms": [r[2] for r in rows],
            "connection_id": 1,
            "broker": 0,
            "principal": "User:a",
            "client_id": [r[0] for r in rows],
            "api_key": [r[1] for r in rows],
            "nbytes": [r[4] for r in rows],
            "request_time_ms": float("nan"),
            "recorded_throttle_ms": [r[6] for r in rows],
            "quota_group": 0,
            "sim_ts_ms": [r[3] for r in rows],
            "sim_throttle_ms": [r[5] for r in rows],
        }
    )


ROWS = [
    # client, API, recorded ms, simulated ms, bytes, throttle, recorded throttle
    ("x", PRODUCE, 1_000, 1_000, 100, 30.0, 30.0),
    ("x", PRODUCE, 1_500, 1_530, 200, 0.0, 0.0),  # queued behind the throttled one: delayed, not throttled
    ("x", FETCH, 2_900, 3_100, 50, 30.0, 0.0),  # moved from second 2 to 3
    ("x", METADATA, 3_000, 3_000, 0, 0.0, 5.0),
    ("y", PRODUCE, 1_200, 1_200, 70, 0.0, 0.0),
]


def part(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    return frame[frame["part"] == name].reset_index(drop=True)


def test_per_client_sums_and_throttle_counts() -> None:
    partials = task_partials(replayed(ROWS), peaks=False, moved_unit=None)
    assert list(partials.columns) == list(PARTIAL_COLUMNS)
    assert set(partials["part"]) == {"client", "throttle"}
    x = part(partials, "client").set_index("client_id").loc["x"]
    assert (x["requests"], x["throttled"], x["throttle_ms"], x["throttle_ms_max"]) == (4, 2, 60.0, 30.0)
    assert (x["bytes"], x["bytes_delayed"]) == (350, 100 + 200 + 50)
    assert (x["first_ms"], x["last_ms"], x["max_shift_ms"]) == (1_000, 3_100, 200)
    # Agreement: the first Produce (both throttled) and the second (neither); not the Fetch nor Metadata.
    assert (x["recorded_throttled"], x["agreeing"], x["recorded_throttle_ms"]) == (2, 2, 35.0)
    assert (x["abs_error_ms"], x["abs_error_ms_max"]) == (35.0, 30.0)
    counts = part(partials, "throttle").set_index(["client_id", "throttle_ms"])["requests"].to_dict()
    assert counts == {("x", 30.0): 2, ("x", 0.0): 2, ("y", 0.0): 1}


def test_bytes_per_second_and_moved_between_buckets() -> None:
    partials = task_partials(replayed(ROWS), peaks=True, moved_unit=1)
    recorded = part(partials, "recorded_second").set_index(["api_key", "bucket"])["bytes"].to_dict()
    simulated = part(partials, "simulated_second").set_index(["api_key", "bucket"])["bytes"].to_dict()
    # Metadata carries no bytes the brokers' network series count.
    assert recorded == {(PRODUCE, 1): 370, (FETCH, 2): 50}
    assert simulated == {(PRODUCE, 1): 370, (FETCH, 3): 50}
    moved_out = part(partials, "moved_out").set_index(["api_key", "bucket"])["moved_out"].to_dict()
    moved_in = part(partials, "moved_in").set_index(["api_key", "bucket"])
    assert moved_out == {(FETCH, 2): 50}
    assert moved_in[["moved_in", "requests", "last_second"]].to_dict("index") == {
        (FETCH, 3): {"moved_in": 50, "requests": 1, "last_second": 3}
    }
    # At 2 s buckets the Fetch stays in bucket 1: nothing moved.
    assert set(task_partials(replayed(ROWS), peaks=False, moved_unit=2)["part"]) == {"client", "throttle"}


def test_an_empty_batch_gives_no_parts() -> None:
    partials = task_partials(replayed(ROWS).iloc[:0], peaks=True, moved_unit=1)
    assert partials.empty and list(partials.columns) == list(PARTIAL_COLUMNS)
