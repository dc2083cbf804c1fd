"""analyze's driver-side series and statistics (kqp/spark_jobs/analyze_tables.py) on cases
worked out by hand; the Spark test (tests/spark/test_analyze.py) checks them on a capture."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kqp.spark_jobs.analyze_tables import (
    PARTITION_SECOND_SET,
    PRODUCE_BATCH_SET,
    PRODUCE_REQUEST_SET,
    broker_second_totals,
    bucket_connections,
    bucket_series,
    client_burstiness,
    client_totals,
    counted_percentiles,
    exact_percentiles,
    latency_by_api,
    partition_totals,
    produce_batches_by_client,
    series_stats,
    traffic_coverage,
    with_replication,
    without_broker,
)


def test_exact_percentiles_interpolate_between_order_statistics_as_spark_does() -> None:
    # Spark's documented examples: percentile(col, 0.3) over (0), (10) is 3.0; 0.25 / 0.75 give 2.5 / 7.5.
    assert exact_percentiles(np.array([10.0, 0.0]), [0.3, 0.25, 0.75]) == [3.0, 2.5, 7.5]
    # Position (n - 1) x p: 4 values at p = 0.5 sit halfway between the 2nd and 3rd smallest.
    assert exact_percentiles(np.array([4.0, 1.0, 3.0, 2.0]), [0.5, 0.0, 1.0]) == [2.5, 1.0, 4.0]
    # Equal neighbours need no interpolation; one value is every percentile.
    assert exact_percentiles(np.array([5.0, 5.0, 9.0]), [0.25]) == [5.0]
    assert exact_percentiles(np.array([7.0]), [0.5, 0.99]) == [7.0, 7.0]


def test_counted_percentiles_are_those_of_the_values_repeated() -> None:
    rng = np.random.default_rng(7)
    frames = []
    for key in ("a", "b", "c"):
        values, counts = np.unique(rng.integers(0, 40, rng.integers(1, 300)) * 1.37, return_counts=True)
        frames.append(pd.DataFrame({"key": key, "value": values, "n": counts}))
    # A key whose values are all unknown has no percentile, as Spark's percentile skips nulls.
    frames.append(pd.DataFrame({"key": ["d"], "value": [np.nan], "n": [3]}))
    counted = pd.concat(frames).sample(frac=1, random_state=1)
    percentages = [0.0, 0.5, 0.95, 0.999, 1.0]
    result = counted_percentiles(counted, "key", percentages)
    assert sorted(result.index) == ["a", "b", "c"]
    for key, rows in counted[counted["key"] != "d"].groupby("key"):
        repeated = np.repeat(rows["value"].to_numpy(), rows["n"].to_numpy())
        assert list(result.loc[key]) == exact_percentiles(repeated, percentages)


def test_latency_percentiles_per_broker_and_api_from_the_counts() -> None:
    # latency_counts' rows: (API, broker, latency, broker round trip, requests); a row has one
    # of the two latencies, and a request answered without a round trip has neither.
    counts = pd.DataFrame(
        [
            (0, 1, 2.0, None, 3),
            (0, 1, 6.0, None, 1),
            (0, 1, None, 1.5, 4),
            (0, 2, 4.0, None, 2),
            (0, 2, None, 3.0, 1),
            (0, 2, None, None, 1),
        ],
        columns=["api_key", "broker", "latency_ms", "broker_latency_ms", "n"],
    ).astype({"api_key": "int32", "broker": "int32"})
    rows = latency_by_api(counts)
    broker_1 = rows[rows["broker"] == 1].iloc[0]
    assert broker_1["responses"] == 4
    assert [broker_1["p50_ms"], broker_1["p95_ms"]] == exact_percentiles(np.array([2.0, 2.0, 2.0, 6.0]), [0.5, 0.95])
    assert broker_1["max_ms"] == 6.0 and broker_1["broker_max_ms"] == 1.5
    api = rows[rows["broker"].isna()].iloc[0]
    assert api["responses"] == 6
    assert api["p50_ms"] == exact_percentiles(np.array([2.0, 2.0, 2.0, 6.0, 4.0, 4.0]), [0.5])[0]
    assert api["broker_p50_ms"] == exact_percentiles(np.array([1.5] * 4 + [3.0]), [0.5])[0]
    assert len(rows) == 3


def _entries(rows: list[tuple[int, str, int | None, int | None, float | None, int, float, float]]) -> pd.DataFrame:
    """entry_aggregates' rows: (set, name, partition, second, value, n, bps, batches); the rest derived."""
    frame = pd.DataFrame(rows, columns=["set", "name", "partition", "second", "value", "n", "bps", "batches"])
    frame["leader"] = np.int32(2)
    frame["requests"] = frame["n"].astype(float)
    frame["produce_bytes"] = frame["bps"]
    frame["fetch_bytes"] = 0.0
    frame["produced_records"] = frame["n"] * 10.0
    frame["weighted_batches"] = frame["batches"] * 2.0
    frame["bytes"] = frame["bps"] / 2
    return frame


