"""`analyze`'s transforms: the Spark aggregations over a capture, and the driver-side shaping of
their (small) results into series, statistics and tables.

Pure: no reading, no writing (that is `analyze.extract` and `report.write_analyze_outputs`);
the job's figures are tested on a local session against figures recomputed with pandas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from kqp.protocol.api_keys import ApiKey
from kqp.quotas import capacity as cap
from kqp.spark_jobs.capture_source import US_PER_SECOND
from kqp.spark_jobs.common import ANONYMOUS

# Exact percentiles for the throughput series (one value per second or minute: few enough
# rows for Spark's exact `percentile`), approximate ones for per-request latency below.
PERCENTILES = (0.5, 0.95, 0.99, 0.999)
PERCENTILE_NAMES = ("p50", "p95", "p99", "p99_9")
STATS = (*PERCENTILE_NAMES, "max")
# Series resolutions, in seconds per bucket: 1 s shows the bursts a broker's network
# feels; 1 min is what most dashboards (and capacity plans) are drawn at.
RESOLUTIONS = {"1s": 1, "1min": 60}

# Additive per-bucket metrics of a throughput series (rates in bytes/s or requests/s).
ADDITIVE_METRICS = ("produce_bytes", "fetch_bytes", "bytes_in", "bytes_out", "requests")
NETWORK_METRICS = ("replication_in", "replication_out", "nw_in", "nw_out")
SERIES_METRICS = (*ADDITIVE_METRICS, "connections", *NETWORK_METRICS)
RESOURCE_OF_METRIC = {"nw_in": cap.NW_IN, "nw_out": cap.NW_OUT}

# Batch-size buckets (upper bounds, bytes). Google's sizing notes flag batches under 10 KB
# as CPU-expensive; the edges are powers of ten around that.
BATCH_BUCKETS = ((1_000, "<1KB"), (10_000, "1-10KB"), (100_000, "10-100KB"), (1_000_000, "100KB-1MB"))
BATCH_BUCKET_LAST = ">=1MB"
SMALL_BATCH_BYTES = 10_000
# Approximate percentiles for request latency: rank error 1/accuracy.
LATENCY_ACCURACY = 10_000
# The Pareto summary reports how few entities carry this share of the bytes.
PARETO_SHARE = 0.8


def prepare_requests(raw: DataFrame) -> DataFrame:
    """One row per request with the derived columns every figure uses."""
    has_response = F.col("ts_response_sent_us").isNotNull()
    # Column choices that every figure below relies on:
    # * broker -1: requests on the bootstrap listener, before the client knew a node id;
    # * weight: the sampling factor, so sums over sampled captures estimate the whole;
    # * produce_bytes are request sizes and fetch_bytes response sizes, as Kafka's
    #   BytesInPerSec / BytesOutPerSec and its produce / fetch quotas count them;
    # * latency_ms is what the client saw through the proxy (request in to response out),
    #   broker_latency_ms the upstream round trip alone.
    return raw.select(
        F.col("ts_request_received_us").alias("ts_us"),
        F.floor(F.col("ts_request_received_us") / US_PER_SECOND).cast("long").alias("second"),
        F.coalesce(F.col("upstream_node_id"), F.lit(-1)).alias("broker"),
        F.coalesce(F.col("sampling_one_in"), F.lit(1)).cast("double").alias("weight"),
        "connection_id",
        F.coalesce(F.col("principal"), F.lit(ANONYMOUS)).alias("principal"),
        F.coalesce(F.col("client_id"), F.lit("")).alias("client_id"),
        F.col("api_key").cast("int").alias("api_key"),
        F.col("api_version").cast("int").alias("api_version"),
        F.col("request_bytes").cast("double").alias("request_bytes"),
        F.coalesce(F.col("response_bytes"), F.lit(0)).cast("double").alias("response_bytes"),
        F.when(F.col("api_key") == ApiKey.PRODUCE, F.col("request_bytes"))
        .otherwise(0)
        .cast("double")
        .alias("produce_bytes"),
        F.when(F.col("api_key") == ApiKey.FETCH, F.coalesce(F.col("response_bytes"), F.lit(0)))
        .otherwise(0)
        .cast("double")
        .alias("fetch_bytes"),
        F.when(has_response, (F.col("ts_response_sent_us") - F.col("ts_request_received_us")) / 1000.0).alias(
            "latency_ms"
        ),
        F.when(
            F.col("ts_response_received_us").isNotNull(),
            (F.col("ts_response_received_us") - F.col("ts_request_sent_us")) / 1000.0,
        ).alias("broker_latency_ms"),
        F.coalesce(F.col("error_code"), F.lit(0)).cast("int").alias("error_code"),
        F.coalesce(F.col("broker_throttle_ms"), F.lit(0)).alias("broker_throttle_ms"),
        F.coalesce(F.col("proxy_throttle_ms"), F.lit(0)).alias("proxy_throttle_ms"),
        "partitions",
        F.aggregate("partitions", F.lit(0.0), lambda acc, p: acc + F.coalesce(p["records"], F.lit(0))).alias("records"),
    )


def explode_partitions(requests: DataFrame) -> DataFrame:
    """One row per (request, topic-partition) for Produce and Fetch."""
    carried = ("second", "broker", "weight", "api_key", "principal", "client_id", "ts_us")
    return (
        requests.where(F.col("api_key").isin(ApiKey.PRODUCE, ApiKey.FETCH))
        .select(*carried, F.explode("partitions").alias("p"))
        .select(
            *carried,
            F.col("p.topic").alias("topic"),
            F.col("p.partition").alias("partition"),
            F.col("p.bytes").cast("double").alias("bytes"),
            F.coalesce(F.col("p.records"), F.lit(0)).cast("double").alias("records"),
            F.coalesce(F.col("p.batches"), F.lit(0)).alias("batches"),
            F.col("p.compression").alias("compression"),
        )
    )


def aggregate_traffic(requests: DataFrame) -> DataFrame:
    """Requests summed per (second, broker, connection, principal, client-id, API, error code).

    Every throughput, share and throttle figure is a sum over these groups, so they are
    computed from this table, which is far smaller than the capture (a connection sends many
    requests of one API per second), instead of passing over every request again. Sums are
    weighted by the sampling factor.
    """
    weighted = {
        "bytes_in": "request_bytes",
        "bytes_out": "response_bytes",
        "produce_bytes": "produce_bytes",
        "fetch_bytes": "fetch_bytes",
        "broker_throttle_ms_total": "broker_throttle_ms",
        "proxy_throttle_ms_total": "proxy_throttle_ms",
    }
    keys = ("second", "broker", "connection_id", "principal", "client_id", "api_key", "api_version", "error_code")
    return requests.groupBy(*keys).agg(
        F.count("*").alias("rows"),
        F.sum("weight").alias("requests"),
        F.max("weight").alias("weight"),
        F.min("ts_us").alias("first_us"),
        F.max("ts_us").alias("last_us"),
        *[F.sum(F.col(column) * F.col("weight")).alias(name) for name, column in weighted.items()],
        F.sum(F.when(F.col("broker_throttle_ms") > 0, F.col("weight")).otherwise(0.0)).alias("broker_throttled"),
        F.max("broker_throttle_ms").alias("broker_throttle_ms_max"),
        F.sum(F.when(F.col("proxy_throttle_ms") > 0, F.col("weight")).otherwise(0.0)).alias("proxy_throttled"),
        F.max("proxy_throttle_ms").alias("proxy_throttle_ms_max"),
    )


def _bucketed(traffic: DataFrame, unit_seconds: int) -> DataFrame:
    """Adds `bucket`: the capture second's bucket of `unit_seconds` (bucket b covers [b x unit, (b+1) x unit))."""
    return traffic.withColumn("bucket", F.floor(F.col("second") / unit_seconds).cast("long"))


