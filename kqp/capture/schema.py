"""The versioned Parquet schema of a capture record.

One row per request/response pair seen by the proxy. Per topic-partition figures for
Produce and Fetch are a nested list so a row stays one request; Spark explodes it when
a job needs partition-level detail. Times are integer microseconds since the Unix epoch
(UTC) so ordering survives Parquet round trips without float rounding.
"""

from __future__ import annotations

import pyarrow as pa

# v1 captures (no quota_* columns) still load: readers see those columns as nulls.
SCHEMA_VERSION = 2

# Footer metadata keys (file-level key/value metadata of every capture file).
META_SCHEMA_VERSION = b"kqp.capture.schema_version"
META_RECORDS_WRITTEN = b"kqp.capture.records_written"
META_RECORDS_DROPPED = b"kqp.capture.records_dropped"
META_SAMPLING = b"kqp.capture.sampling_one_in"
META_PROXY_ID = b"kqp.capture.proxy_id"
# Records the writer refused because a required field was missing or a value did not fit
# the schema (a proxy bug, not load); counted apart from queue-full drops.
META_RECORDS_INVALID = b"kqp.capture.records_invalid"
# Writer clock (UTC microseconds) when the file was opened and closed: the span the file
# covers even when it holds few records, so coverage can be reported per period.
META_WINDOW_START_US = b"kqp.capture.window_start_us"
META_WINDOW_END_US = b"kqp.capture.window_end_us"

PARTITION_FIELDS = pa.struct(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("bytes", pa.int64()),
        pa.field("records", pa.int32()),
        pa.field("batches", pa.int32()),
        # Kafka's codec id from the batch attributes: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.
        pa.field("compression", pa.int8()),
        pa.field("error_code", pa.int16()),
    ]
)

MUTATION_FIELDS = pa.struct(
    [
        pa.field("topic", pa.string()),
        pa.field("partitions", pa.int32()),
        pa.field("error_code", pa.int16()),
    ]
)

CAPTURE_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.int16(), nullable=False),
        # Four instants of the pair, as seen by the proxy.
        pa.field("ts_request_received_us", pa.int64(), nullable=False),
        pa.field("ts_request_sent_us", pa.int64()),
        pa.field("ts_response_received_us", pa.int64()),
        pa.field("ts_response_sent_us", pa.int64()),
        pa.field("connection_id", pa.int64(), nullable=False),
        pa.field("listener", pa.string()),
        pa.field("upstream_node_id", pa.int32()),
        pa.field("client_address", pa.string()),
        pa.field("principal", pa.string()),
        pa.field("client_id", pa.string()),
        pa.field("api_key", pa.int16(), nullable=False),
        pa.field("api_version", pa.int16(), nullable=False),
        pa.field("correlation_id", pa.int32(), nullable=False),
        pa.field("request_bytes", pa.int64(), nullable=False),
        pa.field("response_bytes", pa.int64()),
        # Produce only (0, 1 or -1 = all); null for every other API.
        pa.field("acks", pa.int16()),
        pa.field("partitions", pa.list_(PARTITION_FIELDS)),
        # Fetch request settings.
        pa.field("fetch_max_wait_ms", pa.int32()),
        pa.field("fetch_min_bytes", pa.int32()),
        pa.field("fetch_max_bytes", pa.int32()),
        pa.field("group_id", pa.string()),
        # Top-level error code of the response where the API has one, else the first
        # non-zero partition/topic error.
        pa.field("error_code", pa.int16()),
        pa.field("broker_throttle_ms", pa.int32()),
        pa.field("proxy_throttle_ms", pa.int32()),
        # CreateTopics / CreatePartitions / DeleteTopics.
        pa.field("mutations", pa.list_(MUTATION_FIELDS)),
        # N when the connection was captured under 1-in-N connection sampling (1 = all), so a
        # Spark job can scale counts without reading file footers. Added in v1 before any
        # capture shipped; readers must tolerate it missing (older test files).
        pa.field("sampling_one_in", pa.int32()),
        # v2: what the quota engine was given for this exchange, exactly, so a what-if replay
        # takes the proxy's decisions (kqp.quotas.recording). The broker label is the budget
        # name (`bootstrap`, `1`, ...). Engine times are the proxy's monotonic clock in ms and
        # `*_seq` numbers the engine calls of one proxy process: both only order calls within
        # one process. Request: when a request was charged on arrival (acks=0 Produce,
        # controller mutations, a Fetch's cap); response: when its response was. Null where
        # the engine was not called (quotas off, a locally answered request's response).
        pa.field("quota_broker", pa.string()),
        pa.field("quota_request_seq", pa.int64()),
        pa.field("quota_request_now_ms", pa.float64()),
        pa.field("quota_response_seq", pa.int64()),
        pa.field("quota_response_now_ms", pa.float64()),
        # Charged: Produce request bytes (at the response, or on arrival for acks=0), Fetch
        # bytes (4 + response body), request time in ms (KIP-124). Null when not charged.
        pa.field("quota_produce_bytes", pa.int64()),
        pa.field("quota_fetch_bytes", pa.int64()),
        pa.field("quota_request_time_ms", pa.float64()),
    ],
    metadata={META_SCHEMA_VERSION: str(SCHEMA_VERSION).encode()},
)

# Fields a record must carry; the writer fills schema_version and sampling_one_in itself.
REQUIRED_FIELDS: tuple[str, ...] = tuple(
    field.name for field in CAPTURE_SCHEMA if not field.nullable and field.name != "schema_version"
)