def test_partition_totals_sum_the_seconds_and_take_the_earliest_peak() -> None:
    entries = _entries(
        [
            (PARTITION_SECOND_SET, "t", 0, 100, None, 1, 500.0, 0),
            (PARTITION_SECOND_SET, "t", 0, 102, None, 2, 900.0, 0),
            (PARTITION_SECOND_SET, "t", 0, 101, None, 1, 900.0, 0),
            (PARTITION_SECOND_SET, "t", 1, 100, None, 1, 50.0, 0),
            # Other sets' rows are not partitions.
            (PRODUCE_REQUEST_SET, "app", None, None, 3.0, 4, 0.0, 0),
        ]
    )
    totals = partition_totals(entries).set_index(["topic", "partition"])
    assert totals.loc[("t", 0), "bytes"] == 2300.0
    assert totals.loc[("t", 0), "requests"] == 4.0
    assert totals.loc[("t", 0), "peak_bytes_per_s"] == 900.0
    # Tied peaks: the earliest second, as analyze_transform.earliest_max_by picks.
    assert totals.loc[("t", 0), "peak_second"] == 101
    assert totals.loc[("t", 1), "peak_second"] == 100
    assert len(totals) == 2
    assert partition_totals(entries)["peak_second"].dtype == np.int64


def test_batch_figures_per_client_from_counted_rows() -> None:
    entries = _entries(
        [
            # app: 3 requests of 1 record, 1 of 9; batches of 500 B (x2 entries) and 20,000 B.
            (PRODUCE_REQUEST_SET, "app", None, None, 1.0, 3, 0.0, 0),
            (PRODUCE_REQUEST_SET, "app", None, None, 9.0, 1, 0.0, 0),
            (PRODUCE_BATCH_SET, "app", None, None, 500.0, 2, 2000.0, 2),
            (PRODUCE_BATCH_SET, "app", None, None, 20_000.0, 1, 40_000.0, 1),
            # quiet: one request without entries, so no batch figures at all.
            (PRODUCE_REQUEST_SET, "quiet", None, None, None, 1, 0.0, 0),
        ]
    )
    by_client = produce_batches_by_client(entries).set_index("client_id")
    app = by_client.loc["app"]
    assert app["produce_requests"] == 4
    assert [app["p50_records_per_request"], app["p95_records_per_request"]] == exact_percentiles(
        np.array([1.0, 1.0, 1.0, 9.0]), [0.5, 0.95]
    )
    assert app["median_batch_bytes"] == 500.0
    assert app["mean_batch_bytes"] == (1000.0 + 20_000.0) / 3
    assert app["small_batch_share"] == 2 / 3
    assert app["batches:<1KB"] == 4.0 and app["bytes:<1KB"] == 2000.0
    assert app["batches:10-100KB"] == 2.0 and app["bytes:10-100KB"] == 40_000.0
    assert np.isnan(app["batches:1-10KB"])
    quiet = by_client.loc["quiet"]
    assert quiet["produce_requests"] == 1
    assert np.isnan(quiet["p50_records_per_request"]) and np.isnan(quiet["median_batch_bytes"])
    assert np.isnan(quiet["small_batch_share"]) and np.isnan(quiet["batches:<1KB"])
    assert by_client["produce_requests"].dtype == np.int64


def _per_second(rows: list[tuple[int, int, float, int, float]]) -> pd.DataFrame:
    """broker_second_totals' rows: (broker, second, produce bytes, connections, Produce requests)."""
    frame = pd.DataFrame(rows, columns=["broker", "second", "produce_bytes", "connections", "requests_api_0"])
    for metric in ("fetch_bytes", "bytes_in", "bytes_out", "requests"):
        frame[metric] = 0.0
    frame["bytes_in"] = frame["produce_bytes"]
    frame["requests"] = frame["requests_api_0"]
    return frame


