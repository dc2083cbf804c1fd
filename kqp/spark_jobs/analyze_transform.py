"""`analyze`'s transforms: DataFrames in, DataFrames out, plus driver-side shaping of small results.

Pure: no reading, no writing (that is `analyze.extract` and `report.write_analyze_outputs`);
each function is tested on a local session against figures recomputed with pandas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from kqp.protocol.api_keys import ApiKey
from kqp.quotas import capacity as cap
from kqp.spark_jobs.capture_source import US_PER_SECOND
from kqp.spark_jobs.common import ANONYMOUS
from kqp.spark_jobs.session import to_pandas

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


def api_request_series(
    spark: SparkSession,
    traffic: DataFrame,
    unit_seconds: int,
    bucket_range: tuple[int, int],
    brokers: Sequence[int],
    api_keys: Sequence[int],
) -> DataFrame:
    """Per broker, bucket and API key: requests per second (zeros filled)."""
    aggregated = (
        _bucketed(traffic, unit_seconds).groupBy("broker", "bucket", "api_key").agg(F.sum("requests").alias("n"))
    )
    keys = spark.createDataFrame([(k,) for k in api_keys], "api_key int")
    grid = _grid(spark, bucket_range, unit_seconds, brokers).crossJoin(keys)
    filled = grid.join(aggregated, ["broker", "bucket", "api_key"], "left").fillna(0.0)
    return filled.select(
        "broker",
        "bucket",
        "api_key",
        F.timestamp_seconds(F.col("bucket") * unit_seconds).alias("window_start"),
        (F.col("n") / F.col("covered_s")).alias("requests"),
    )


def with_replication(series: DataFrame, replication_factor: int, broker_count: int) -> DataFrame:
    """Add modelled follower traffic and total network in/out per broker and bucket.

    The proxy never sees replication, so it is modelled: every byte a leader takes in is
    fetched by RF-1 followers (the leader's extra outbound), and followers are spread evenly
    over the other brokers, so a broker takes in (RF-1)/(N-1) of every other leader's bytes.
    RF is capped at the broker count. replication_out = (RF-1) x produce, replication_in =
    (RF-1)/(N-1) x (cluster produce - own produce); nw_in = all client request bytes +
    replication_in, nw_out = all client response bytes + replication_out.
    """
    followers = min(replication_factor, broker_count) - 1
    totals = series.groupBy("bucket").agg(F.sum("produce_bytes").alias("cluster_produce"))
    joined = series.join(totals, "bucket")
    if followers <= 0 or broker_count <= 1:
        replication_in = F.lit(0.0)
        replication_out = F.lit(0.0)
    else:
        replication_in = (F.col("cluster_produce") - F.col("produce_bytes")) * (followers / (broker_count - 1))
        replication_out = F.col("produce_bytes") * float(followers)
    return (
        joined.withColumn("replication_in", replication_in)
        .withColumn("replication_out", replication_out)
        .withColumn("nw_in", F.col("bytes_in") + F.col("replication_in"))
        .withColumn("nw_out", F.col("bytes_out") + F.col("replication_out"))
        .drop("cluster_produce")
    )


def without_broker(series: DataFrame, lost: int, replication_factor: int, broker_count: int) -> DataFrame:
    """Series as if broker `lost` failed: its client traffic spread evenly over the survivors.

    Leaders move to the survivors (even re-homing), then replication is recomputed for
    N-1 brokers. Input is a series before with_replication.
    """
    survivors = broker_count - 1
    lost_traffic = series.where(F.col("broker") == lost).select(
        "bucket", *[F.col(m).alias(f"lost_{m}") for m in (*ADDITIVE_METRICS, "connections")]
    )
    moved = series.where(F.col("broker") != lost).join(lost_traffic, "bucket")
    for metric in (*ADDITIVE_METRICS, "connections"):
        moved = moved.withColumn(metric, F.col(metric) + F.col(f"lost_{metric}") / survivors)
    moved = moved.drop(*[f"lost_{m}" for m in (*ADDITIVE_METRICS, "connections")])
    return with_replication(moved, replication_factor, survivors)


def cluster_series(series: DataFrame) -> DataFrame:
    """Cluster-wide series: the sum over brokers per bucket (connections are per broker, so they add)."""
    metrics = [m for m in SERIES_METRICS if m in series.columns]
    return series.groupBy("bucket", "window_start").agg(*[F.sum(m).alias(m) for m in metrics])


def _long(series: DataFrame, metrics: Sequence[str], scope: str) -> DataFrame:
    stack = ", ".join(f"'{m}', cast({m} as double)" for m in metrics)
    broker = F.col("broker").cast("int") if scope == "broker" else F.lit(None).cast("int")
    return series.select(
        F.lit(scope).alias("scope"),
        broker.alias("broker"),
        "window_start",
        F.expr(f"stack({len(metrics)}, {stack}) as (metric, value)"),
    )


def earliest_max_by(when: str, value: str) -> Column:
    """`when` of the row with the largest `value`, the earliest one among ties.

    F.max_by picks any of the tied rows, depending on how the rows were partitioned: a cluster
    and local[*] reported different times for the same peak (measured, connection peaks).
    """
    key = F.when(F.col(value).isNotNull(), F.struct(-F.col(value), F.col(when)))
    return F.min_by(when, key)


def series_stats(long_series: DataFrame, unit_seconds: int, limits: DataFrame | None) -> DataFrame:
    """Mean, exact percentiles, max and time of max per (scope, broker, metric).

    With `limits` (scope, broker, metric, limit), also the seconds spent above the limit.
    """
    frame = long_series
    if limits is not None:
        renamed = limits.select(
            F.col("scope").alias("l_scope"),
            F.col("broker").alias("l_broker"),
            F.col("metric").alias("l_metric"),
            "limit",
        )
        condition = [
            frame["scope"] == renamed["l_scope"],
            frame["metric"] == renamed["l_metric"],
            frame["broker"].eqNullSafe(renamed["l_broker"]),
        ]
        frame = frame.join(F.broadcast(renamed), condition, "left").drop("l_scope", "l_broker", "l_metric")
    else:
        frame = frame.withColumn("limit", F.lit(None).cast("double"))
    quantiles = F.percentile("value", list(PERCENTILES))
    return (
        frame.groupBy("scope", "broker", "metric")
        .agg(
            F.mean("value").alias("mean"),
            quantiles.alias("q"),
            F.max("value").alias("max"),
            earliest_max_by("window_start", "value").alias("max_at"),
            F.first("limit", ignorenulls=True).alias("limit"),
            (F.sum(F.when(F.col("value") > F.col("limit"), 1).otherwise(0)) * unit_seconds).alias(
                "seconds_above_limit"
            ),
        )
        .select(
            "scope",
            "broker",
            "metric",
            "mean",
            *[F.col("q")[i].alias(name) for i, name in enumerate(PERCENTILE_NAMES)],
            "max",
            "max_at",
            "limit",
            F.when(F.col("limit").isNotNull(), F.col("seconds_above_limit")).alias("seconds_above_limit"),
        )
    )


def entity_totals(traffic: DataFrame, dimension: str) -> DataFrame:
    """Requests and bytes per principal, client-id or (principal, client-id)."""
    key = (F.concat_ws(" / ", "principal", "client_id") if dimension == "principal_client" else F.col(dimension)).alias(
        "entity"
    )
    return (
        traffic.groupBy(key)
        .agg(*[F.sum(m).alias(m) for m in ("requests", "bytes_in", "bytes_out", "produce_bytes", "fetch_bytes")])
        .withColumn("bytes", F.col("bytes_in") + F.col("bytes_out"))
    )


def topic_totals(parts: DataFrame) -> DataFrame:
    """Requests and record bytes per topic (Produce in, Fetch out)."""
    weighted = F.col("bytes") * F.col("weight")
    return (
        parts.groupBy(F.col("topic").alias("entity"))
        .agg(
            F.sum("weight").alias("requests"),
            F.sum(F.when(F.col("api_key") == ApiKey.PRODUCE, weighted).otherwise(0.0)).alias("produce_bytes"),
            F.sum(F.when(F.col("api_key") == ApiKey.FETCH, weighted).otherwise(0.0)).alias("fetch_bytes"),
        )
        .withColumn("bytes", F.col("produce_bytes") + F.col("fetch_bytes"))
    )


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


def client_broker_totals(traffic: DataFrame) -> DataFrame:
    """Bytes per (broker, client-id), for per-broker shares."""
    return traffic.groupBy("broker", "client_id").agg(
        F.sum("requests").alias("requests"),
        F.sum(F.col("bytes_in") + F.col("bytes_out")).alias("bytes"),
    )


def partition_load(parts: DataFrame, duration_s: float) -> DataFrame:
    """Per topic-partition: bytes in/out, requests, records, mean and peak bytes/s."""
    weighted = F.col("bytes") * F.col("weight")
    per_second = parts.groupBy("topic", "partition", "second").agg(F.sum(weighted).alias("bps"))
    peaks = per_second.groupBy("topic", "partition").agg(
        F.max("bps").alias("peak_bytes_per_s"), earliest_max_by("second", "bps").alias("peak_second")
    )
    totals = parts.groupBy("topic", "partition").agg(
        F.max("broker").alias("leader"),
        F.sum("weight").alias("requests"),
        F.sum(F.when(F.col("api_key") == ApiKey.PRODUCE, weighted).otherwise(0.0)).alias("produce_bytes"),
        F.sum(F.when(F.col("api_key") == ApiKey.FETCH, weighted).otherwise(0.0)).alias("fetch_bytes"),
        F.sum(F.when(F.col("api_key") == ApiKey.PRODUCE, F.col("records") * F.col("weight")).otherwise(0.0)).alias(
            "produced_records"
        ),
    )
    return (
        totals.join(peaks, ["topic", "partition"])
        .withColumn("bytes", F.col("produce_bytes") + F.col("fetch_bytes"))
        .withColumn("mean_bytes_per_s", F.col("bytes") / F.lit(max(duration_s, 1.0)))
    )


def _batch_bucket(batch_bytes: Any) -> Any:
    """A Spark expression labelling a batch size with its BATCH_BUCKETS class (first upper bound above it)."""
    expression = F.lit(BATCH_BUCKET_LAST)
    for upper, label in reversed(BATCH_BUCKETS):
        expression = F.when(batch_bytes < upper, label).otherwise(expression)
    return expression


def batch_mix(parts: DataFrame) -> DataFrame:
    """Produce batches by size bucket: batch count and bytes (a partition entry's mean batch size)."""
    produce = parts.where((F.col("api_key") == ApiKey.PRODUCE) & (F.col("batches") > 0))
    return (
        produce.withColumn("bucket", _batch_bucket(F.col("bytes") / F.col("batches")))
        .groupBy("bucket")
        .agg(
            F.sum(F.col("batches") * F.col("weight")).alias("batches"),
            F.sum(F.col("bytes") * F.col("weight")).alias("bytes"),
        )
    )


def batch_mix_by_client(requests: DataFrame, parts: DataFrame) -> DataFrame:
    """Per client-id: Produce requests, mean/median batch size, share of small batches, records per request."""
    produce_parts = parts.where((F.col("api_key") == ApiKey.PRODUCE) & (F.col("batches") > 0)).withColumn(
        "batch_bytes", F.col("bytes") / F.col("batches")
    )
    per_batch = produce_parts.groupBy("client_id").agg(
        (F.sum("bytes") / F.sum("batches")).alias("mean_batch_bytes"),
        F.percentile_approx("batch_bytes", 0.5, LATENCY_ACCURACY).alias("median_batch_bytes"),
        (
            F.sum(F.when(F.col("batch_bytes") < SMALL_BATCH_BYTES, F.col("batches")).otherwise(0)) / F.sum("batches")
        ).alias("small_batch_share"),
    )
    records_per_request = (
        requests.where(F.col("api_key") == ApiKey.PRODUCE)
        .select("client_id", "records")
        .groupBy("client_id")
        .agg(
            F.count("*").alias("produce_requests"),
            F.percentile_approx("records", [0.5, 0.95], LATENCY_ACCURACY).alias("q"),
        )
        .select(
            "client_id",
            "produce_requests",
            F.col("q")[0].alias("p50_records_per_request"),
            F.col("q")[1].alias("p95_records_per_request"),
        )
    )
    return records_per_request.join(per_batch, "client_id", "left")


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


def error_counts(traffic: DataFrame) -> DataFrame:
    """Per API key and error code: responses with that error and the share of the API's responses."""
    per_api = traffic.groupBy("api_key").agg(F.sum("requests").alias("api_requests"))
    errors = (
        traffic.where(F.col("error_code") != 0)
        .groupBy("api_key", "error_code")
        .agg(F.sum("requests").alias("requests"))
    )
    return errors.join(per_api, "api_key").withColumn("share", F.col("requests") / F.col("api_requests"))


def throttle_counts(traffic: DataFrame) -> DataFrame:
    """Per (principal, client-id): throttles the broker returned vs throttles the proxy applied."""
    return (
        traffic.groupBy("principal", "client_id")
        .agg(
            F.sum("requests").alias("requests"),
            *[
                aggregate(f"{side}_{column}").alias(f"{side}_{column}")
                for side in ("broker", "proxy")
                for aggregate, column in (
                    (F.sum, "throttled"),
                    (F.sum, "throttle_ms_total"),
                    (F.max, "throttle_ms_max"),
                )
            ],
        )
        .where((F.col("broker_throttled") > 0) | (F.col("proxy_throttled") > 0))
    )


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


# ---------------------------------------------------------------- the job


def limits_frame(
    spark: SparkSession, capacity_file: cap.CapacityFile | None, brokers: Sequence[int], thresholds: dict[str, float]
) -> DataFrame | None:
    """Each broker's NW_IN / NW_OUT limit (capacity x threshold, bytes/s) and the cluster's, their sum;
    None without a capacity file: there is then no limit to compare a load with.
    """
    if capacity_file is None:
        return None
    rows: list[tuple[str, int | None, str, float]] = []
    totals = {metric: 0.0 for metric in RESOURCE_OF_METRIC}
    for broker in brokers:
        broker_capacity = capacity_file.for_broker(broker)
        for metric, resource in RESOURCE_OF_METRIC.items():
            limit = broker_capacity.network_bytes_per_s(resource) * thresholds[resource]
            rows.append(("broker", broker, metric, limit))
            totals[metric] += limit
    rows.extend(("cluster", None, metric, limit) for metric, limit in totals.items())
    return spark.createDataFrame(rows, "scope string, broker int, metric string, limit double")


def stats_for(series: DataFrame, unit: int, limits: DataFrame | None, resolution: str, scenario: str) -> pd.DataFrame:
    """The statistics (series_stats: mean, percentiles, max, seconds over a limit) of every broker's
    and the cluster's series at one resolution, labelled with it and the scenario.
    """
    long = _long(series, SERIES_METRICS, "broker").unionByName(_long(cluster_series(series), SERIES_METRICS, "cluster"))
    frame = to_pandas(series_stats(long, unit, limits))
    frame.insert(0, "resolution", resolution)
    frame.insert(1, "scenario", scenario)
    return frame


def api_stats(api_series: DataFrame, unit: int, resolution: str, names: dict[int, str]) -> pd.DataFrame:
    """Request-count statistics per API, per broker and for the cluster; no limit applies to them."""
    named = api_series.withColumn(
        "metric",
        F.concat(F.lit("requests:"), F.create_map(*[F.lit(x) for kv in names.items() for x in kv])[F.col("api_key")]),
    )
    per_broker = named.select(
        F.lit("broker").alias("scope"),
        F.col("broker").cast("int").alias("broker"),
        "window_start",
        "metric",
        F.col("requests").alias("value"),
    )
    cluster = (
        named.groupBy("window_start", "metric")
        .agg(F.sum("requests").alias("value"))
        .select(
            F.lit("cluster").alias("scope"), F.lit(None).cast("int").alias("broker"), "window_start", "metric", "value"
        )
    )
    frame = to_pandas(series_stats(per_broker.unionByName(cluster), unit, None))
    frame.insert(0, "resolution", resolution)
    frame.insert(1, "scenario", "observed")
    return frame


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