def _grid(spark: SparkSession, bucket_range: tuple[int, int], unit_seconds: int, brokers: Sequence[int]) -> DataFrame:
    """Every (bucket, broker) of the capture window, with the seconds of the window in the bucket.

    The first and last buckets are usually partial: their rates are averages over the seconds
    captured, not over the whole bucket, so the edges of a capture do not look like dips.
    """
    first_second, last_second = bucket_range
    buckets = spark.range(first_second // unit_seconds, last_second // unit_seconds + 1).withColumnRenamed(
        "id", "bucket"
    )
    start = F.col("bucket") * unit_seconds
    covered = F.least(start + unit_seconds - 1, F.lit(last_second)) - F.greatest(start, F.lit(first_second)) + 1
    return buckets.withColumn("covered_s", covered.cast("double")).crossJoin(
        spark.createDataFrame([(b,) for b in brokers], "broker int")
    )


def throughput_series(
    spark: SparkSession,
    traffic: DataFrame,
    unit_seconds: int,
    bucket_range: tuple[int, int],
    brokers: Sequence[int],
) -> DataFrame:
    """Per broker and bucket: rates of the additive metrics and distinct connections.

    Rates are per-second averages over the captured seconds of the bucket; every bucket of the
    capture window is present (zeros where a broker was idle). `traffic` is aggregate_traffic's
    table.
    """
    # Sampled connections stand for N connections each.
    connections = F.countDistinct("connection_id") * F.max("weight")
    aggregated = (
        _bucketed(traffic, unit_seconds)
        .groupBy("broker", "bucket")
        .agg(*[F.sum(m).alias(m) for m in ADDITIVE_METRICS], connections.alias("connections"))
    )
    grid = _grid(spark, bucket_range, unit_seconds, brokers)
    filled = grid.join(aggregated, ["broker", "bucket"], "left").fillna(0.0)
    return filled.select(
        "broker",
        "bucket",
        F.timestamp_seconds(F.col("bucket") * unit_seconds).alias("window_start"),
        *[(F.col(m) / F.col("covered_s")).alias(m) for m in ADDITIVE_METRICS],
        F.col("connections").cast("double").alias("connections"),
    )