def test_bucket_series_fills_idle_seconds_and_averages_partial_minutes() -> None:
    # Seconds 58..121: the first minute holds 2 captured seconds, the second 60, the third 2.
    per_second = _per_second(
        [(1, 58, 100.0, 2, 4.0), (1, 59, 300.0, 1, 2.0), (2, 60, 600.0, 1, 6.0), (1, 121, 50.0, 1, 1.0)]
    )
    seconds, api = bucket_series(per_second, 1, (58, 121), [1, 2], [0])
    assert len(seconds) == 2 * 64
    broker_1 = seconds[seconds["broker"] == 1].set_index("bucket")
    assert broker_1.loc[59, "produce_bytes"] == 300.0
    assert broker_1.loc[60, "produce_bytes"] == 0.0  # idle, counted as zero
    assert broker_1.loc[58, "connections"] == 2.0
    assert str(broker_1.loc[58, "window_start"]) == "1970-01-01 00:00:58"
    assert api[(api["broker"] == 2) & (api["bucket"] == 60)]["requests"].tolist() == [6.0]

    connections = pd.DataFrame({"broker": [1, 2, 1], "bucket": [0, 1, 2], "connections": [2.0, 1.0, 1.0]})
    minutes, _ = bucket_series(per_second, 60, (58, 121), [1, 2], [0], connections)
    broker_1 = minutes[minutes["broker"] == 1].set_index("bucket")
    assert broker_1.loc[0, "produce_bytes"] == 200.0  # 400 bytes over its 2 captured seconds
    assert broker_1.loc[2, "produce_bytes"] == 25.0  # 50 bytes over seconds 120 and 121
    assert minutes[minutes["broker"] == 2].set_index("bucket").loc[1, "produce_bytes"] == 10.0  # 600 / 60
    assert broker_1.loc[0, "connections"] == 2.0  # distinct in the minute, not a sum of seconds
    with pytest.raises(ValueError, match="distinct connection"):
        bucket_series(per_second, 60, (58, 121), [1, 2], [0])


def test_replication_and_the_loss_of_a_broker() -> None:
    per_second = _per_second([(0, 10, 300.0, 1, 1.0), (1, 10, 100.0, 1, 1.0), (2, 10, 0.0, 0, 0.0)])
    series, _ = bucket_series(per_second, 1, (10, 10), [0, 1, 2], [0])
    networked = with_replication(series, 3, 3).set_index("broker")
    # RF 3 on 3 brokers: 2 followers; a broker takes in 2/2 of the other leaders' produce.
    assert networked.loc[0, "replication_out"] == 600.0
    assert networked.loc[2, "replication_in"] == 400.0
    assert networked.loc[0, "nw_in"] == 300.0 + 100.0
    assert list(with_replication(series, 3, 3).columns[:3]) == ["bucket", "broker", "window_start"]
    # Broker 0 lost: its 300 bytes split over 1 and 2; RF capped at the 2 survivors.
    degraded = without_broker(series, 0, 3, 3).set_index("broker")
    assert degraded.loc[1, "produce_bytes"] == 250.0
    assert degraded.loc[2, "replication_in"] == 250.0
    assert degraded.loc[1, "nw_out"] == 250.0


def test_series_stats_take_the_earliest_peak_and_count_seconds_above_the_limit() -> None:
    frame = pd.DataFrame(
        {
            "broker": [0] * 4,
            "window_start": pd.to_datetime([3, 1, 2, 0], unit="s"),
            "nw_in": [9.0, 9.0, 1.0, 5.0],
        }
    )
    (row,) = series_stats(frame, "broker", ["nw_in"], 1, {("broker", 0, "nw_in"): 4.0})
    assert row["max"] == 9.0
    assert str(row["max_at"]) == "1970-01-01T00:00:01.000000000"
    assert row["mean"] == 6.0
    assert row["p50"] == 7.0
    assert row["seconds_above_limit"] == 3
    (cluster,) = series_stats(frame, "cluster", ["nw_in"], 60, None)
    assert cluster["broker"] is None and cluster["limit"] is None and cluster["seconds_above_limit"] is None


