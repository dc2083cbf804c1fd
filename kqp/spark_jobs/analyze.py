"""`analyze`: what the cluster actually carried, from a capture.

Run locally (the package is importable, master defaults to local[*])::

    kqp replay analyze CAPTURE_DIR --output OUT --capacity config/capacity.json \
        --replication-factor 3 --monthly-growth 1.05

Run on a cluster (ship the package as a zip; the entry point is this module)::

    cd /path/to/kqp && zip -qr /tmp/kqp.zip kqp
    spark-submit --master spark://host:7077 --py-files /tmp/kqp.zip \
        kqp/spark_jobs/analyze.py hdfs:///captures/kqp --output /shared/out/analyze \
        --capacity capacity.json --replication-factor 3

Structure: `extract` (capture_source.read_capture) -> the steps of `run_analyze`, each made
of pure transforms (analyze_transform: a few Spark aggregations, then analyze_tables: driver-side
pandas shaping of their small results) -> `load` (report.write_analyze_outputs). The Spark work is one pass
building the per-second traffic sums (collected once: the coverage, the series, the entity
tables, the burstiness and the API mix are pandas over them on the driver), one pass
decoding the Produce and Fetch partition entries into the per-partition-second sums and the
per-client counts of records and batch sizes (its small result collected: the partition and
the batch figures are computed from it on the driver), and one counting the latencies per
value, each reading only its columns (the last two from a second driver thread, filling the
cores the first one's small queries leave idle); every series, percentile and share is
computed from rows per (broker, second), per
entity, per partition or per distinct value, never by feeding a sketch per request. Figures:

  * throughput series per broker (`upstream_node_id`) and cluster-wide at 1 s and 1 min:
    Produce request bytes in, Fetch response bytes out, all request/response bytes,
    requests (also per API key) and distinct connections; 1 min values are per-second
    averages over the captured seconds of the minute. Gaps are filled with zeros so percentiles count idle seconds.
  * p50/p95/p99/p99.9/max (exact: Spark's `percentile`, as analyze_tables.exact_percentiles
    reproduces it) with the time of the max, and seconds above the capacity limit;
  * replication-aware network load from the replication factor (analyze_tables.with_replication);
  * shares (top-N, Pareto) of principals, client-ids, (principal, client-id) and topics;
  * partition hot spots and skew; Produce batch-size mix; latency percentiles by API
    (exact: Spark's `percentile` of the requests, from the count of each latency, on the
    driver: analyze_tables.counted_percentiles); errors; observed broker vs
    proxy throttles;
  * headroom against a Cruise Control capacity file, the binding constraint, headroom if
    the busiest broker is lost, and months of growth runway.

Sampled captures (1 in N connections) are scaled up by N for bytes and request counts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from kqp.config.capacity_file import load_capacity
from kqp.quotas import capacity as cap
from kqp.spark_jobs.analyze_tables import (
    BATCH_BUCKET_LAST,
    BATCH_BUCKETS,
    RESOLUTIONS,
    RESOURCE_OF_METRIC,
    STATS,
    api_error_totals,
    api_mix,
    api_names,
    api_stats,
    batch_tables,
    broker_second_totals,
    bucket_connections,
    bucket_series,
    client_broker_totals,
    client_burstiness,
    client_totals,
    cluster_series,
    entity_totals,
    error_counts,
    headroom_loads,
    latency_by_api,
    network_limits,
    network_stats,
    ordered_stats,
    pareto_summary,
    partition_totals,
    produce_batches_by_client,
    rank_shares,
    resolve_lost_broker,
    skew,
    throttle_counts,
    topic_skew,
    topic_totals,
    traffic_coverage,
    with_replication,
    without_broker,
)
from kqp.spark_jobs.analyze_transform import aggregate_traffic, entry_aggregates, latency_counts, prepare_requests
from kqp.spark_jobs.capture_source import FooterCoverage, read_capture, read_footer_coverage
from kqp.spark_jobs.common import BUDGET_EXIT_CODE, HelpFormatter, Progress
from kqp.spark_jobs.session import to_pandas

SUMMARY_SCHEMA = "kqp.replay.analyze/1"


@dataclass(frozen=True)
class AnalyzeOptions:
    """The job's settings; the command line's defaults are read from these fields."""

    capture: str
    output: str
    # The capture sees client traffic only; replication traffic is modelled from this.
    replication_factor: int = 3
    capacity: str | None = None
    # Cruise Control's network.{inbound,outbound}.capacity.threshold: the share of a broker's
    # capacity counted as usable before it is considered full.
    nw_in_threshold: float = cap.DEFAULT_NETWORK_THRESHOLD
    nw_out_threshold: float = cap.DEFAULT_NETWORK_THRESHOLD
    # Compound growth per month used for the runway (1.05: +5 % a month).
    monthly_growth: float = 1.05
    # Sizing guides plan brokers at 50-60 % of capacity (Confluent's calculator: 60 %).
    target_utilisation: float = 0.6
    top_n: int = 10
    # Headroom is judged on the p99 of 1 s series: the mean hides the bursts that fill a
    # broker's network, and the max is one outlier second.
    headroom_stat: str = "p99"
    headroom_resolution: str = "1s"
    # A CI gate: exit BUDGET_EXIT_CODE when the runway is shorter (None: no gate).
    budget_min_runway_months: float | None = None
    # The time window analysed, microseconds since the epoch, UTC (None: unbounded).
    start_us: int | None = None
    end_us: int | None = None


@dataclass
class AnalyzeResult:
    """Everything `load` writes: tables as pandas (the series too: one row per broker and bucket)."""

    summary: dict[str, Any]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    # The throughput series, written as Parquet directories (tables/<name>/) like Spark's output.
    series_tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    budget_violations: list[str] = field(default_factory=list)
    # Cached inputs still held by the session: released once the outputs are written (none
    # now: every pass's result is collected whole; kept so that callers need not know).
    cached: list[DataFrame] = field(default_factory=list)

    def release(self) -> None:
        """Unpersist the cached inputs, once nothing reads them any more."""
        for frame in self.cached:
            frame.unpersist()
        self.cached = []


@dataclass
class Extracted:
    """The capture as the steps read it: its requests and their per-second traffic sums (both
    lazy: each pass reads only the columns it needs)."""

    requests: DataFrame
    traffic: DataFrame


def extract(spark: SparkSession, options: AnalyzeOptions) -> Extracted:
    """The capture's requests, and their per-second traffic sums. The sums are far smaller than
    the capture (a connection sends many requests of one API per second: about a twentieth of
    the rows), so they come to the driver once, where every table made of them is pandas
    (analyze_tables, "the traffic sums' tables"): no cache, no small Spark job per table. The
    requests are not cached either: the two passes that need single requests (the partition
    entries, the latencies) read different columns of the Parquet files, which is cheaper than
    building and reading back a copy of the capture."""
    requests = prepare_requests(read_capture(spark, options.capture, options.start_us, options.end_us))
    return Extracted(requests, aggregate_traffic(requests))


@dataclass
class Coverage:
    """What the capture spans: its first row of totals, brokers, APIs and time range."""

    row: Any
    brokers: list[int]
    api_keys: list[int]
    names: dict[int, str]
    bucket_range: tuple[int, int]
    api_errors: pd.DataFrame
    api_mix: pd.DataFrame
    footer: FooterCoverage | None

    @property
    def duration_s(self) -> float:
        return float(self.bucket_range[1] - self.bucket_range[0] + 1)


def coverage_of(traffic: pd.DataFrame, options: AnalyzeOptions) -> Coverage:
    """Every whole-capture figure, from the traffic sums (aggregate_traffic's rows)."""
    row = traffic_coverage(traffic)
    if not row["rows"]:
        raise ValueError(f"capture {options.capture} holds no requests")
    api_keys = row["api_keys"]
    names = api_names(api_keys)
    api_errors = api_error_totals(traffic)
    mix = api_mix(api_errors)
    mix.insert(1, "api", mix["api_key"].map(names))
    return Coverage(
        row=row,
        brokers=row["brokers"],
        api_keys=api_keys,
        names=names,
        bucket_range=(int(row["first_second"]), int(row["last_second"])),
        api_errors=api_errors,
        api_mix=mix.sort_values(["api_key", "api_version"]).reset_index(drop=True),
        footer=read_footer_coverage(options.capture),
    )


def _throughput(
    traffic: pd.DataFrame,
    coverage: Coverage,
    options: AnalyzeOptions,
    limits: dict[tuple[str, int | None, str], float] | None,
    result: AnalyzeResult,
    progress: Progress,
) -> tuple[pd.DataFrame, int | None]:
    """Series and percentiles per resolution, and the broker-loss scenario; (stats, lost broker).

    The traffic sums give every (broker, second); the coarser series are their sums (and one
    count of distinct connections per resolution); the statistics are computed from these few
    rows per second (Spark's exact percentile, reproduced: exact_percentiles).
    """
    brokers = coverage.brokers
    per_second = broker_second_totals(traffic, coverage.api_keys)
    stats_frames = []
    base_series: dict[str, pd.DataFrame] = {}
    for resolution, unit in RESOLUTIONS.items():
        connections = None if unit == 1 else bucket_connections(traffic, unit)
        series, api_series = bucket_series(
            per_second, unit, coverage.bucket_range, brokers, coverage.api_keys, connections
        )
        base_series[resolution] = series
        networked = with_replication(series, options.replication_factor, len(brokers))
        result.series_tables[f"broker_series_{resolution}"] = networked
        result.series_tables[f"cluster_series_{resolution}"] = cluster_series(networked)
        stats_frames.append(network_stats(networked, unit, limits, resolution, "observed"))
        result.series_tables[f"api_requests_{resolution}"] = api_series
        stats_frames.append(api_stats(api_series, unit, resolution, coverage.names))
        progress.step(f"throughput series and percentiles at {resolution}")
    stats = ordered_stats(pd.concat(stats_frames, ignore_index=True))

    # N-1 planning: the scenario that matters is losing the busiest broker, whose clients
    # then land on the others (and replication is recomputed for one broker fewer).
    lost_broker = resolve_lost_broker(stats[stats["resolution"] == options.headroom_resolution])
    if lost_broker is not None and len(brokers) > 1:
        unit = RESOLUTIONS[options.headroom_resolution]
        degraded = without_broker(
            base_series[options.headroom_resolution], lost_broker, options.replication_factor, len(brokers)
        )
        scenario = f"without_broker_{lost_broker}"
        stats = pd.concat(
            [stats, network_stats(degraded, unit, limits, options.headroom_resolution, scenario)], ignore_index=True
        )
        progress.step(f"broker-loss scenario: without broker {lost_broker}")
    else:
        progress.step("broker-loss scenario skipped: a single broker")
    stats = ordered_stats(stats)
    result.tables["throughput_stats"] = stats
    return stats, lost_broker


def _shares(
    traffic: pd.DataFrame, partitions: pd.DataFrame, options: AnalyzeOptions, result: AnalyzeResult
) -> tuple[dict[str, Any], pd.DataFrame]:
    """Shares of principals, client-ids and topics; their Pareto summaries; (summaries, client totals)."""
    clients = client_totals(traffic)
    shares = []
    pareto: dict[str, Any] = {}
    for dimension in ("principal", "client_id", "principal_client"):
        ranked = rank_shares(entity_totals(clients, dimension), dimension)
        shares.append(ranked)
        pareto[dimension] = pareto_summary(ranked, options.top_n)
    ranked_topics = rank_shares(topic_totals(partitions), "topic")
    shares.append(ranked_topics)
    pareto["topic"] = pareto_summary(ranked_topics, options.top_n)
    result.tables["shares"] = pd.concat(shares, ignore_index=True)
    result.tables["client_burstiness"] = client_burstiness(traffic).sort_values("entity")
    # Which clients make each broker busy: the quota candidates when one broker runs hot.
    per_broker_clients = client_broker_totals(clients)
    per_broker_clients["share_of_broker_bytes"] = per_broker_clients["bytes"] / per_broker_clients.groupby("broker")[
        "bytes"
    ].transform("sum")
    result.tables["client_broker_shares"] = per_broker_clients.sort_values(["broker", "bytes"], ascending=[True, False])
    return pareto, clients


def _partitions(partitions: pd.DataFrame, stats: pd.DataFrame, result: AnalyzeResult) -> pd.Series:
    """Partition hot spots and topic skew; returns mean bytes in + out per broker (for skew)."""
    partitions = partitions.sort_values("bytes", ascending=False).reset_index(drop=True)
    partitions.insert(0, "rank", range(1, len(partitions) + 1))
    result.tables["partitions"] = partitions
    result.tables["topic_skew"] = topic_skew(partitions) if len(partitions) else pd.DataFrame()
    # Broker skew is judged on the mean client bytes of the 1 s series, the same basis as
    # the busiest-broker choice above.
    broker_bytes: pd.Series = (
        stats[
            (stats["resolution"] == "1s")
            & (stats["scenario"] == "observed")
            & (stats["scope"] == "broker")
            & (stats["metric"].isin(["bytes_in", "bytes_out"]))
        ]
        .groupby("broker")["mean"]
        .sum()
    )
    return broker_bytes


def _entry_figures(requests: DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(partition_totals, produce_batches_by_client) rows: the Produce and Fetch partition
    entries decoded from the nested column once and aggregated in one pass (entry_aggregates),
    whose rows, few, come to the driver, where both tables are computed from them."""
    entries = to_pandas(entry_aggregates(requests))
    return partition_totals(entries), produce_batches_by_client(entries)


def _latency_figures(requests: DataFrame) -> pd.DataFrame:
    """latency_by_api's rows: the latencies counted per value in one pass (latency_counts), the
    percentiles taken from the counts on the driver."""
    return latency_by_api(to_pandas(latency_counts(requests)))


def _batch_mix(batches: pd.DataFrame, result: AnalyzeResult) -> None:
    """Produce batch sizes by bucket, overall and per client: small batches cost a broker
    far more per byte (a request and a log append each), so they point at linger.ms and
    batch.size settings worth changing. One pass over the Produce partition entries gives both
    (`batches`: produce_batches_by_client's rows)."""
    mix, by_client = batch_tables(batches)
    order = [label for _, label in BATCH_BUCKETS] + [BATCH_BUCKET_LAST]
    mix["order"] = mix["bucket"].map(order.index)
    mix = mix.sort_values("order").drop(columns="order").reset_index(drop=True)
    total_batches = mix["batches"].sum()
    mix["share_batches"] = mix["batches"] / total_batches if total_batches else 0.0
    result.tables["batch_mix"] = mix
    result.tables["batch_mix_by_client"] = by_client.sort_values("client_id")


def _latency_errors_throttles(
    latencies: pd.DataFrame, coverage: Coverage, clients: pd.DataFrame, result: AnalyzeResult
) -> None:
    """`latencies`: latency_by_api's rows, both groupings of one pass (two grouping sets);
    rows with no broker are the all-brokers totals."""
    names = coverage.names
    latency = latencies[latencies["broker"].isna()].drop(columns="broker").sort_values("api_key").reset_index(drop=True)
    latency.insert(1, "api", latency["api_key"].map(names))
    result.tables["latency_by_api"] = latency
    latency_broker = latencies[latencies["broker"].notna()].astype({"broker": int})
    latency_broker = latency_broker[["broker", *[c for c in latency_broker.columns if c != "broker"]]]
    latency_broker = latency_broker.sort_values(["broker", "api_key"])
    latency_broker.insert(2, "api", latency_broker["api_key"].map(names))
    result.tables["latency_by_broker_api"] = latency_broker.reset_index(drop=True)
    errors = error_counts(coverage.api_errors).sort_values(["api_key", "error_code"]).reset_index(drop=True)
    errors.insert(1, "api", errors["api_key"].map(names))
    result.tables["errors"] = errors
    result.tables["throttles"] = throttle_counts(clients).sort_values(["principal", "client_id"]).reset_index(drop=True)


@dataclass
class Headroom:
    """Headroom per broker and resource, now and with the busiest broker lost, the first
    limit each scenario reaches, and the broker count needed (None without a capacity file)."""

    rows: list[cap.Headroom]
    loss_rows: list[cap.Headroom]
    binding: cap.Headroom | None
    binding_loss: cap.Headroom | None
    sizing: dict[str, Any] | None


def _headroom(
    stats: pd.DataFrame,
    capacity_file: cap.CapacityFile | None,
    thresholds: dict[str, float],
    lost_broker: int | None,
    brokers: list[int],
    options: AnalyzeOptions,
    result: AnalyzeResult,
) -> Headroom:
    """Headroom against the capacity file (now and with the busiest broker lost), sizing, budget."""
    headroom_rows: list[cap.Headroom] = []
    loss_rows: list[cap.Headroom] = []
    if capacity_file is not None:
        headroom_rows = cap.headroom(
            headroom_loads(stats, options.headroom_resolution, "observed", options.headroom_stat),
            capacity_file,
            thresholds,
            options.monthly_growth,
        )
        if lost_broker is not None and len(brokers) > 1:
            loss_rows = cap.headroom(
                headroom_loads(
                    stats, options.headroom_resolution, f"without_broker_{lost_broker}", options.headroom_stat
                ),
                capacity_file,
                thresholds,
                options.monthly_growth,
            )
        result.tables["headroom"] = pd.DataFrame([row.as_dict() for row in headroom_rows])
        if loss_rows:
            result.tables["headroom_broker_lost"] = pd.DataFrame([row.as_dict() for row in loss_rows])
    binding = cap.binding_constraint(headroom_rows)
    if options.budget_min_runway_months is not None and binding is not None:
        months = binding.runway_months
        if months is not None and months < options.budget_min_runway_months:
            result.budget_violations.append(
                f"growth runway {months:.1f} months on broker {binding.broker} {binding.resource} "
                f"is below the budget of {options.budget_min_runway_months} months"
            )
    return Headroom(
        rows=headroom_rows,
        loss_rows=loss_rows,
        binding=binding,
        binding_loss=cap.binding_constraint(loss_rows),
        sizing=_sizing(stats, capacity_file, brokers, options) if capacity_file is not None else None,
    )


def run_analyze(spark: SparkSession, options: AnalyzeOptions, progress: Progress | None = None) -> AnalyzeResult:
    """Extract and transform; returns the results for `load` (report.write_analyze_outputs)."""
    progress = progress or Progress("analyze", 8)
    if options.headroom_stat not in STATS:
        raise ValueError(f"headroom stat must be one of {STATS}")
    if options.headroom_resolution not in RESOLUTIONS:
        raise ValueError(f"headroom resolution must be one of {tuple(RESOLUTIONS)}")
    capacity_file = load_capacity(options.capacity) if options.capacity else None
    thresholds = {cap.NW_IN: options.nw_in_threshold, cap.NW_OUT: options.nw_out_threshold}

    data = extract(spark, options)
    # The passes over single requests (the partition entries, the latencies) read the capture
    # on their own, needing no other pass's result, so two more driver threads run them beside
    # this one's traffic pass: the three passes' tasks take the cores whenever one pass leaves
    # them idle (its final stage of a few tasks, its collect, the pandas work after it; run one
    # after the other, the latency pass was the last 5 s of a 29 s application at 10M requests,
    # begun only once the entries were in). Their figures are the same: a query's result does
    # not depend on what else the session runs.
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="kqp-analyze-passes") as pool:
        entry_figures = pool.submit(_entry_figures, data.requests)
        latencies = pool.submit(_latency_figures, data.requests)
        result = _transform(data, options, capacity_file, thresholds, entry_figures, latencies, progress)
    return result


def _transform(
    data: Extracted,
    options: AnalyzeOptions,
    capacity_file: cap.CapacityFile | None,
    thresholds: dict[str, float],
    entry_figures: Future[tuple[pd.DataFrame, pd.DataFrame]],
    latencies: Future[pd.DataFrame],
    progress: Progress,
) -> AnalyzeResult:
    """run_analyze's steps after the extract, the other thread's passes arriving as futures."""
    traffic = to_pandas(data.traffic)
    coverage = coverage_of(traffic, options)
    progress.step(f"read capture: {coverage.row['rows']} requests")
    result = AnalyzeResult(summary={})
    limits = network_limits(capacity_file, coverage.brokers, thresholds)
    stats, lost_broker = _throughput(traffic, coverage, options, limits, result, progress)
    partitions, batches = entry_figures.result()
    partitions["mean_bytes_per_s"] = partitions["bytes"] / max(coverage.duration_s, 1.0)
    pareto, clients = _shares(traffic, partitions, options, result)
    progress.step("shares of principals, client-ids and topics")
    broker_bytes = _partitions(partitions, stats, result)
    progress.step("partition hot spots and skew")
    _batch_mix(batches, result)
    progress.step("batch-size mix")
    _latency_errors_throttles(latencies.result(), coverage, clients, result)
    progress.step("latency, errors and throttles")
    headroom = _headroom(stats, capacity_file, thresholds, lost_broker, coverage.brokers, options, result)
    topics = int(partitions["topic"].nunique())
    result.summary = _summary(
        options, thresholds, coverage, topics, stats, lost_broker, headroom, pareto, broker_bytes, result
    )
    return result


def _sizing(
    stats: pd.DataFrame, capacity_file: cap.CapacityFile, brokers: Sequence[int], options: AnalyzeOptions
) -> dict[str, Any]:
    """Brokers needed for the cluster's network load now and after 12 months of growth."""
    rows = stats[
        (stats["resolution"] == options.headroom_resolution)
        & (stats["scenario"] == "observed")
        & (stats["scope"] == "cluster")
        & stats["metric"].isin(list(RESOURCE_OF_METRIC))
    ]
    load = {RESOURCE_OF_METRIC[r.metric]: float(getattr(r, options.headroom_stat)) for r in rows.itertuples()}
    # A new broker is assumed to be like the current ones on average.
    per_broker = {
        resource: sum(capacity_file.for_broker(b).network_bytes_per_s(resource) for b in brokers) / len(brokers)
        for resource in cap.NETWORK_RESOURCES
    }
    # A topic with RF replicas needs RF brokers, whatever the load.
    minimum = max(1, options.replication_factor)
    year = options.monthly_growth**12
    return {
        "basis": f"cluster {options.headroom_stat} of {options.headroom_resolution} series",
        "target_utilisation": options.target_utilisation,
        "cluster_load_bytes_per_s": load,
        "now": cap.brokers_needed(load, per_broker, options.target_utilisation, minimum),
        "in_12_months": cap.brokers_needed(
            {r: v * year for r, v in load.items()}, per_broker, options.target_utilisation, minimum
        ),
        "brokers_now": len(brokers),
    }


def _summary(
    options: AnalyzeOptions,
    thresholds: dict[str, float],
    coverage: Coverage,
    topics: int,
    stats: pd.DataFrame,
    lost_broker: int | None,
    headroom: Headroom,
    pareto: dict[str, Any],
    broker_bytes: pd.Series,
    result: AnalyzeResult,
) -> dict[str, Any]:
    """summary.json: the figures a reader (or a CI gate) wants without opening the tables."""
    brokers, row, footer = coverage.brokers, coverage.row, coverage.footer
    tables = result.tables
    throttles, errors = tables["throttles"], tables["errors"]

    def peak(scope: str, metric: str, broker: int | None = None) -> dict[str, Any]:
        # Peaks are always read from the 1 s observed series: the finest the capture gives.
        rows = stats[
            (stats["resolution"] == "1s")
            & (stats["scenario"] == "observed")
            & (stats["scope"] == scope)
            & (stats["metric"] == metric)
        ]
        if broker is not None:
            rows = rows[rows["broker"] == broker]
        if rows.empty:
            return {}
        first = rows.iloc[0]
        return {
            **{name: float(first[name]) for name in ("mean", *STATS)},
            "max_at": pd.Timestamp(first["max_at"]).isoformat(),
        }

    def throttle_total(column: str) -> float:
        return float(throttles[column].sum()) if len(throttles) else 0.0

    peak_metrics = ("produce_bytes", "fetch_bytes", "requests", "connections", "nw_in", "nw_out")
    return {
        "schema": SUMMARY_SCHEMA,
        "generated_at": pd.Timestamp.now(tz="UTC").isoformat(),
        "options": {
            "capture": options.capture,
            "replication_factor": options.replication_factor,
            "capacity": options.capacity,
            "thresholds": thresholds,
            "monthly_growth": options.monthly_growth,
            "headroom_basis": f"{options.headroom_stat} of {options.headroom_resolution} series",
            "top_n": options.top_n,
        },
        "coverage": {
            "first_request": pd.Timestamp(row["first_us"], unit="us", tz="UTC").isoformat(),
            "last_request": pd.Timestamp(row["last_us"], unit="us", tz="UTC").isoformat(),
            "duration_s": coverage.duration_s,
            "rows": int(row["rows"]),
            "requests": float(row["requests"]),
            "client_ids": int(row["client_ids"]),
            "principals": int(row["principals"]),
            "connections": int(row["connections"]),
            "topics": topics,
            "brokers": brokers,
            "sampling_one_in": sorted(int(s) for s in row["sampling_one_in"]),
            "files": footer.files if footer else None,
            "records_written": footer.records_written if footer else None,
            "records_dropped": footer.records_dropped if footer else None,
            "capture_coverage": footer.coverage if footer else None,
            "api_mix": [
                {
                    "api_key": int(r.api_key),
                    "api": r.api,
                    "api_version": int(r.api_version),
                    "requests": float(r.requests),
                }
                for r in coverage.api_mix.itertuples()
            ],
        },
        "peaks": {
            "cluster": {metric: peak("cluster", metric) for metric in peak_metrics},
            "brokers": {str(b): {metric: peak("broker", metric, b) for metric in peak_metrics} for b in brokers},
        },
        "headroom": {
            "rows": [r.as_dict() for r in headroom.rows],
            "binding_constraint": headroom.binding.as_dict() if headroom.binding else None,
            "broker_lost": lost_broker if len(brokers) > 1 else None,
            "rows_broker_lost": [r.as_dict() for r in headroom.loss_rows],
            "binding_constraint_broker_lost": headroom.binding_loss.as_dict() if headroom.binding_loss else None,
            "runway_months": headroom.binding.runway_months if headroom.binding else None,
            "brokers_needed": headroom.sizing,
        },
        "shares": pareto,
        "hot_partitions": tables["partitions"]
        .head(options.top_n)[["topic", "partition", "leader", "bytes", "mean_bytes_per_s", "peak_bytes_per_s"]]
        .to_dict(orient="records"),
        "skew": {
            "broker_bytes_max_over_mean": skew(broker_bytes),
            "topics": tables["topic_skew"].head(options.top_n).to_dict(orient="records"),
        },
        "batch_mix": tables["batch_mix"].to_dict(orient="records"),
        "latency_by_api": tables["latency_by_api"].to_dict(orient="records"),
        "errors": {
            "total": float(errors["requests"].sum()) if len(errors) else 0.0,
            "by_api_and_code": errors.to_dict(orient="records"),
        },
        "throttles": {
            "broker_throttled_requests": throttle_total("broker_throttled"),
            "proxy_throttled_requests": throttle_total("proxy_throttled"),
            "broker_throttle_ms_total": throttle_total("broker_throttle_ms_total"),
            "proxy_throttle_ms_total": throttle_total("proxy_throttle_ms_total"),
        },
        "budget": {
            "min_runway_months": options.budget_min_runway_months,
            "violations": result.budget_violations,
        },
    }


def build_parser() -> argparse.ArgumentParser:
    # Defaults come from AnalyzeOptions, so the command line and the API cannot disagree.
    parser = argparse.ArgumentParser(
        prog="kqp replay analyze", description="Capacity analysis of a capture.", formatter_class=HelpFormatter
    )
    parser.add_argument("capture", help="capture directory (local path or Hadoop-compatible URI)")
    parser.add_argument("--output", required=True, help="output directory (local to the driver)")
    parser.add_argument(
        "--replication-factor",
        type=int,
        default=AnalyzeOptions.replication_factor,
        help="replicas per partition, to model the followers' NW_IN and the leaders' NW_OUT",
    )
    parser.add_argument(
        "--capacity", help="Cruise Control capacity JSON file (default: none, no headroom, sizing or runway)"
    )
    parser.add_argument(
        "--nw-in-threshold",
        type=float,
        default=AnalyzeOptions.nw_in_threshold,
        help="share of a broker's NW_IN capacity it may use (the limit is capacity x threshold)",
    )
    parser.add_argument(
        "--nw-out-threshold",
        type=float,
        default=AnalyzeOptions.nw_out_threshold,
        help="share of a broker's NW_OUT capacity it may use",
    )
    parser.add_argument("--monthly-growth", type=float, default=AnalyzeOptions.monthly_growth,
                        help="growth factor per month (1.05 = +5%%)")
    parser.add_argument(
        "--target-utilisation", type=float, default=AnalyzeOptions.target_utilisation,
        help="network share per broker to size for (0.6 = 60%%)",
    )
    parser.add_argument("--top-n", type=int, default=AnalyzeOptions.top_n, help="rows in each top-N table")
    parser.add_argument(
        "--headroom-stat",
        choices=STATS,
        default=AnalyzeOptions.headroom_stat,
        help="statistic of a broker's network series judged against its limit",
    )
    parser.add_argument(
        "--headroom-resolution",
        choices=tuple(RESOLUTIONS),
        default=AnalyzeOptions.headroom_resolution,
        help="bucket length of the series the headroom statistic is taken over",
    )
    parser.add_argument(
        "--budget-min-runway-months",
        type=float,
        help="exit 3 when the growth runway is shorter than this (default: no budget)",
    )
    parser.add_argument("--start", help="ISO time: analyse requests from this instant (UTC) (default: the first)")
    parser.add_argument("--end", help="ISO time: analyse requests before this instant (UTC) (default: to the last)")
    parser.add_argument("--master", help="Spark master URL (default: spark-submit's, else local[*])")
    return parser


def _iso_to_us(text: str | None) -> int | None:
    """An ISO instant as capture time (µs since the epoch); a naive time is read as UTC,
    the capture's own zone, not the driver's local zone."""
    if text is None:
        return None
    stamp = pd.Timestamp(text)
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
    return int(stamp.value // 1000)


def options_from_args(args: argparse.Namespace) -> AnalyzeOptions:
    return AnalyzeOptions(
        capture=args.capture,
        output=args.output,
        replication_factor=args.replication_factor,
        capacity=args.capacity,
        nw_in_threshold=args.nw_in_threshold,
        nw_out_threshold=args.nw_out_threshold,
        monthly_growth=args.monthly_growth,
        target_utilisation=args.target_utilisation,
        top_n=args.top_n,
        headroom_stat=args.headroom_stat,
        headroom_resolution=args.headroom_resolution,
        budget_min_runway_months=args.budget_min_runway_months,
        start_us=_iso_to_us(args.start),
        end_us=_iso_to_us(args.end),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run analyze; exit 0, or 3 when a budget is violated."""
    # Imported here so that importing the module (tests, the replay CLI's --help) does not
    # load matplotlib, which only the report needs.
    from kqp.spark_jobs.report import write_analyze_outputs
    from kqp.spark_jobs.session import get_spark

    args = build_parser().parse_args(argv)
    options = options_from_args(args)
    spark = get_spark("kqp-analyze", args.master)
    progress = Progress("analyze", 9)
    result = run_analyze(spark, options, progress)
    write_analyze_outputs(result, options.output)
    result.release()
    progress.step(f"wrote {options.output}/report.html and summary.json")
    for violation in result.budget_violations:
        print(f"BUDGET VIOLATED: {violation}", file=sys.stderr)
    return BUDGET_EXIT_CODE if result.budget_violations else 0


if __name__ == "__main__":
    sys.exit(main())