def earliest_max_by(when: str, value: str) -> Column:
    """`when` of the row with the largest `value`, the earliest one among ties.

    F.max_by picks any of the tied rows, depending on how the rows were partitioned: a cluster
    and local[*] reported different times for the same peak (measured, connection peaks).
    """
    key = F.when(F.col(value).isNotNull(), F.struct(-F.col(value), F.col(when)))
    return F.min_by(when, key)


def client_burstiness(traffic: DataFrame) -> DataFrame:
    """Per client-id: median and p99 of its bytes/s over the seconds it was active, and their ratio."""
    per_second = traffic.groupBy("client_id", "second").agg(F.sum(F.col("bytes_in") + F.col("bytes_out")).alias("bps"))
    return (
        per_second.groupBy(F.col("client_id").alias("entity"))
        .agg(F.percentile("bps", [0.5, 0.99]).alias("q"), F.count("*").alias("active_seconds"))
        .select(
            "entity",
            "active_seconds",
            F.col("q")[0].alias("active_p50_bytes_per_s"),
            F.col("q")[1].alias("active_p99_bytes_per_s"),
            (F.col("q")[1] / F.col("q")[0]).alias("burstiness"),
        )
    )


def _batch_bucket(batch_bytes: Any) -> Any:
    """A Spark expression labelling a batch size with its BATCH_BUCKETS class (first upper bound above it)."""
    expression = F.lit(BATCH_BUCKET_LAST)
    for upper, label in reversed(BATCH_BUCKETS):
        expression = F.when(batch_bytes < upper, label).otherwise(expression)
    return expression


def latency_by_api(requests: DataFrame) -> DataFrame:
    """Latency percentiles at the proxy and to the broker, per (API key, broker) and per API key.

    One pass (a rollup): rows with a null broker are the API-wide figures.
    """
    answered = requests.where(F.col("latency_ms").isNotNull())
    return (
        answered.rollup("api_key", "broker")
        .agg(
            F.count("*").alias("responses"),
            F.percentile_approx("latency_ms", list(PERCENTILES), LATENCY_ACCURACY).alias("q"),
            F.max("latency_ms").alias("max_ms"),
            F.percentile_approx("broker_latency_ms", list(PERCENTILES), LATENCY_ACCURACY).alias("bq"),
            F.max("broker_latency_ms").alias("broker_max_ms"),
        )
        .where(F.col("api_key").isNotNull())
        .select(
            "api_key",
            "broker",
            "responses",
            *[F.col("q")[i].alias(f"{name}_ms") for i, name in enumerate(PERCENTILE_NAMES)],
            "max_ms",
            *[F.col("bq")[i].alias(f"broker_{name}_ms") for i, name in enumerate(PERCENTILE_NAMES)],
            "broker_max_ms",
        )
    )


# ---------------------------------------------------------------- the aggregates analyze collects
#
# analyze passes over the capture a few times, each pass reading only the columns it needs, and
# brings small aggregates to the driver: one row per (broker, second), per entity, per partition,
# per client. Every series, percentile and share is computed from those on the driver
# (driver-side shaping below), so the Spark work is a handful of aggregations, not one job per
# series statistic.


def broker_second_totals(traffic: DataFrame, api_keys: Sequence[int]) -> DataFrame:
    """Per (broker, second): the additive metrics, distinct connections and requests per API key.

    The 1 s series are these rows; the coarser ones are their sums (connections excepted:
    distinct counts do not add, see bucket_connections). Sums of whole bytes and requests are
    exact in doubles, so summing seconds gives the figures summing requests would.
    """
    # Sampled connections stand for N connections each.
    connections = F.countDistinct("connection_id") * F.max("weight")
    return traffic.groupBy("broker", "second").agg(
        *[F.sum(m).alias(m) for m in ADDITIVE_METRICS],
        connections.alias("connections"),
        *[
            F.sum(F.when(F.col("api_key") == key, F.col("requests")).otherwise(0.0)).alias(_api_column(key))
            for key in api_keys
        ],
    )


def _api_column(api_key: int) -> str:
    return f"requests_api_{api_key}"


def bucket_connections(traffic: DataFrame, unit_seconds: int) -> DataFrame:
    """Per (broker, bucket of `unit_seconds`): distinct connections (x the sampling factor)."""
    connections = F.countDistinct("connection_id") * F.max("weight")
    return _bucketed(traffic, unit_seconds).groupBy("broker", "bucket").agg(connections.alias("connections"))


# The per-entity sums every share and throttle table is made of.
ENTITY_SUMS = ("requests", "bytes_in", "bytes_out", "produce_bytes", "fetch_bytes")
THROTTLE_SUMS = ("broker_throttled", "broker_throttle_ms_total", "proxy_throttled", "proxy_throttle_ms_total")
THROTTLE_MAXIMA = ("broker_throttle_ms_max", "proxy_throttle_ms_max")