def _traffic(rows: list[tuple[int, int, int, str, str, int, int, float, float, float, int]]) -> pd.DataFrame:
    """aggregate_traffic's rows, typed as Spark hands them over: (second, broker, connection,
    principal, client-id, API key, error code, weight, bytes in, bytes out, proxy throttle max)."""
    frame = pd.DataFrame(
        rows,
        columns=[
            "second",
            "broker",
            "connection_id",
            "principal",
            "client_id",
            "api_key",
            "error_code",
            "weight",
            "bytes_in",
            "bytes_out",
            "proxy_throttle_ms_max",
        ],
    )
    frame = frame.astype({"broker": np.int32, "api_key": np.int32, "error_code": np.int32})
    frame["api_version"] = np.int32(9)
    frame["rows"] = np.int64(2)
    frame["requests"] = 2 * frame["weight"]
    frame["first_us"] = frame["second"] * 1_000_000 + 10
    frame["last_us"] = frame["second"] * 1_000_000 + 900
    frame["produce_bytes"] = frame["bytes_in"].where(frame["api_key"] == 0, 0.0)
    frame["fetch_bytes"] = frame["bytes_out"].where(frame["api_key"] == 1, 0.0)
    for column in ("broker_throttled", "broker_throttle_ms_total", "proxy_throttle_ms_total"):
        frame[column] = 0.0
    frame["proxy_throttled"] = (frame["proxy_throttle_ms_max"] > 0) * frame["weight"]
    frame["broker_throttle_ms_max"] = np.int32(0)
    frame["proxy_throttle_ms_max"] = frame["proxy_throttle_ms_max"].astype(np.int32)
    return frame


def test_traffic_tables_from_the_per_second_sums() -> None:
    traffic = _traffic(
        [
            # second, broker, connection, principal, client, API, error, weight, in, out, proxy throttle
            (60, 0, 1, "alice", "app-a", 0, 0, 1.0, 100.0, 10.0, 0),
            (60, 0, 1, "alice", "app-a", 3, 0, 1.0, 5.0, 50.0, 0),
            (60, 0, 2, "bob", "app-b", 1, 0, 1.0, 20.0, 400.0, 7),
            (61, 0, 1, "alice", "app-a", 0, 6, 1.0, 300.0, 10.0, 0),
            (61, 1, 3, "alice", "app-a", 0, 0, 1.0, 50.0, 5.0, 0),
            (125, 0, 2, "bob", "app-b", 1, 0, 1.0, 20.0, 100.0, 3),
        ]
    )
    coverage = traffic_coverage(traffic)
    assert (coverage["rows"], coverage["requests"]) == (12, 12.0)
    assert (coverage["first_us"], coverage["last_us"]) == (60_000_010, 125_000_900)
    assert (coverage["first_second"], coverage["last_second"]) == (60, 125)
    assert (coverage["client_ids"], coverage["principals"], coverage["connections"]) == (2, 2, 3)
    assert (coverage["brokers"], coverage["api_keys"], coverage["sampling_one_in"]) == ([0, 1], [0, 1, 3], [1])

    per_second = broker_second_totals(traffic, [0, 1, 3]).set_index(["broker", "second"]).sort_index()
    assert per_second.loc[(0, 60), "bytes_in"] == 125.0
    assert per_second.loc[(0, 60), "connections"] == 2.0
    assert list(per_second.loc[(0, 60), ["requests_api_0", "requests_api_1", "requests_api_3"]]) == [2.0, 2.0, 2.0]
    assert per_second.loc[(0, 61), "produce_bytes"] == 300.0
    assert len(per_second) == 4

    # Seconds 60 and 61 are minute 1 (two connections on broker 0), second 125 minute 2.
    minutes = bucket_connections(traffic, 60).set_index(["broker", "bucket"])["connections"].sort_index()
    assert minutes.to_dict() == {(0, 1): 2.0, (0, 2): 1.0, (1, 1): 1.0}

    clients = client_totals(traffic).set_index(["broker", "principal", "client_id"]).sort_index()
    assert clients.loc[(0, "alice", "app-a"), "bytes_in"] == 405.0
    assert clients.loc[(0, "bob", "app-b"), "proxy_throttled"] == 2.0
    assert clients.loc[(0, "bob", "app-b"), "proxy_throttle_ms_max"] == 7
    assert clients["proxy_throttle_ms_max"].dtype == np.int32

    # app-a's active seconds carry 165 + 310 + 55 bytes (60, 61 on two brokers): 165 and 365.
    bursts = client_burstiness(traffic).set_index("entity")
    assert bursts.loc["app-a", "active_seconds"] == 2
    assert bursts.loc["app-a", "active_p50_bytes_per_s"] == 165.0 + 0.5 * 200.0
    assert bursts.loc["app-a", "active_p99_bytes_per_s"] == 165.0 + 0.99 * 200.0
    assert bursts.loc["app-b", "burstiness"] == exact_percentiles(np.array([420.0, 120.0]), [0.99])[0] / 270.0
