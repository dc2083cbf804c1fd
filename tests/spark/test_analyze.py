"""analyze on a synthetic capture, checked against figures recomputed with pandas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from kqp.config.capacity_file import load_capacity
from kqp.spark_jobs.analyze import AnalyzeOptions, run_analyze
from kqp.spark_jobs.analyze_tables import PERCENTILES, exact_percentiles
from kqp.spark_jobs.common import Progress
from kqp.spark_jobs.report import write_analyze_outputs
from tests.spark.helpers import SPEC, exploded

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
CAPACITY = REPO / "config" / "capacity.json"
RF = 3
QUANTILES = [50, 95, 99, 99.9]


@pytest.fixture(scope="module")
def analysis(spark: Any, capture_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    output = tmp_path_factory.mktemp("analyze")
    options = AnalyzeOptions(
        capture=str(capture_dir), output=str(output), replication_factor=RF, capacity=str(CAPACITY)
    )
    result = run_analyze(spark, options, Progress("analyze", 9))
    write_analyze_outputs(result, output)
    return result, output


def per_second(rows: pd.DataFrame, value: pd.Series, brokers: list[int]) -> pd.DataFrame:
    """Broker x second grid of summed `value`, zeros for idle seconds."""
    seconds = rows["ts_request_received_us"] // 1_000_000
    frame = pd.DataFrame({"broker": rows["upstream_node_id"], "second": seconds, "value": value})
    grid = pd.MultiIndex.from_product([brokers, range(seconds.min(), seconds.max() + 1)], names=["broker", "second"])
    return frame.groupby(["broker", "second"])["value"].sum().reindex(grid, fill_value=0.0).unstack("broker")


def stat_row(result: Any, scope: str, metric: str, broker: int | None = None, scenario: str = "observed") -> pd.Series:
    stats = result.tables["throughput_stats"]
    rows = stats[
        (stats["resolution"] == "1s")
        & (stats["scenario"] == scenario)
        & (stats["scope"] == scope)
        & (stats["metric"] == metric)
    ]
    if broker is not None:
        rows = rows[rows["broker"] == broker]
    assert len(rows) == 1
    return rows.iloc[0]


def assert_stats(row: pd.Series, series: pd.Series) -> None:
    expected = np.percentile(series.to_numpy(), QUANTILES)
    assert [row["p50"], row["p95"], row["p99"], row["p99_9"]] == pytest.approx(expected, rel=1e-9)
    assert row["max"] == pytest.approx(series.max())
    assert row["mean"] == pytest.approx(series.mean())
    assert pd.Timestamp(row["max_at"]).timestamp() == series.idxmax()


def test_produce_ingress_percentiles_per_broker_and_cluster(analysis: Any, capture_rows: pd.DataFrame) -> None:
    result, _ = analysis
    brokers = list(range(SPEC.brokers))
    produce = per_second(capture_rows, capture_rows["request_bytes"].where(capture_rows["api_key"] == 0, 0), brokers)
    for broker in brokers:
        assert_stats(stat_row(result, "broker", "produce_bytes", broker), produce[broker])
    assert_stats(stat_row(result, "cluster", "produce_bytes"), produce.sum(axis=1))


def test_fetch_egress_requests_and_connections(analysis: Any, capture_rows: pd.DataFrame) -> None:
    result, _ = analysis
    brokers = list(range(SPEC.brokers))
    fetch = per_second(
        capture_rows, capture_rows["response_bytes"].where(capture_rows["api_key"] == 1, 0).fillna(0), brokers
    )
    assert_stats(stat_row(result, "broker", "fetch_bytes", 2), fetch[2])
    requests = per_second(capture_rows, pd.Series(1.0, index=capture_rows.index), brokers)
    assert_stats(stat_row(result, "cluster", "requests"), requests.sum(axis=1))
    seconds = capture_rows["ts_request_received_us"] // 1_000_000
    connections = capture_rows.assign(second=seconds).groupby(["upstream_node_id", "second"])["connection_id"].nunique()
    assert stat_row(result, "broker", "connections", 1)["max"] == connections.loc[1].max()
    produce_rate = capture_rows[capture_rows["api_key"] == 0].groupby(seconds).size()
    stats = result.tables["throughput_stats"]
    api_row = stats[
        (stats["resolution"] == "1s") & (stats["scope"] == "cluster") & (stats["metric"] == "requests:Produce")
    ]
    assert api_row.iloc[0]["max"] == produce_rate.max()


def test_one_minute_resolution_is_the_per_second_average(analysis: Any, capture_rows: pd.DataFrame) -> None:
    result, _ = analysis
    seconds = capture_rows["ts_request_received_us"] // 1_000_000
    minute = seconds // 60
    # Edge minutes only partly inside the capture average over the seconds they cover.
    covered = pd.Series(range(seconds.min(), seconds.max() + 1)).floordiv(60).value_counts()
    produce = capture_rows["request_bytes"].where(capture_rows["api_key"] == 0, 0).groupby(minute).sum()
    per_minute = produce / covered.reindex(produce.index)
    assert covered.min() < 60  # the test capture does start or end mid-minute
    stats = result.tables["throughput_stats"]
    row = stats[
        (stats["resolution"] == "1min") & (stats["scope"] == "cluster") & (stats["metric"] == "produce_bytes")
    ].iloc[0]
    assert row["max"] == pytest.approx(per_minute.max())
    assert row["mean"] == pytest.approx(per_minute.mean())


def test_replication_aware_network_load(analysis: Any, capture_rows: pd.DataFrame) -> None:
    result, _ = analysis
    brokers = list(range(SPEC.brokers))
    produce = per_second(capture_rows, capture_rows["request_bytes"].where(capture_rows["api_key"] == 0, 0), brokers)
    bytes_in = per_second(capture_rows, capture_rows["request_bytes"], brokers)
    bytes_out = per_second(capture_rows, capture_rows["response_bytes"].fillna(0), brokers)
    cluster_produce = produce.sum(axis=1)
    for broker in brokers:
        nw_in = bytes_in[broker] + (RF - 1) / (SPEC.brokers - 1) * (cluster_produce - produce[broker])
        nw_out = bytes_out[broker] + (RF - 1) * produce[broker]
        assert_stats(stat_row(result, "broker", "nw_in", broker), nw_in)
        assert_stats(stat_row(result, "broker", "nw_out", broker), nw_out)


def test_headroom_binding_constraint_and_broker_loss(analysis: Any, capture_rows: pd.DataFrame) -> None:
    result, _ = analysis
    capacity = load_capacity(CAPACITY)
    brokers = list(range(SPEC.brokers))
    produce = per_second(capture_rows, capture_rows["request_bytes"].where(capture_rows["api_key"] == 0, 0), brokers)
    bytes_in = per_second(capture_rows, capture_rows["request_bytes"], brokers)
    bytes_out = per_second(capture_rows, capture_rows["response_bytes"].fillna(0), brokers)
    cluster_produce = produce.sum(axis=1)
    expected = {}
    cluster_in = pd.Series(0.0, index=produce.index)
    cluster_out = pd.Series(0.0, index=produce.index)
    for broker in brokers:
        nw_in = bytes_in[broker] + (RF - 1) / 2 * (cluster_produce - produce[broker])
        cluster_in += nw_in
        cluster_out += bytes_out[broker] + (RF - 1) * produce[broker]
        limit = capacity.for_broker(broker).nw_in_bytes_per_s * 0.8
        expected[broker] = limit / np.percentile(nw_in, 99)
    # Brokers needed at 60 % of the mean broker capacity, never fewer than RF.
    mean_in = np.mean([capacity.for_broker(b).nw_in_bytes_per_s for b in brokers])
    mean_out = np.mean([capacity.for_broker(b).nw_out_bytes_per_s for b in brokers])
    needed = max(
        RF,
        int(np.ceil(np.percentile(cluster_in, 99) / (mean_in * 0.6))),
        int(np.ceil(np.percentile(cluster_out, 99) / (mean_out * 0.6))),
    )
    assert result.summary["headroom"]["brokers_needed"]["now"] == needed
    year = 1.05**12
    needed_later = max(
        RF,
        int(np.ceil(np.percentile(cluster_in, 99) * year / (mean_in * 0.6))),
        int(np.ceil(np.percentile(cluster_out, 99) * year / (mean_out * 0.6))),
    )
    assert result.summary["headroom"]["brokers_needed"]["in_12_months"] == needed_later
    headroom = result.tables["headroom"]
    nw_in_rows = headroom[headroom["resource"] == "NW_IN"].set_index("broker")
    for broker, growth in expected.items():
        assert nw_in_rows.loc[broker, "growth_to_limit"] == pytest.approx(growth, rel=1e-9)
    binding = result.summary["headroom"]["binding_constraint"]
    assert binding["growth_to_limit"] == pytest.approx(min(headroom["growth_to_limit"]))

    # Broker loss: the busiest broker's client traffic spread over the two survivors, RF capped at 2.
    totals = (bytes_in + bytes_out).mean()
    lost = int(totals.idxmax())
    assert result.summary["headroom"]["broker_lost"] == lost
    survivors = [b for b in brokers if b != lost]
    moved_produce = {b: produce[b] + produce[lost] / 2 for b in survivors}
    survivor = survivors[0]
    nw_in = bytes_in[survivor] + bytes_in[lost] / 2 + 1 * (moved_produce[survivors[1]])
    row = stat_row(result, "broker", "nw_in", survivor, scenario=f"without_broker_{lost}")
    assert row["p99"] == pytest.approx(np.percentile(nw_in, 99))


def test_shares_and_pareto(analysis: Any, capture_rows: pd.DataFrame) -> None:
    result, _ = analysis
    shares = result.tables["shares"]
    by_client = (
        (capture_rows["request_bytes"] + capture_rows["response_bytes"].fillna(0))
        .groupby(capture_rows["client_id"])
        .sum()
    )
    by_client = by_client.sort_values(ascending=False)
    ours = shares[shares["dimension"] == "client_id"].set_index("entity")
    assert list(ours.index[:3]) == list(by_client.index[:3])
    assert ours["bytes"].to_dict() == pytest.approx(by_client.to_dict())
    assert ours.loc[by_client.index[0], "share_bytes"] == pytest.approx(by_client.iloc[0] / by_client.sum())
    cumulative = (by_client / by_client.sum()).cumsum()
    assert result.summary["shares"]["client_id"]["entities_for_80pct_bytes"] == int((cumulative < 0.8).sum()) + 1

    parts = exploded(capture_rows)
    by_topic = parts.groupby("topic")["bytes"].sum()
    topics = shares[shares["dimension"] == "topic"].set_index("entity")["bytes"]
    assert topics.to_dict() == pytest.approx(by_topic.to_dict())


def test_partition_hot_spots_and_skew(analysis: Any, capture_rows: pd.DataFrame) -> None:
    result, _ = analysis
    parts = exploded(capture_rows)
    parts["second"] = parts["ts_request_received_us"] // 1_000_000
    totals = parts.groupby(["topic", "partition"])["bytes"].sum().sort_values(ascending=False)
    peaks = parts.groupby(["topic", "partition", "second"])["bytes"].sum().groupby(["topic", "partition"]).max()
    ours = result.tables["partitions"]
    top = ours.iloc[0]
    assert (top["topic"], top["partition"]) == totals.index[0]
    assert top["bytes"] == totals.iloc[0]
    assert top["peak_bytes_per_s"] == peaks.loc[totals.index[0]]
    topic_bytes = parts.groupby(["topic", "partition"])["bytes"].sum().groupby("topic")
    expected_skew = (topic_bytes.max() / topic_bytes.mean()).to_dict()
    assert result.tables["topic_skew"].set_index("topic")["skew"].to_dict() == pytest.approx(expected_skew)


def test_batch_mix(analysis: Any, capture_rows: pd.DataFrame) -> None:
    result, _ = analysis
    parts = exploded(capture_rows)
    produce = parts[(parts["api_key"] == 0) & (parts["batches"] > 0)]
    per_batch = produce["bytes"] / produce["batches"]
    small = produce["batches"][per_batch < 1_000].sum()
    mix = result.tables["batch_mix"].set_index("bucket")
    assert mix.loc["<1KB", "batches"] == small
    assert mix["batches"].sum() == produce["batches"].sum()


def test_batch_figures_per_client(analysis: Any, capture_rows: pd.DataFrame) -> None:
    result, _ = analysis
    parts = exploded(capture_rows)
    produce_rows = capture_rows[capture_rows["api_key"] == 0]
    by_client = result.tables["batch_mix_by_client"].set_index("client_id")
    assert sorted(by_client.index) == sorted(produce_rows["client_id"].unique())
    for client, row in by_client.iterrows():
        requests = produce_rows[produce_rows["client_id"] == client]
        # A request's records: the sum over its entries (a request without a list has none).
        lists = [entries for entries in requests["partitions"] if entries is not None]
        records = np.array([sum(p["records"] or 0 for p in entries) for entries in lists], float)
        entries = parts[(parts["api_key"] == 0) & (parts["client_id"] == client) & (parts["batches"] > 0)]
        per_batch = (entries["bytes"] / entries["batches"]).to_numpy()
        assert row["produce_requests"] == len(requests)
        # Exact percentiles (Spark's percentile over the counted values), to the last bits.
        assert [row["p50_records_per_request"], row["p95_records_per_request"]] == pytest.approx(
            exact_percentiles(records, [0.5, 0.95]), rel=1e-12
        )
        assert row["median_batch_bytes"] == pytest.approx(exact_percentiles(per_batch, [0.5])[0], rel=1e-12)
        assert row["mean_batch_bytes"] == entries["bytes"].sum() / entries["batches"].sum()
        small = entries["batches"][per_batch < 10_000].sum() / entries["batches"].sum()
        assert row["small_batch_share"] == pytest.approx(small, rel=1e-12)


def test_latency_percentiles_by_api(analysis: Any, capture_rows: pd.DataFrame) -> None:
    result, _ = analysis
    answered = capture_rows[capture_rows["ts_response_sent_us"].notna()]
    latency = (answered["ts_response_sent_us"] - answered["ts_request_received_us"]) / 1000.0
    round_trip = (answered["ts_response_received_us"] - answered["ts_request_sent_us"]) / 1000.0
    produce = answered["api_key"] == 0
    row = result.tables["latency_by_api"].set_index("api").loc["Produce"]
    assert row["responses"] == produce.sum()
    # Exact percentiles of every answered Produce (Spark's percentile over the counts of each
    # latency value), to the last bits.
    columns = ["p50_ms", "p95_ms", "p99_ms", "p99_9_ms"]
    assert list(row[columns]) == pytest.approx(exact_percentiles(latency[produce].to_numpy(), PERCENTILES), rel=1e-12)
    broker_columns = [f"broker_{c}" for c in columns]
    assert list(row[broker_columns]) == pytest.approx(
        exact_percentiles(round_trip[produce].dropna().to_numpy(), PERCENTILES), rel=1e-12
    )
    assert row["max_ms"] == pytest.approx(latency[produce].max())
    # Per broker: the same figures over the broker's own requests.
    per_broker = result.tables["latency_by_broker_api"]
    first = per_broker[per_broker["api"] == "Produce"].iloc[0]
    mine = produce & (answered["upstream_node_id"] == first["broker"])
    assert first["responses"] == mine.sum()
    assert list(first[columns]) == pytest.approx(exact_percentiles(latency[mine].to_numpy(), PERCENTILES), rel=1e-12)


def test_errors_and_throttles(analysis: Any, capture_rows: pd.DataFrame) -> None:
    result, _ = analysis
    errors = capture_rows[capture_rows["error_code"].fillna(0) != 0].groupby(["api_key", "error_code"]).size()
    ours = result.tables["errors"].set_index(["api_key", "error_code"])["requests"]
    assert ours.to_dict() == pytest.approx({(int(k[0]), int(k[1])): v for k, v in errors.items()})
    broker = (
        capture_rows[capture_rows["broker_throttle_ms"].fillna(0) > 0].groupby("client_id")["broker_throttle_ms"].sum()
    )
    proxy = capture_rows[capture_rows["proxy_throttle_ms"] > 0].groupby("client_id")["proxy_throttle_ms"].sum()
    throttles = result.tables["throttles"].set_index("client_id")
    assert (
        throttles["broker_throttle_ms_total"][throttles["broker_throttle_ms_total"] > 0].to_dict() == broker.to_dict()
    )
    assert throttles["proxy_throttle_ms_total"][throttles["proxy_throttle_ms_total"] > 0].to_dict() == proxy.to_dict()


def test_outputs_on_disk(analysis: Any, capture_rows: pd.DataFrame) -> None:
    _, output = analysis
    summary = json.loads((output / "summary.json").read_text())
    assert summary["schema"] == "kqp.replay.analyze/1"
    assert summary["coverage"]["requests"] == len(capture_rows)
    assert summary["coverage"]["records_written"] == len(capture_rows)
    report = (output / "report.md").read_text()
    assert "Binding constraint" in report
    for plot in summary["outputs"]["plots"]:
        assert (output / plot).stat().st_size > 1_000
        assert f"]({plot})" in report
    # report.html stands alone: every plot embedded, nothing loaded from elsewhere.
    page = (output / summary["outputs"]["report"]).read_text()
    assert page.count('src="data:image/png;base64,') == len(summary["outputs"]["plots"]) >= 4
    assert 'src="plots/' not in page and "<link" not in page
    assert "Binding constraint" in page and "<table>" in page
    series = pd.read_parquet(output / "tables" / "broker_series_1s")
    assert len(series) == SPEC.brokers * summary["coverage"]["duration_s"]
    assert (output / "csv" / "throughput_stats.csv").exists()