def client_totals(traffic: DataFrame) -> DataFrame:
    """Per (broker, principal, client-id): requests, bytes and throttles.

    The shares of principals, client-ids and (principal, client-id), each broker's clients and
    the throttle table are all sums of these rows (driver-side: entity_totals and friends).
    """
    return traffic.groupBy("broker", "principal", "client_id").agg(
        *[F.sum(m).alias(m) for m in (*ENTITY_SUMS, *THROTTLE_SUMS)],
        *[F.max(m).alias(m) for m in THROTTLE_MAXIMA],
    )


def api_error_totals(traffic: DataFrame) -> DataFrame:
    """Requests per (API key, API version, error code): the API mix and the error table."""
    return traffic.groupBy("api_key", "api_version", "error_code").agg(F.sum("requests").alias("requests"))


def partition_totals(requests: DataFrame, duration_s: float) -> DataFrame:
    """Per topic-partition: leader, requests, bytes in/out, records produced, mean and peak bytes/s.

    One pass over the exploded Produce and Fetch partitions: per (partition, second) sums, then
    per partition their sums and the peak second. Topic totals are sums of these rows.
    """
    parts = explode_partitions(requests)
    weighted = F.col("bytes") * F.col("weight")
    produce = F.col("api_key") == ApiKey.PRODUCE
    per_second = parts.groupBy("topic", "partition", "second").agg(
        F.max("broker").alias("leader"),
        F.sum("weight").alias("requests"),
        F.sum(F.when(produce, weighted).otherwise(0.0)).alias("produce_bytes"),
        F.sum(F.when(F.col("api_key") == ApiKey.FETCH, weighted).otherwise(0.0)).alias("fetch_bytes"),
        F.sum(F.when(produce, F.col("records") * F.col("weight")).otherwise(0.0)).alias("produced_records"),
        F.sum(weighted).alias("bps"),
    )
    return (
        per_second.groupBy("topic", "partition")
        .agg(
            F.max("leader").alias("leader"),
            *[F.sum(m).alias(m) for m in ("requests", "produce_bytes", "fetch_bytes", "produced_records")],
            F.max("bps").alias("peak_bytes_per_s"),
            earliest_max_by("second", "bps").alias("peak_second"),
        )
        .withColumn("bytes", F.col("produce_bytes") + F.col("fetch_bytes"))
        .withColumn("mean_bytes_per_s", F.col("bytes") / F.lit(max(duration_s, 1.0)))
    )


def _bucket_column(label: str, what: str) -> str:
    return f"{what}:{label}"


def produce_batches_by_client(requests: DataFrame) -> DataFrame:
    """Per client-id, from its Produce requests in one pass: requests, records per request
    (p50/p95), mean/median batch size, share of small batches, and its batches and bytes in
    each BATCH_BUCKETS class (weighted; the overall batch mix is their sum).

    Each request becomes one row per partition entry (`posexplode_outer`: a request without
    partitions stays as one row); the request-level figures read the first row of each request
    only, the batch figures the entries with batches.
    """
    produce = requests.where(F.col("api_key") == ApiKey.PRODUCE).select(
        "client_id", "weight", "records", F.posexplode_outer("partitions").alias("position", "p")
    )
    first_of_request = F.col("position").isNull() | (F.col("position") == 0)
    batches = F.coalesce(F.col("p.batches"), F.lit(0))
    batch_bytes_total = F.col("p.bytes").cast("double")
    with_batches = batches > 0
    batch_bytes = batch_bytes_total / batches
    bucket = _batch_bucket(batch_bytes)
    labels = [label for _, label in BATCH_BUCKETS] + [BATCH_BUCKET_LAST]
    per_bucket = [
        aggregate
        for label in labels
        for aggregate in (
            F.sum(F.when(with_batches & (bucket == label), batches * F.col("weight"))).alias(
                _bucket_column(label, "batches")
            ),
            F.sum(F.when(with_batches & (bucket == label), batch_bytes_total * F.col("weight"))).alias(
                _bucket_column(label, "bytes")
            ),
        )
    ]
    return (
        produce.groupBy("client_id")
        .agg(
            F.count(F.when(first_of_request, 1)).alias("produce_requests"),
            F.percentile_approx(F.when(first_of_request, F.col("records")), [0.5, 0.95], LATENCY_ACCURACY).alias("q"),
            (F.sum(F.when(with_batches, batch_bytes_total)) / F.sum(F.when(with_batches, batches))).alias(
                "mean_batch_bytes"
            ),
            F.percentile_approx(F.when(with_batches, batch_bytes), 0.5, LATENCY_ACCURACY).alias("median_batch_bytes"),
            (
                F.sum(F.when(with_batches, F.when(batch_bytes < SMALL_BATCH_BYTES, batches).otherwise(0)))
                / F.sum(F.when(with_batches, batches))
            ).alias("small_batch_share"),
            *per_bucket,
        )
        .select(
            "client_id",
            "produce_requests",
            F.col("q")[0].alias("p50_records_per_request"),
            F.col("q")[1].alias("p95_records_per_request"),
            "mean_batch_bytes",
            "median_batch_bytes",
            "small_batch_share",
            *[_bucket_column(label, what) for label in labels for what in ("batches", "bytes")],
        )
    )


