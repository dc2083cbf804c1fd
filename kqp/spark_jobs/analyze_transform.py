"""`analyze`'s Spark aggregations over a capture; their (small) results are shaped into
series, statistics and tables on the driver by kqp.spark_jobs.analyze_tables.

Pure: no reading, no writing (that is `analyze.extract` and `report.write_analyze_outputs`);
the job's figures are tested on a local session against figures recomputed with pandas.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kqp.protocol.api_keys import ApiKey
from kqp.spark_jobs.analyze_tables import (
    PARTITION_SECOND_SET,
    PRODUCE_BATCH_SET,
    PRODUCE_REQUEST_SET,
)
from kqp.spark_jobs.capture_source import US_PER_SECOND
from kqp.spark_jobs.common import ANONYMOUS

# The partition entries' fields the figures read, by prepare_requests' column (an array each,
# in the entries' order).
ENTRY_COLUMNS = {
    "topic": "entry_topics",
    "partition": "entry_partitions",
    "bytes": "entry_bytes",
    "records": "entry_records",
    "batches": "entry_batches",
}

# The request's fields each of its partition entries carries through entry_aggregates' explode.
_ENTRY_REQUEST_COLUMNS = ("second", "broker", "weight", "api_key", "client_id")


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
        # The partition entries' fields as one array each, not the nested column itself: a pass
        # reading them then decodes only those fields from the Parquet files. With the whole
        # column here, Spark decoded every field of every entry (compression and error code
        # too) for the entries pass (entry_aggregates): it prunes nested fields only when every
        # reference to the column is to a field (docs/benchmarks.md, issue 43's seventh round).
        *[F.col(f"partitions.{name}").alias(column) for name, column in ENTRY_COLUMNS.items()],
        F.aggregate(F.col("partitions.records"), F.lit(0.0), lambda acc, r: acc + F.coalesce(r, F.lit(0))).alias(
            "records"
        ),
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


def earliest_max_by(when: str, value: str) -> Column:
    """`when` of the row with the largest `value`, the earliest one among ties.

    F.max_by picks any of the tied rows, depending on how the rows were partitioned: a cluster
    and local[*] reported different times for the same peak (measured, connection peaks).
    """
    key = F.when(F.col(value).isNotNull(), F.struct(-F.col(value), F.col(when)))
    return F.min_by(when, key)


def latency_counts(requests: DataFrame) -> DataFrame:
    """The answered requests counted per (API key, broker, latency at the proxy) and per (API
    key, broker, broker round trip): two grouping sets of one hash aggregation, told apart by
    which latency is set (every answered request has a latency at the proxy). Latencies are
    whole microseconds over 1,000, so a few thousand distinct values per API and broker stand
    for millions of requests (about 280,000 rows at 10M requests): the driver takes the exact
    percentiles from these counts (analyze_tables.latency_by_api). Feeding a percentile sketch
    per request, per grouping, cost more than the rest of analyze's passes together.
    """
    answered = requests.where(F.col("latency_ms").isNotNull())
    return answered.groupingSets(
        [["api_key", "broker", "latency_ms"], ["api_key", "broker", "broker_latency_ms"]],
        "api_key",
        "broker",
        "latency_ms",
        "broker_latency_ms",
    ).agg(F.count("*").alias("n"))


# ---------------------------------------------------------------- the aggregates analyze collects
#
# analyze passes over the capture a few times, each pass reading only the columns it needs, and
# brings small aggregates to the driver: the traffic sums (aggregate_traffic), one row per
# partition and second, per client and value (entry_aggregates), per latency value
# (latency_counts). Every series, percentile and share is computed from those on the driver
# (kqp.spark_jobs.analyze_tables), so the Spark work is a handful of aggregations, not one job
# per table or series statistic.


def entry_aggregates(requests: DataFrame) -> DataFrame:
    """One aggregation over the Produce and Fetch partition entries giving the rows the
    partition and batch figures are computed from (on the driver: analyze_tables.partition_totals
    and produce_batches_by_client), in three sets told apart by `set`:

    * PARTITION_SECOND_SET: per (topic `name`, `partition`, `second`) of the Produce and Fetch
      entries, the partition's sums;
    * PRODUCE_REQUEST_SET: per (client-id `name`, the request's records `value`), the Produce
      requests (`n`), one row each, a request without entries included (no records);
    * PRODUCE_BATCH_SET: per (client-id `name`, the entry's mean batch size `value`), the
      Produce entries with batches, and their batch and byte sums.

    The capture's nested `partitions` column, the costliest to decode, is decoded once (only
    the fields in ENTRY_COLUMNS) and exploded once, and each entry feeds only the sets that
    count it. The result is small (about 600,000
    rows at 10M requests: one per partition and second, per distinct value per client), so it
    comes to the driver whole, where two Spark queries over a cache of it cost more than the
    pandas work (docs/benchmarks.md, sixth round).

    Every sum is of whole bytes, records or batches (x the whole sampling factor): exact in
    doubles in any order, so summing the groups gives what summing the entries gave.
    """
    produce = F.col("api_key") == ApiKey.PRODUCE
    exploded = (
        requests.where(F.col("api_key").isin(ApiKey.PRODUCE, ApiKey.FETCH))
        .select(
            *_ENTRY_REQUEST_COLUMNS,
            # Records per request are read for Produce requests alone: summing a request's
            # entries is a higher-order function, which Spark evaluates row by row.
            F.when(produce, F.col("records")).alias("records"),
            *ENTRY_COLUMNS.values(),
        )
        # One row per entry (one, with no entry, for a request without any): its position and
        # bytes, the other fields taken at that position of their arrays.
        .select("*", F.posexplode_outer("entry_bytes").alias("position", "bytes"))
        .select(
            *_ENTRY_REQUEST_COLUMNS,
            "records",
            "position",
            "bytes",
            F.col("entry_topics")[F.col("position")].alias("topic"),
            F.col("entry_partitions")[F.col("position")].alias("partition"),
            F.col("entry_records")[F.col("position")].alias("entry_records"),
            F.col("entry_batches")[F.col("position")].alias("batches"),
        )
    )
    batches = F.coalesce(F.col("batches"), F.lit(0))
    in_set = F.array(
        F.when(F.col("position").isNotNull(), F.lit(PARTITION_SECOND_SET)),
        F.when(produce & (F.col("position").isNull() | (F.col("position") == 0)), F.lit(PRODUCE_REQUEST_SET)),
        F.when(produce & (batches > 0), F.lit(PRODUCE_BATCH_SET)),
    )
    entry_bytes = F.col("bytes").cast("double")
    weighted = entry_bytes * F.col("weight")
    records = F.coalesce(F.col("entry_records"), F.lit(0)).cast("double")
    per_set = exploded.select("*", F.explode(in_set).alias("set")).where(F.col("set").isNotNull())
    partition_second = F.col("set") == PARTITION_SECOND_SET
    keyed = per_set.select(
        "set",
        F.when(partition_second, F.col("topic")).otherwise(F.col("client_id")).alias("name"),
        F.when(partition_second, F.col("partition")).alias("partition"),
        F.when(partition_second, F.col("second")).alias("second"),
        F.when(F.col("set") == PRODUCE_REQUEST_SET, F.col("records"))
        .when(F.col("set") == PRODUCE_BATCH_SET, entry_bytes / batches)
        .alias("value"),
        "broker",
        "weight",
        F.when(produce, weighted).otherwise(0.0).alias("produce_weighted"),
        F.when(F.col("api_key") == ApiKey.FETCH, weighted).otherwise(0.0).alias("fetch_weighted"),
        F.when(produce, records * F.col("weight")).otherwise(0.0).alias("produced_records"),
        weighted.alias("weighted"),
        batches.alias("batches"),
        entry_bytes.alias("bytes"),
    )
    return keyed.groupBy("set", "name", "partition", "second", "value").agg(
        F.count("*").alias("n"),
        F.max("broker").alias("leader"),
        F.sum("weight").alias("requests"),
        F.sum("produce_weighted").alias("produce_bytes"),
        F.sum("fetch_weighted").alias("fetch_bytes"),
        F.sum("produced_records").alias("produced_records"),
        F.sum("weighted").alias("bps"),
        F.sum(F.col("batches") * F.col("weight")).alias("weighted_batches"),
        F.sum("batches").alias("batches"),
        F.sum("bytes").alias("bytes"),
    )
