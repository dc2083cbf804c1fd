"""Synthetic captures in the capture schema, of any size, with realistic skew.

Used by the tests (small captures whose figures the tests recompute independently), the
demo and the benchmarks (1M and 10M requests). Generation is vectorised with numpy and
written chunk by chunk, so a 10M-request capture never sits in memory at once.

What makes it realistic enough to exercise every output of `analyze`:
  * client volume follows a Zipf law (a few clients carry most bytes), and so do topics;
    partition 0 of every topic is hotter than the others (a keyed hot spot);
  * traffic varies over time (a slow wave plus short bursts), so per-second percentiles
    differ from the mean;
  * producers and consumers differ: Produce with per-client acks, compression and batch
    sizes (some clients send tiny batches), Fetch with empty long-polls, plus the usual
    Metadata / Heartbeat / OffsetCommit chatter;
  * a leader per partition (`(topic + partition) % brokers`), so brokers see different load;
  * a few errors, broker throttles on the heaviest client and proxy throttles on another;
  * acks=0 Produce has no response (response fields null), as the proxy records it.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kqp.capture.schema import (
    CAPTURE_SCHEMA,
    META_PROXY_ID,
    META_RECORDS_DROPPED,
    META_RECORDS_WRITTEN,
    META_SAMPLING,
    META_SCHEMA_VERSION,
    META_WINDOW_END_US,
    META_WINDOW_START_US,
    MUTATION_FIELDS,
    PARTITION_FIELDS,
    SCHEMA_VERSION,
)
from kqp.spark_jobs.common import HelpFormatter

US_PER_SECOND = 1_000_000
US_PER_HOUR = 3600 * US_PER_SECOND
# 2026-01-01T00:00:00Z: a fixed default start so generated captures are reproducible.
DEFAULT_START_US = 1_767_225_600 * US_PER_SECOND
# Bound on rows generated at once: keeps a 10M-row capture within a few hundred MB of RAM.
_CHUNK_ROWS = 500_000

PRODUCE, FETCH, METADATA, OFFSET_COMMIT, HEARTBEAT, API_VERSIONS = 0, 1, 3, 8, 12, 18
_PRODUCER_APIS = (np.array([PRODUCE, METADATA, API_VERSIONS]), np.array([0.92, 0.05, 0.03]))
_CONSUMER_APIS = (
    np.array([FETCH, HEARTBEAT, OFFSET_COMMIT, METADATA]),
    np.array([0.80, 0.10, 0.07, 0.03]),
)
_ERROR_CODES = np.array([3, 6, 7], dtype=np.int16)  # UNKNOWN_TOPIC, NOT_LEADER, REQUEST_TIMED_OUT
_ERROR_RATE = 0.002
_FETCH_MAX_WAIT_MS = 500
_EMPTY_FETCH_SHARE = 0.2
_RECORD_BYTES = 200  # average record size used to turn batch bytes into record counts


@dataclass(frozen=True)
class SyntheticSpec:
    """Shape of a synthetic capture.

    Attributes:
        requests: rows to generate.
        seconds: capture duration; requests are spread over it by a time-varying rate.
        brokers / clients / principals / topics / partitions_per_topic: population sizes.
        start_us: capture start, UTC microseconds.
        seed: numpy seed; the same spec always gives the same capture.
        rows_per_file: files are cut at this many rows (and at hour boundaries).
        noisy_clients: extra producers `noisy-0`, `noisy-1`, ... sending steadily (the same
            requests per second all along) on top of the skewed population, with batches of
            about noisy_batch_bytes; they are drawn from a generator of their own, so the rest
            of the capture is the same with or without them (`kqp replay advise`'s tests).
    """

    requests: int = 20_000
    seconds: int = 120
    brokers: int = 3
    clients: int = 12
    principals: int = 4
    topics: int = 6
    partitions_per_topic: int = 6
    start_us: int = DEFAULT_START_US
    seed: int = 7
    rows_per_file: int = 1_000_000
    noisy_clients: int = 0
    noisy_requests_per_s: int = 20
    noisy_batch_bytes: int = 16_000


def _zipf_weights(n: int, exponent: float) -> np.ndarray:
    """Client shares of the traffic, heaviest first: a Zipf law, so a few clients dominate, as in a
    real cluster, and the top-N tables and the fair-share advice have something to rank.
    """
    weights: np.ndarray = 1.0 / np.arange(1, n + 1) ** exponent
    normalised: np.ndarray = weights / weights.sum()
    return normalised


def _requests_per_second(spec: SyntheticSpec, rng: np.random.Generator) -> np.ndarray:
    # A slow wave (two periods over the capture) times rare bursts (3 % of the seconds, x2 to
    # x5): enough that p99 and max differ clearly from the mean, which analyze must show. The
    # multinomial draw makes the counts add up to exactly `spec.requests`.
    seconds = np.arange(spec.seconds)
    wave = 1.0 + 0.5 * np.sin(2 * math.pi * seconds / max(spec.seconds / 2, 1))
    bursts = np.where(rng.random(spec.seconds) < 0.03, rng.uniform(2.0, 5.0, spec.seconds), 1.0)
    rate = wave * bursts
    counts: np.ndarray = rng.multinomial(spec.requests, rate / rate.sum())
    return counts


@dataclass(frozen=True)
class _Clients:
    """Per-client attributes, indexed by client number (0 = heaviest)."""

    weights: np.ndarray
    is_producer: np.ndarray
    acks: np.ndarray
    compression: np.ndarray
    median_bytes: np.ndarray
    principal: np.ndarray


def _clients(spec: SyntheticSpec, rng: np.random.Generator) -> _Clients:
    n = spec.clients
    numbers = np.arange(n)
    # Even-numbered clients produce, odd ones consume, so the heaviest client (0) is a
    # producer and the second heaviest a consumer; acks mostly "all", as client defaults.
    return _Clients(
        weights=_zipf_weights(n, 1.1),
        is_producer=numbers % 2 == 0,
        acks=rng.choice(np.array([-1, 1, 0], dtype=np.int16), size=n, p=[0.6, 0.3, 0.1]),
        compression=rng.choice(np.array([0, 1, 2, 3, 4], dtype=np.int8), size=n),
        # Some clients batch well (tens of KB), others send tiny batches: the mix analyze reports.
        median_bytes=rng.choice(np.array([300.0, 2_000.0, 16_000.0, 64_000.0]), size=n),
        principal=numbers % spec.principals,
    )


def _chunk(
    spec: SyntheticSpec,
    rng: np.random.Generator,
    clients: _Clients,
    second_of_row: np.ndarray,
    first_row: int,
) -> pa.Table:
    n = len(second_of_row)
    ts = spec.start_us + second_of_row * US_PER_SECOND + rng.integers(0, US_PER_SECOND, n)
    ts.sort()
    client = rng.choice(spec.clients, size=n, p=clients.weights)
    producer = clients.is_producer[client]
    api = np.where(
        producer,
        rng.choice(_PRODUCER_APIS[0], size=n, p=_PRODUCER_APIS[1]),
        rng.choice(_CONSUMER_APIS[0], size=n, p=_CONSUMER_APIS[1]),
    ).astype(np.int16)
    has_partitions = (api == PRODUCE) | (api == FETCH)

    # Partitions: a Zipf-chosen topic, a first partition with partition 0 hottest, then more
    # partitions of the same topic that share its leader (p, p + brokers, ...).
    topic = rng.choice(spec.topics, size=n, p=_zipf_weights(spec.topics, 0.9))
    partition_weights = np.ones(spec.partitions_per_topic)
    partition_weights[0] = 3.0
    first_partition = rng.choice(spec.partitions_per_topic, size=n, p=partition_weights / partition_weights.sum())
    same_leader_room = (spec.partitions_per_topic - 1 - first_partition) // spec.brokers + 1
    n_parts = np.minimum(1 + rng.poisson(0.5, n), same_leader_room)
    n_parts = np.where(has_partitions, n_parts, 0)
    leader = (topic + first_partition) % spec.brokers
    broker = np.where(has_partitions, leader, rng.integers(0, spec.brokers, n)).astype(np.int32)

    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(n_parts, out=offsets[1:])
    total = int(offsets[-1])
    row_of_part = np.repeat(np.arange(n), n_parts)
    index_in_row = np.arange(total) - offsets[:-1][row_of_part]
    part_api = api[row_of_part]
    part_client = client[row_of_part]
    part_bytes = np.maximum(1, rng.lognormal(np.log(clients.median_bytes[part_client]), 0.6, total)).astype(np.int64)
    empty_fetch = (part_api == FETCH) & (rng.random(total) < _EMPTY_FETCH_SHARE)
    part_bytes = np.where(empty_fetch, 0, part_bytes)
    part_records = np.where(part_bytes > 0, np.maximum(1, part_bytes // _RECORD_BYTES), 0).astype(np.int32)
    part_batches = np.where(part_bytes > 0, np.maximum(1, part_bytes // 65_536 + (part_api == PRODUCE)), 0)
    part_batches = np.where(part_api == PRODUCE, 1, part_batches).astype(np.int32)
    part_errors = np.where(rng.random(total) < _ERROR_RATE, rng.choice(_ERROR_CODES, total), 0).astype(np.int16)
    partitions_values = pa.StructArray.from_arrays(
        [
            pa.array(np.char.add("topic-", topic[row_of_part].astype(str)), pa.string()),
            pa.array(first_partition[row_of_part] + index_in_row * spec.brokers, pa.int32()),
            pa.array(part_bytes, pa.int64()),
            pa.array(part_records, pa.int32()),
            pa.array(part_batches, pa.int32()),
            pa.array(clients.compression[part_client], pa.int8()),
            pa.array(part_errors, pa.int16()),
        ],
        fields=list(PARTITION_FIELDS),
    )
    partitions = pa.ListArray.from_arrays(pa.array(offsets), partitions_values, mask=pa.array(~has_partitions)).cast(
        pa.list_(PARTITION_FIELDS)
    )
    bytes_per_row = np.bincount(row_of_part, weights=part_bytes, minlength=n).astype(np.int64)
    any_error = np.zeros(n, dtype=np.int16)
    has_error = part_errors != 0
    # One non-zero partition error per row (the largest code; the proxy records the first,
    # which a synthetic capture need not match: analyze only counts rows with an error).
    np.maximum.at(any_error, row_of_part[has_error], part_errors[has_error])

    acks = np.where(api == PRODUCE, clients.acks[client], 0).astype(np.int16)
    no_response = (api == PRODUCE) & (acks == 0)
    request_bytes = np.select(
        [api == PRODUCE, api == FETCH],
        [60 + bytes_per_row + 50 * n_parts, 80 + 30 * n_parts],
        rng.integers(40, 200, n),
    ).astype(np.int64)
    response_bytes = np.select(
        [api == PRODUCE, api == FETCH],
        [50 + 40 * n_parts, 60 + bytes_per_row + 40 * n_parts],
        rng.integers(100, 2_000, n),
    ).astype(np.int64)

    # Broker round trips around 2 ms, longer for larger requests; an empty Fetch is a long
    # poll that waits its full max wait, as a broker holds it in purgatory.
    broker_latency_us = rng.lognormal(np.log(2_000.0), 0.5, n) * (1 + bytes_per_row / 1_000_000)
    empty_poll = (api == FETCH) & (bytes_per_row == 0)
    broker_latency_us = np.where(empty_poll, _FETCH_MAX_WAIT_MS * 1_000, broker_latency_us).astype(np.int64)
    # The proxy's own time on each side of the broker: tens of microseconds.
    ts_sent = ts + rng.integers(20, 120, n)
    ts_response_received = ts_sent + broker_latency_us
    ts_response_sent = ts_response_received + rng.integers(20, 120, n)

    # The heaviest client is throttled by the broker now and then, the second by the proxy.
    broker_throttle = np.where((client == 0) & (rng.random(n) < 0.05), rng.integers(1, 200, n), 0)
    proxy_throttle = np.where((client == 1) & (rng.random(n) < 0.1), rng.integers(1, 500, n), 0)
    top_error = np.where(
        has_partitions, any_error, np.where(rng.random(n) < _ERROR_RATE, rng.choice(_ERROR_CODES, n), 0)
    ).astype(np.int16)
    is_fetch = api == FETCH
    client_names = np.char.add("app-", client.astype(str))

    def nullable(values: np.ndarray, null: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
        return pa.array(values, arrow_type, mask=null)

    columns = {
        "schema_version": pa.array(np.full(n, SCHEMA_VERSION), pa.int16()),
        "ts_request_received_us": pa.array(ts, pa.int64()),
        "ts_request_sent_us": pa.array(ts_sent, pa.int64()),
        "ts_response_received_us": nullable(ts_response_received, no_response, pa.int64()),
        "ts_response_sent_us": nullable(ts_response_sent, no_response, pa.int64()),
        # One connection per (client, broker), numbered from 1 as the proxy numbers them.
        "connection_id": pa.array(client.astype(np.int64) * spec.brokers + broker + 1, pa.int64()),
        "listener": pa.array(np.full(n, "PLAINTEXT"), pa.string()),
        "upstream_node_id": pa.array(broker, pa.int32()),
        "client_address": pa.array(np.char.add("10.0.0.", (client % 250).astype(str)), pa.string()),
        "principal": pa.array(np.char.add("tenant-", clients.principal[client].astype(str)), pa.string()),
        "client_id": pa.array(client_names, pa.string()),
        "api_key": pa.array(api, pa.int16()),
        "api_version": pa.array(np.where(api == PRODUCE, 9, np.where(is_fetch, 13, 4)), pa.int16()),
        "correlation_id": pa.array((first_row + np.arange(n)) & 0x7FFFFFFF, pa.int32()),
        "request_bytes": pa.array(request_bytes, pa.int64()),
        "response_bytes": nullable(response_bytes, no_response, pa.int64()),
        "acks": nullable(acks, api != PRODUCE, pa.int16()),
        "partitions": partitions,
        "fetch_max_wait_ms": nullable(np.full(n, _FETCH_MAX_WAIT_MS), ~is_fetch, pa.int32()),
        "fetch_min_bytes": nullable(np.ones(n), ~is_fetch, pa.int32()),
        "fetch_max_bytes": nullable(np.full(n, 52_428_800), ~is_fetch, pa.int32()),
        "group_id": nullable(np.char.add("group-", client.astype(str)), ~is_fetch, pa.string()),
        "error_code": nullable(top_error, no_response, pa.int16()),
        "broker_throttle_ms": nullable(broker_throttle, no_response, pa.int32()),
        "proxy_throttle_ms": pa.array(proxy_throttle, pa.int32()),
        "mutations": pa.nulls(n, pa.list_(MUTATION_FIELDS)),
        "sampling_one_in": pa.array(np.ones(n), pa.int32()),
    }
    # Its throttles are drawn, not decided by an engine: no quota_* inputs to replay exactly.
    for field in CAPTURE_SCHEMA:
        if field.name.startswith("quota_"):
            columns[field.name] = pa.nulls(n, field.type)
    return pa.Table.from_pydict(columns, schema=CAPTURE_SCHEMA)


def _noisy_clients(spec: SyntheticSpec) -> _Clients:
    n = spec.noisy_clients
    return _Clients(
        weights=np.full(n, 1.0 / n),
        is_producer=np.ones(n, dtype=bool),
        acks=np.ones(n, dtype=np.int16),
        compression=np.zeros(n, dtype=np.int8),
        median_bytes=np.full(n, float(spec.noisy_batch_bytes)),
        principal=np.zeros(n, dtype=np.int64),
    )


def _noisy_chunk(spec: SyntheticSpec, rng: np.random.Generator, seconds: np.ndarray, first_row: int) -> pa.Table:
    """The noisy producers' requests of these seconds, renamed `noisy-N` on connections of their own."""
    noisy_spec = replace(spec, clients=spec.noisy_clients)
    second_of_row = np.repeat(seconds, spec.noisy_clients * spec.noisy_requests_per_s)
    table = _chunk(noisy_spec, rng, _noisy_clients(spec), second_of_row, first_row)
    renamed = pc.replace_substring_regex(table["client_id"], "^app-", "noisy-")
    table = table.set_column(table.schema.get_field_index("client_id"), table.schema.field("client_id"), renamed)
    connections = pc.add(table["connection_id"], 1_000_000)
    return table.set_column(
        table.schema.get_field_index("connection_id"), table.schema.field("connection_id"), connections
    )


def generate_tables(spec: SyntheticSpec) -> Iterator[pa.Table]:
    """Yield the capture as consecutive tables (time-ordered, at most ~500k rows each)."""
    rng = np.random.default_rng(spec.seed)
    noisy_rng = np.random.default_rng(spec.seed + 1_000_003)
    clients = _clients(spec, rng)
    per_second = _requests_per_second(spec, rng)
    second = 0
    first_row = 0
    while second < spec.seconds:
        # Whole seconds per chunk, so timestamps stay sorted across chunks.
        cumulative = np.cumsum(per_second[second:])
        span = max(1, int(np.searchsorted(cumulative, _CHUNK_ROWS, side="right")))
        seconds = np.arange(second, min(second + span, spec.seconds))
        second_of_row = np.repeat(seconds, per_second[seconds])
        if len(second_of_row):
            table = _chunk(spec, rng, clients, second_of_row, first_row)
            if spec.noisy_clients:
                noisy = _noisy_chunk(spec, noisy_rng, seconds, spec.requests + first_row)
                table = pa.concat_tables([table, noisy]).sort_by("ts_request_received_us")
            yield table
        first_row += len(second_of_row)
        second = int(seconds[-1]) + 1


def _file_metadata(rows: int, start_us: int, end_us: int) -> dict[bytes, bytes]:
    return {
        META_SCHEMA_VERSION: str(SCHEMA_VERSION).encode(),
        META_RECORDS_WRITTEN: str(rows).encode(),
        META_RECORDS_DROPPED: b"0",
        META_SAMPLING: b"1",
        META_PROXY_ID: b"synthetic",
        META_WINDOW_START_US: str(start_us).encode(),
        META_WINDOW_END_US: str(end_us).encode(),
    }


def write_capture(spec: SyntheticSpec, directory: str | Path) -> int:
    """Write a synthetic capture under `directory/date=.../hour=.../`; return the row count."""
    from datetime import UTC, datetime

    root = Path(directory)
    sequence = 0
    rows = 0
    for table in generate_tables(spec):
        hours = pc.divide(table["ts_request_received_us"], US_PER_HOUR).to_numpy()
        boundaries = np.flatnonzero(np.diff(hours)) + 1
        starts = [0, *boundaries.tolist()]
        ends = [*boundaries.tolist(), table.num_rows]
        for start, end in zip(starts, ends, strict=True):
            hour_start = datetime.fromtimestamp(int(hours[start]) * 3600, tz=UTC)
            folder = root / f"date={hour_start:%Y-%m-%d}" / f"hour={hour_start:%H}"
            folder.mkdir(parents=True, exist_ok=True)
            for piece_start in range(start, end, spec.rows_per_file):
                piece = table.slice(piece_start, min(spec.rows_per_file, end - piece_start))
                ts = piece["ts_request_received_us"]
                metadata = _file_metadata(piece.num_rows, ts[0].as_py(), ts[-1].as_py())
                pq.write_table(
                    piece.replace_schema_metadata({**(CAPTURE_SCHEMA.metadata or {}), **metadata}),
                    folder / f"synthetic-{sequence:06d}.parquet",
                    row_group_size=100_000,
                )
                sequence += 1
                rows += piece.num_rows
    return rows


# What each option of `kqp replay generate` sets (SyntheticSpec's fields; the defaults are its own).
GENERATE_OPTIONS = {
    "requests": "requests (rows) to write",
    "seconds": "capture duration in seconds; the requests are spread over it at a rate that varies",
    "brokers": "brokers the requests go to",
    "clients": "client-ids, whose shares of the traffic follow a Zipf law (a few heavy ones)",
    "principals": "principals the clients authenticate as",
    "topics": "topics produced to and fetched from",
    "partitions_per_topic": "partitions per topic",
    "seed": "random seed: the same options always write the same capture",
    "noisy_clients": "extra steady producers noisy-0, noisy-1, ... on top of the skewed population",
    "noisy_requests_per_s": "Produce requests per second of each noisy producer",
    "noisy_batch_bytes": "approximate bytes per Produce of each noisy producer",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kqp replay generate", description="Write a synthetic capture.", formatter_class=HelpFormatter
    )
    parser.add_argument("directory", help="directory to write the capture to (Hive-partitioned Parquet)")
    defaults = SyntheticSpec()
    for name, text in GENERATE_OPTIONS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name), help=text)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m kqp.spark_jobs.synthetic OUT --requests N --seconds S`: write a synthetic capture."""
    args = build_parser().parse_args(argv)
    spec = SyntheticSpec(
        requests=args.requests,
        seconds=args.seconds,
        brokers=args.brokers,
        clients=args.clients,
        principals=args.principals,
        topics=args.topics,
        partitions_per_topic=args.partitions_per_topic,
        seed=args.seed,
        noisy_clients=args.noisy_clients,
        noisy_requests_per_s=args.noisy_requests_per_s,
        noisy_batch_bytes=args.noisy_batch_bytes,
    )
    rows = write_capture(spec, args.directory)
    print(f"wrote {rows} requests over {spec.seconds} s to {args.directory}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