# ---------------------------------------------------------------- series and their statistics (pandas)


def bucket_series(
    per_second: pd.DataFrame,
    unit_seconds: int,
    bucket_range: tuple[int, int],
    brokers: Sequence[int],
    api_keys: Sequence[int],
    connections: pd.DataFrame | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The throughput series per broker and bucket, and the requests per API key, from
    broker_second_totals' rows.

    Rates are per-second averages over the captured seconds of the bucket (the first and last
    buckets are usually partial, and an edge of the capture must not look like a dip); every
    bucket of the capture window is present, zeros where a broker was idle, so percentiles count
    idle seconds. `connections` (bucket_connections' rows) is needed for buckets longer than 1 s.
    Returns (broker series, API series), column for column what analyze writes.
    """
    first_second, last_second = bucket_range
    buckets = np.arange(first_second // unit_seconds, last_second // unit_seconds + 1, dtype=np.int64)
    start = buckets * unit_seconds
    covered = (np.minimum(start + unit_seconds - 1, last_second) - np.maximum(start, first_second) + 1).astype(float)
    grid = pd.MultiIndex.from_product([list(brokers), buckets], names=["broker", "bucket"])
    covered_s = np.tile(covered, len(brokers))
    window_start = pd.to_datetime(np.tile(start, len(brokers)), unit="s")

    api_columns = [_api_column(key) for key in api_keys]
    keyed = per_second.assign(bucket=per_second["second"] // unit_seconds)
    summed = keyed.groupby(["broker", "bucket"])[[*ADDITIVE_METRICS, *api_columns]].sum().reindex(grid, fill_value=0.0)
    if unit_seconds == 1:
        distinct = keyed.set_index(["broker", "bucket"])["connections"]
    else:
        if connections is None:
            raise ValueError("buckets longer than 1 s need their own distinct connection counts")
        distinct = connections.set_index(["broker", "bucket"])["connections"]
    distinct = distinct.reindex(grid, fill_value=0.0).astype(float)

    series = pd.DataFrame(
        {
            "broker": grid.get_level_values("broker").astype(np.int32),
            "bucket": grid.get_level_values("bucket").astype(np.int64),
            "window_start": window_start,
            **{m: summed[m].to_numpy(dtype=float) / covered_s for m in ADDITIVE_METRICS},
            "connections": distinct.to_numpy(),
        }
    )
    api_series = pd.concat(
        [
            pd.DataFrame(
                {
                    "broker": series["broker"],
                    "bucket": series["bucket"],
                    "api_key": np.int32(key),
                    "window_start": series["window_start"],
                    "requests": summed[_api_column(key)].to_numpy(dtype=float) / covered_s,
                }
            )
            for key in api_keys
        ],
        ignore_index=True,
    )
    return series, api_series


def with_replication(series: pd.DataFrame, replication_factor: int, broker_count: int) -> pd.DataFrame:
    """Add modelled follower traffic and total network in/out per broker and bucket.

    The proxy never sees replication, so it is modelled: every byte a leader takes in is
    fetched by RF-1 followers (the leader's extra outbound), and followers are spread evenly
    over the other brokers, so a broker takes in (RF-1)/(N-1) of every other leader's bytes.
    RF is capped at the broker count. replication_out = (RF-1) x produce, replication_in =
    (RF-1)/(N-1) x (cluster produce - own produce); nw_in = all client request bytes +
    replication_in, nw_out = all client response bytes + replication_out.
    """
    followers = min(replication_factor, broker_count) - 1
    frame = series.copy()
    if followers <= 0 or broker_count <= 1:
        frame["replication_in"] = 0.0
        frame["replication_out"] = 0.0
    else:
        cluster_produce = frame.groupby("bucket")["produce_bytes"].transform("sum")
        frame["replication_in"] = (cluster_produce - frame["produce_bytes"]) * (followers / (broker_count - 1))
        frame["replication_out"] = frame["produce_bytes"] * float(followers)
    frame["nw_in"] = frame["bytes_in"] + frame["replication_in"]
    frame["nw_out"] = frame["bytes_out"] + frame["replication_out"]
    # The bucket first, as the tables have always been written (a join on it put it there).
    return frame[["bucket", *[c for c in frame.columns if c != "bucket"]]]


def without_broker(series: pd.DataFrame, lost: int, replication_factor: int, broker_count: int) -> pd.DataFrame:
    """Series as if broker `lost` failed: its client traffic spread evenly over the survivors.

    Leaders move to the survivors (even re-homing), then replication is recomputed for
    N-1 brokers. Input is a series before with_replication.
    """
    survivors = broker_count - 1
    moved_metrics = [*ADDITIVE_METRICS, "connections"]
    lost_traffic = series[series["broker"] == lost].set_index("bucket")[moved_metrics]
    moved = series[series["broker"] != lost].reset_index(drop=True)
    for metric in moved_metrics:
        moved[metric] = moved[metric] + moved["bucket"].map(lost_traffic[metric]).to_numpy() / survivors
    return with_replication(moved, replication_factor, survivors)


def cluster_series(series: pd.DataFrame) -> pd.DataFrame:
    """Cluster-wide series: the sum over brokers per bucket (connections are per broker, so they add)."""
    metrics = [m for m in SERIES_METRICS if m in series.columns]
    return series.groupby(["bucket", "window_start"], as_index=False)[metrics].sum()


def exact_percentiles(values: np.ndarray, percentages: Sequence[float]) -> list[float]:
    """Spark's exact `percentile`, value for value: linear interpolation between the order
    statistics at floor and ceil of (n - 1) x p, in the form Spark 4 evaluates it
    (low + fraction x (high - low)), so the figures are those the Spark SQL aggregate gave, to
    the last bit (checked against Spark's own on a 1M-request capture: 160 of 160 equal; the
    textbook (1 - fraction) x low + fraction x high differs in the last bit for 24)."""
    ordered = np.sort(values)
    max_position = len(ordered) - 1
    result = []
    for percentage in percentages:
        position = max_position * percentage
        lower, higher = math.floor(position), math.ceil(position)
        low = float(ordered[lower])
        high = float(ordered[higher])
        if higher == lower or high == low:
            result.append(low)
        else:
            result.append(low + (position - lower) * (high - low))
    return result


STATS_COLUMNS = (
    "scope",
    "broker",
    "metric",
    "mean",
    *PERCENTILE_NAMES,
    "max",
    "max_at",
    "limit",
    "seconds_above_limit",
)


def series_stats(
    series: pd.DataFrame,
    scope: str,
    metrics: Sequence[str],
    unit_seconds: int,
    limits: dict[tuple[str, int | None, str], float] | None,
) -> list[dict[str, Any]]:
    """Mean, exact percentiles, max and the (earliest) time of the max of every metric of each
    broker's series (scope "broker") or of the cluster's (scope "cluster"), and the seconds spent
    above the limit where `limits` gives one for (scope, broker, metric)."""
    rows = []
    groups = series.groupby("broker", sort=False) if scope == "broker" else [(None, series)]
    for broker, frame in groups:
        ordered = frame.sort_values("window_start")
        times = ordered["window_start"].to_numpy()
        key_broker = None if broker is None else int(broker)
        for metric in metrics:
            values = ordered[metric].to_numpy(dtype=float)
            peak = float(values.max())
            limit = (limits or {}).get((scope, key_broker, metric))
            rows.append(
                {
                    "scope": scope,
                    "broker": key_broker,
                    "metric": metric,
                    # Correctly rounded: Spark's own sum depends on how the rows were shuffled,
                    # so the last bit of a mean of fractional rates had no one right value.
                    "mean": math.fsum(values) / len(values),
                    **dict(zip(PERCENTILE_NAMES, exact_percentiles(values, PERCENTILES), strict=True)),
                    "max": peak,
                    "max_at": times[int(np.argmax(values == peak))],
                    "limit": limit,
                    "seconds_above_limit": None if limit is None else int((values > limit).sum()) * unit_seconds,
                }
            )
    return rows


def stats_frame(rows: list[dict[str, Any]], resolution: str, scenario: str) -> pd.DataFrame:
    """series_stats' rows as the throughput_stats table, labelled with resolution and scenario."""
    frame = pd.DataFrame(rows, columns=list(STATS_COLUMNS))
    frame = frame.astype({"broker": float, "limit": float, "seconds_above_limit": float})
    frame.insert(0, "resolution", resolution)
    frame.insert(1, "scenario", scenario)
    return frame


def network_stats(
    series: pd.DataFrame,
    unit_seconds: int,
    limits: dict[tuple[str, int | None, str], float] | None,
    resolution: str,
    scenario: str,
) -> pd.DataFrame:
    """The statistics of every broker's and the cluster's series (with_replication's) at one resolution."""
    rows = series_stats(series, "broker", SERIES_METRICS, unit_seconds, limits)
    rows += series_stats(cluster_series(series), "cluster", SERIES_METRICS, unit_seconds, limits)
    return stats_frame(rows, resolution, scenario)


def api_stats(api_series: pd.DataFrame, unit_seconds: int, resolution: str, names: dict[int, str]) -> pd.DataFrame:
    """Request-count statistics per API, per broker and for the cluster; no limit applies to them."""
    wide = api_series.assign(metric="requests:" + api_series["api_key"].map(names)).pivot_table(
        index=["broker", "bucket", "window_start"], columns="metric", values="requests", aggfunc="sum"
    )
    wide.columns = list(wide.columns)
    wide = wide.reset_index()
    metrics = [f"requests:{names[key]}" for key in sorted(names)]
    rows = series_stats(wide, "broker", metrics, unit_seconds, None)
    cluster = wide.groupby(["bucket", "window_start"], as_index=False)[metrics].sum()
    rows += series_stats(cluster, "cluster", metrics, unit_seconds, None)
    return stats_frame(rows, resolution, "observed")


def network_limits(
    capacity_file: cap.CapacityFile | None, brokers: Sequence[int], thresholds: dict[str, float]
) -> dict[tuple[str, int | None, str], float] | None:
    """Each broker's NW_IN / NW_OUT limit (capacity x threshold, bytes/s) and the cluster's, their sum;
    None without a capacity file: there is then no limit to compare a load with.
    """
    if capacity_file is None:
        return None
    limits: dict[tuple[str, int | None, str], float] = {}
    totals = dict.fromkeys(RESOURCE_OF_METRIC, 0.0)
    for broker in brokers:
        broker_capacity = capacity_file.for_broker(broker)
        for metric, resource in RESOURCE_OF_METRIC.items():
            limit = broker_capacity.network_bytes_per_s(resource) * thresholds[resource]
            limits[("broker", broker, metric)] = limit
            totals[metric] += limit
    limits.update({("cluster", None, metric): limit for metric, limit in totals.items()})
    return limits


# ---------------------------------------------------------------- entity and partition tables (pandas)


def entity_totals(clients: pd.DataFrame, dimension: str) -> pd.DataFrame:
    """Requests and bytes per principal, client-id or (principal, client-id), from client_totals' rows."""
    key = clients["principal"] + " / " + clients["client_id"] if dimension == "principal_client" else clients[dimension]
    totals = clients.groupby(key.rename("entity"), dropna=False)[list(ENTITY_SUMS)].sum().reset_index()
    totals["bytes"] = totals["bytes_in"] + totals["bytes_out"]
    return totals


def client_broker_totals(clients: pd.DataFrame) -> pd.DataFrame:
    """Requests and bytes per (broker, client-id), for per-broker shares."""
    totals = clients.groupby(["broker", "client_id"], as_index=False)[["requests", "bytes_in", "bytes_out"]].sum()
    totals["bytes"] = totals["bytes_in"] + totals["bytes_out"]
    return totals.drop(columns=["bytes_in", "bytes_out"])


def throttle_counts(clients: pd.DataFrame) -> pd.DataFrame:
    """Per (principal, client-id): throttles the broker returned vs throttles the proxy applied."""
    grouped = clients.groupby(["principal", "client_id"], as_index=False).agg(
        requests=("requests", "sum"),
        **{
            f"{side}_{column}": (f"{side}_{column}", how)
            for side in ("broker", "proxy")
            for how, column in (("sum", "throttled"), ("sum", "throttle_ms_total"), ("max", "throttle_ms_max"))
        },
    )
    return grouped[(grouped["broker_throttled"] > 0) | (grouped["proxy_throttled"] > 0)]


def error_counts(api_errors: pd.DataFrame) -> pd.DataFrame:
    """Per API key and error code: responses with that error and the share of the API's responses."""
    per_api = api_errors.groupby("api_key")["requests"].sum().rename("api_requests")
    errors = (
        api_errors[api_errors["error_code"] != 0].groupby(["api_key", "error_code"], as_index=False)["requests"].sum()
    )
    errors = errors.join(per_api, on="api_key")
    errors["share"] = errors["requests"] / errors["api_requests"]
    return errors


def api_mix(api_errors: pd.DataFrame) -> pd.DataFrame:
    """Requests per (API key, API version)."""
    return api_errors.groupby(["api_key", "api_version"], as_index=False)["requests"].sum()


def topic_totals(partitions: pd.DataFrame) -> pd.DataFrame:
    """Requests and record bytes per topic (Produce in, Fetch out), from partition_totals' rows."""
    totals = (
        partitions.groupby(partitions["topic"].rename("entity"), dropna=False)[
            ["requests", "produce_bytes", "fetch_bytes"]
        ]
        .sum()
        .reset_index()
    )
    totals["bytes"] = totals["produce_bytes"] + totals["fetch_bytes"]
    return totals


def batch_tables(by_client: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(batch mix by size class, per-client batch figures) from produce_batches_by_client's rows."""
    labels = [label for _, label in BATCH_BUCKETS] + [BATCH_BUCKET_LAST]
    mix = pd.DataFrame(
        {
            "bucket": labels,
            "batches": [by_client[_bucket_column(label, "batches")].sum(min_count=1) for label in labels],
            "bytes": [by_client[_bucket_column(label, "bytes")].sum(min_count=1) for label in labels],
        }
    )
    # A class no batch fell in has no row, as in a group-by.
    mix = mix[mix["batches"].notna()].reset_index(drop=True)
    bucket_columns = [_bucket_column(label, what) for label in labels for what in ("batches", "bytes")]
    per_client = by_client.drop(columns=bucket_columns)
    return mix, per_client


# ---------------------------------------------------------------- driver-side shaping (pandas)


def rank_shares(totals: pd.DataFrame, dimension: str) -> pd.DataFrame:
    """Rank entities by bytes; add byte and request shares and the cumulative byte share."""
    frame = totals.sort_values(["bytes", "requests", "entity"], ascending=[False, False, True]).reset_index(drop=True)
    total_bytes = frame["bytes"].sum()
    total_requests = frame["requests"].sum()
    frame.insert(0, "dimension", dimension)
    frame.insert(1, "rank", range(1, len(frame) + 1))
    frame["share_bytes"] = frame["bytes"] / total_bytes if total_bytes else 0.0
    frame["share_requests"] = frame["requests"] / total_requests if total_requests else 0.0
    frame["cumulative_share_bytes"] = frame["share_bytes"].cumsum()
    return frame


def pareto_summary(ranked: pd.DataFrame, top_n: int) -> dict[str, Any]:
    """Concentration of bytes: top-1/top-N shares, entities carrying 80 %, share of the top 20 %."""
    entities = len(ranked)
    if entities == 0:
        return {"entities": 0}
    cumulative = ranked["cumulative_share_bytes"].to_numpy()
    for_pareto = int((cumulative < PARETO_SHARE - 1e-12).sum()) + 1
    top_fifth = max(1, math.ceil(entities * 0.2))
    return {
        "entities": entities,
        "top1": {"entity": ranked["entity"].iloc[0], "share_bytes": float(ranked["share_bytes"].iloc[0])},
        "top_n_share_bytes": float(ranked["share_bytes"].head(top_n).sum()),
        "entities_for_80pct_bytes": min(for_pareto, entities),
        "top_20pct_entities_share_bytes": float(ranked["share_bytes"].head(top_fifth).sum()),
        "top": [
            {"entity": row.entity, "bytes": float(row.bytes), "share_bytes": float(row.share_bytes)}
            for row in ranked.head(top_n).itertuples()
        ],
    }


def skew(values: pd.Series) -> float | None:
    """max / mean (1.0 = perfectly even); None when there is nothing to compare."""
    mean = float(values.mean()) if len(values) else 0.0
    return float(values.max()) / mean if mean > 0 else None


def topic_skew(partitions: pd.DataFrame) -> pd.DataFrame:
    """Per topic: partitions seen, total bytes and max/mean partition bytes."""
    grouped = partitions.groupby("topic")["bytes"]
    frame = pd.DataFrame(
        {
            "partitions_seen": grouped.size(),
            "bytes": grouped.sum(),
            "max_partition_bytes": grouped.max(),
            "skew": grouped.apply(skew),
        }
    ).reset_index()
    return frame.sort_values("bytes", ascending=False).reset_index(drop=True)


def resolve_lost_broker(stats: pd.DataFrame) -> int | None:
    """The busiest broker: highest mean client bytes in + out."""
    rows = stats[(stats["scope"] == "broker") & stats["metric"].isin(["bytes_in", "bytes_out"])]
    if rows.empty:
        return None
    totals = rows.groupby("broker")["mean"].sum().sort_values(ascending=False)
    return int(totals.index[0])


def ordered_stats(stats: pd.DataFrame) -> pd.DataFrame:
    """The statistics in reading order: by resolution and scenario, the cluster first, then each
    broker, and the metrics in SERIES_METRICS order.
    """
    order = {metric: i for i, metric in enumerate(SERIES_METRICS)}
    keyed = stats.assign(
        _scope=stats["scope"] != "cluster",
        _metric=stats["metric"].map(lambda m: order.get(m, len(order))),
        _broker=stats["broker"].fillna(-1),
    )
    keyed = keyed.sort_values(["resolution", "scenario", "_scope", "_broker", "_metric", "metric"], kind="stable")
    return keyed.drop(columns=["_scope", "_metric", "_broker"]).reset_index(drop=True)


def api_names(api_keys: Sequence[int]) -> dict[int, str]:
    try:
        from kqp.protocol.apis import api_name
    except ImportError:  # kafka-python missing on the driver: fall back to numbers
        return {k: f"api{k}" for k in api_keys}
    return {k: api_name(k) for k in api_keys}


def headroom_loads(stats: pd.DataFrame, resolution: str, scenario: str, stat: str) -> list[tuple[int, str, float]]:
    """(broker, NW_IN | NW_OUT, load) at the headroom statistic: what analyze compares with each limit."""
    rows = stats[
        (stats["resolution"] == resolution)
        & (stats["scenario"] == scenario)
        & (stats["scope"] == "broker")
        & stats["metric"].isin(list(RESOURCE_OF_METRIC))
    ]
    return [(int(r.broker), RESOURCE_OF_METRIC[r.metric], float(getattr(r, stat))) for r in rows.itertuples()]
