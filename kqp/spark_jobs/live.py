"""`live`: re-send a capture's Produce and Fetch load to a target cluster, time-scaled.

Dry run (no cluster needed)::

    kqp replay live CAPTURE_DIR --bootstrap target:9092 --speedup 2 --dry-run

Against a cluster::

    cd /path/to/kqp && zip -qr /tmp/kqp.zip kqp
    spark-submit --master spark://host:7077 --conf spark.speculation=false --py-files /tmp/kqp.zip \\
        kqp/spark_jobs/live.py hdfs:///captures/kqp --bootstrap target:9092 --topic-prefix replay. \\
        --speedup 2 --copies 1 --output /shared/out/live

Schedule: a request captured at `ts` is due at `start + (ts - t0) / speedup`. The schedule is
partitioned by original connection, so one task owns each connection; inside a task every
connection runs in its own thread with its own client, sending its requests in captured
order, so per-connection order is kept and connections run concurrently. `--copies N`
replays every connection N times (client-ids suffixed `-copyK`), which differs from
speeding up.

Produce: per captured partition entry, the same record count and byte size (synthetic
payloads), the same acks and compression, to `<prefix><topic>` and the captured partition
(the target topics must exist with at least as many partitions). Fetch: every connection
that fetched gets a consumer on the same `<prefix><topic>` partitions, reading from the
start; at each captured Fetch's due time it reads until it has taken as many bytes as the
capture says that connection had fetched by then (or the Fetch's max wait passes), so the
consumer load follows the captured one.

Measured the way OpenMessaging Benchmark does: intended vs actual send time (schedule lag:
the generator fell behind) separately from service latency (actual send to delivery report
for Produce, to the last record read for Fetch), percentiles to p99.99, achieved vs intended
bytes/s per second, errors, and the throttle time the target returned. A retried Spark task
replays its slice again; speculation is off (session.BASE_CONF).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kqp.protocol.api_keys import ApiKey
from kqp.spark_jobs.capture_source import read_capture
from kqp.spark_jobs.common import HelpFormatter, Progress
from kqp.spark_jobs.session import to_pandas

SUMMARY_SCHEMA = "kqp.replay.live/1"
# RecordBatch attributes' compression codec ids (Kafka's CompressionType) -> librdkafka's
# compression.type names.
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
LATENCY_PERCENTILES = (50, 95, 99, 99.9, 99.99)
# How long a connection waits for outstanding delivery reports after its last send.
FLUSH_TIMEOUT_S = 60.0
# A Fetch that captured no max wait still gets this long to find its bytes (Kafka's
# fetch.max.wait.ms default).
DEFAULT_FETCH_WAIT_MS = 500

# Spark DDL schemas: the schedule the executors receive and the rows they send back. The
# `copy` column keeps the N copies of a connection apart everywhere.
SCHEDULE_SCHEMA = (
    "kind string, connection_id long, copy int, offset_ms double, acks int, topic string, partition int, "
    "records int, bytes long, compression int, max_wait_ms int"
)
RESULT_SCHEMA = (
    "kind string, connection_id long, copy int, intended_ms double, actual_ms double, done_ms double, "
    "bytes long, records long, error string, throttle_ms double"
)
RESULT_COLUMNS = [column.split()[0] for column in RESULT_SCHEMA.split(", ")]


@dataclass(frozen=True)
class LiveOptions:
    """The job's settings; the command line's defaults are read from these fields."""

    capture: str
    bootstrap: str
    output: str | None = None
    # Replayed topics are `<prefix><captured topic>`, so a replay never writes into the
    # captured topics themselves when the target is the same cluster.
    topic_prefix: str = "replay."
    speedup: float = 1.0
    copies: int = 1
    dry_run: bool = False
    fetch: bool = True
    # Time between scheduling and the first due request: executors need it to start their
    # clients and connect, or the first requests would all start late (schedule lag).
    start_delay_s: float = 5.0
    tasks: int | None = None  # None: the cluster's default parallelism


# ---------------------------------------------------------------- schedule (pure DataFrames)


def schedule(raw: DataFrame, speedup: float, copies: int, fetch: bool = True) -> DataFrame:
    """One row per (connection copy, Produce or Fetch partition entry) with its offset from the start."""
    kinds = [ApiKey.PRODUCE, ApiKey.FETCH] if fetch else [ApiKey.PRODUCE]
    traffic = raw.where(F.col("api_key").isin(kinds))
    # Offsets are from the capture's first data request, so a replay starts at once even if
    # the capture began with a quiet stretch of metadata traffic.
    t0 = traffic.agg(F.min("ts_request_received_us")).first()
    start_us = int(t0[0]) if t0 and t0[0] is not None else 0
    entries = traffic.select(
        F.when(F.col("api_key") == ApiKey.PRODUCE, "produce").otherwise("fetch").alias("kind"),
        "connection_id",
        ((F.col("ts_request_received_us") - start_us) / 1000.0 / speedup).alias("offset_ms"),
        F.coalesce(F.col("acks"), F.lit(-1)).cast("int").alias("acks"),
        F.coalesce(F.col("fetch_max_wait_ms"), F.lit(DEFAULT_FETCH_WAIT_MS)).cast("int").alias("max_wait_ms"),
        F.explode("partitions").alias("p"),
    ).select(
        "kind",
        "connection_id",
        "offset_ms",
        "acks",
        F.col("p.topic").alias("topic"),
        F.col("p.partition").alias("partition"),
        # A Produce entry always sends at least one record (its bytes must go somewhere).
        F.when(F.col("kind") == "produce", F.greatest(F.col("p.records"), F.lit(1)))
        .otherwise(F.coalesce(F.col("p.records"), F.lit(0)))
        .cast("int")
        .alias("records"),
        F.col("p.bytes").alias("bytes"),
        F.coalesce(F.col("p.compression"), F.lit(0)).cast("int").alias("compression"),
        "max_wait_ms",
    )
    copies_frame = raw.sparkSession.range(copies).select(F.col("id").cast("int").alias("copy"))
    return entries.crossJoin(copies_frame).select(*[c.split()[0] for c in SCHEDULE_SCHEMA.split(", ")])


def dry_run_figures(entries: DataFrame) -> dict[str, Any]:
    """Expected duration, requests, bytes and peak rates of a schedule (Produce; Fetch apart)."""
    request = F.struct("connection_id", "copy", "offset_ms")
    produce = F.col("kind") == "produce"
    totals = entries.agg(
        F.max("offset_ms").alias("duration_ms"),
        F.sum(F.when(produce, 1).otherwise(0)).alias("batches"),
        F.count_distinct(F.when(produce, request)).alias("requests"),
        F.sum(F.when(produce, F.col("bytes")).otherwise(0)).alias("bytes"),
        F.sum(F.when(produce, F.col("records")).otherwise(0)).alias("records"),
        F.count_distinct(F.when(~produce, request)).alias("fetch_requests"),
        F.sum(F.when(~produce, F.col("bytes")).otherwise(0)).alias("fetch_bytes"),
    ).first()
    per_second = entries.groupBy(F.floor(F.col("offset_ms") / 1000).alias("s")).agg(
        F.sum(F.when(produce, F.col("bytes")).otherwise(0)).alias("bps"),
        F.count_distinct(F.when(produce, request)).alias("rps"),
        F.sum(F.when(~produce, F.col("bytes")).otherwise(0)).alias("fetch_bps"),
    )
    peaks = per_second.agg(F.max("bps"), F.max("rps"), F.max("fetch_bps")).first()
    assert totals is not None and peaks is not None
    return {
        "duration_s": float(totals["duration_ms"] or 0) / 1000.0,
        "requests": int(totals["requests"]),
        "batches": int(totals["batches"] or 0),
        "records": int(totals["records"] or 0),
        "bytes": int(totals["bytes"] or 0),
        "peak_bytes_per_s": float(peaks[0] or 0),
        "peak_requests_per_s": float(peaks[1] or 0),
        "fetch_requests": int(totals["fetch_requests"]),
        "fetch_bytes": int(totals["fetch_bytes"] or 0),
        "peak_fetch_bytes_per_s": float(peaks[2] or 0),
    }


# ---------------------------------------------------------------- senders (run on executors)


def _result(kind: str, connection: int, copy: int, intended_s: float, nbytes: int, records: int) -> dict[str, Any]:
    """A result row as a request is sent: `actual_ms` now (wall clock, comparable across
    executors), `done_ms` filled in when it completes (NaN: never completed)."""
    return {
        "kind": kind,
        "connection_id": connection,
        "copy": copy,
        "intended_ms": intended_s * 1000.0,
        "actual_ms": time.time() * 1000.0,
        "done_ms": float("nan"),
        "bytes": nbytes,
        "records": records,
        "error": None,
        "throttle_ms": 0.0,
    }


def _throttle_rows(kind: str, connection: int, copy: int) -> tuple[list[dict[str, Any]], Any]:
    """Rows for the throttle times the target returns, and the librdkafka callback filling them."""
    rows: list[dict[str, Any]] = []

    def on_throttle(event: Any) -> None:
        row = _result(f"{kind}_throttle", connection, copy, time.time(), 0, 0)
        row["throttle_ms"] = float(event.throttle_time) * 1000.0
        rows.append(row)

    return rows, on_throttle


def send_produce(frame: pd.DataFrame, bootstrap: str, topic_prefix: str, start_at: float) -> list[dict[str, Any]]:
    """Send one connection copy's Produce batches in order at their due times."""
    from confluent_kafka import Producer

    first = frame.iloc[0]
    connection, copy = int(first["connection_id"]), int(first["copy"])
    throttles, on_throttle = _throttle_rows("produce", connection, copy)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": f"kqp-replay-{connection}-copy{copy}",
            "acks": "all" if int(first["acks"]) == -1 else str(int(first["acks"])),
            "compression.type": CODEC_NAMES.get(int(first["compression"]), "none"),
            "linger.ms": 0,
            # One request in flight keeps the connection's order, as the captured client had.
            "max.in.flight.requests.per.connection": 1,
            "throttle_cb": on_throttle,
        }
    )
    # Random payloads (seeded per connection copy, so a rerun sends the same bytes): a
    # constant payload would compress to nothing and misrepresent the captured load.
    rng = np.random.default_rng(connection * 1_000 + copy)
    rows: list[dict[str, Any]] = []

    # One delivery callback per captured batch, on its last record: librdkafka delivers a
    # partition's messages in order, so the last report marks the whole batch done.
    def reporter(row: dict[str, Any]) -> Any:
        def on_delivery(error: Any, _message: Any) -> None:
            row["done_ms"] = time.time() * 1000.0
            if error is not None:
                row["error"] = str(error.name())

        return on_delivery

    for entry in frame.itertuples():
        due = start_at + entry.offset_ms / 1000.0
        wait = due - time.time()
        if wait > 0:
            time.sleep(wait)
        records = int(entry.records)
        per_record = max(int(entry.bytes) // records, 1)
        row = _result("produce", connection, copy, due, int(entry.bytes), records)
        callback = reporter(row)
        topic = f"{topic_prefix}{entry.topic}"
        for index in range(records):
            while True:
                try:
                    producer.produce(
                        topic,
                        value=rng.bytes(per_record),
                        partition=int(entry.partition),
                        on_delivery=callback if index == records - 1 else None,
                    )
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.05)
        producer.poll(0)  # serve callbacks without waiting
        rows.append(row)
    producer.flush(FLUSH_TIMEOUT_S)
    return rows + throttles


def send_fetch(frame: pd.DataFrame, bootstrap: str, topic_prefix: str, start_at: float) -> list[dict[str, Any]]:
    """Read what one connection copy fetched, paced by its captured Fetches."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    first = frame.iloc[0]
    connection, copy = int(first["connection_id"]), int(first["copy"])
    throttles, on_throttle = _throttle_rows("fetch", connection, copy)
    assigned = sorted({(f"{topic_prefix}{t}", int(p)) for t, p in zip(frame["topic"], frame["partition"], strict=True)})
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"kqp-replay-{connection}-copy{copy}",
            "client.id": f"kqp-replay-{connection}-copy{copy}",
            # No group management: partitions are assigned by hand below, and nothing is
            # committed, so a retried task reads the same records again.
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "throttle_cb": on_throttle,
        }
    )
    consumer.assign([TopicPartition(topic, partition, 0) for topic, partition in assigned])
    rows: list[dict[str, Any]] = []
    wanted = taken = 0
    try:
        # One captured Fetch request = the entries sharing an offset.
        for offset_ms, request in frame.groupby("offset_ms", sort=True):
            due = start_at + float(offset_ms) / 1000.0
            wait = due - time.time()
            if wait > 0:
                time.sleep(wait)
            wanted += int(request["bytes"].sum())
            row = _result("fetch", connection, copy, due, 0, 0)
            deadline = time.time() + int(request["max_wait_ms"].iloc[0]) / 1000.0
            while taken < wanted and time.time() < deadline:
                message = consumer.poll(max(0.0, min(0.1, deadline - time.time())))
                if message is None:
                    continue
                error = message.error()
                if error is not None:
                    # End of partition is not an error: the producers may not have caught up.
                    if error.code() != KafkaError._PARTITION_EOF:
                        row["error"] = str(error.name())
                    continue
                size = len(message.value() or b"")
                taken += size
                row["bytes"] += size
                row["records"] += 1
            row["done_ms"] = time.time() * 1000.0
            rows.append(row)
    finally:
        consumer.close()
    return rows + throttles


def run_connections(batches: Iterator[pd.DataFrame], bootstrap: str, prefix: str, start_at: float) -> pd.DataFrame:
    """Run every connection copy of a task concurrently, one thread and one client each."""
    frame = pd.concat(list(batches), ignore_index=True)
    results: list[list[dict[str, Any]]] = []
    failures: list[BaseException] = []

    def run(kind: str, group: pd.DataFrame) -> None:
        try:
            send = send_produce if kind == "produce" else send_fetch
            results.append(send(group.sort_values("offset_ms", kind="stable"), bootstrap, prefix, start_at))
        except BaseException as error:  # surfaced below, so the task fails loudly
            failures.append(error)

    # Threads, not processes: the clients are librdkafka (C) and spend their time outside the
    # GIL, and a thread per connection keeps each connection's own pacing independent.
    threads = [
        threading.Thread(target=run, args=(kind, group), daemon=True)
        for (kind, _connection, _copy), group in frame.groupby(["kind", "connection_id", "copy"])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return pd.DataFrame([row for rows in results for row in rows], columns=RESULT_COLUMNS)


def replay(entries: DataFrame, options: LiveOptions) -> DataFrame:
    """Send the schedule: partitioned by connection, one task owning each connection."""
    # One start instant, fixed on the driver and shipped to every task: executors' wall clocks
    # are assumed NTP-synchronised, which is also what makes their latencies comparable.
    start_at = time.time() + options.start_delay_s
    bootstrap, prefix = options.bootstrap, options.topic_prefix
    tasks = options.tasks or entries.sparkSession.sparkContext.defaultParallelism

    def task(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        frame = run_connections(batches, bootstrap, prefix, start_at)
        if len(frame):
            yield frame

    # Hash-partitioning by (connection, copy) puts all of a connection copy's rows in one task.
    return entries.repartition(tasks, "connection_id", "copy").mapInPandas(task, RESULT_SCHEMA)


# ---------------------------------------------------------------- measurements (driver, pandas)


def percentiles(values: np.ndarray) -> dict[str, float | None]:
    """p50 ... p99.99 and max (None when there are no values)."""
    figures: dict[str, float | None] = dict.fromkeys([f"p{q}" for q in LATENCY_PERCENTILES] + ["max"])
    if len(values):
        for q, v in zip(LATENCY_PERCENTILES, np.percentile(values, LATENCY_PERCENTILES), strict=True):
            figures[f"p{q}"] = float(v)
        figures["max"] = float(values.max())
    return figures


def per_second(results: pd.DataFrame, start_ms: float) -> pd.DataFrame:
    """Per second of the run and kind: intended bytes (by due time) and achieved bytes (by completion).

    Achieved counts only requests that completed without error, so a target that refuses
    load shows as a gap between the two lines, not as a matching one."""
    done = results[results["done_ms"].notna() & results["error"].isna()]
    intended = results.groupby([((results["intended_ms"] - start_ms) // 1000).astype(int), "kind"])["bytes"].sum()
    achieved = done.groupby([((done["done_ms"] - start_ms) // 1000).astype(int), "kind"])["bytes"].sum()
    frame = pd.DataFrame({"intended_bytes": intended, "achieved_bytes": achieved}).fillna(0.0)
    frame.index.names = ["second", "kind"]
    return frame.reset_index().sort_values(["kind", "second"]).reset_index(drop=True)


def measurements(results: pd.DataFrame, intended: dict[str, Any]) -> dict[str, Any]:
    """Schedule lag and service latency percentiles, achieved vs intended throughput, errors, throttles."""
    figures: dict[str, Any] = {}
    throttles = results[results["kind"].str.endswith("_throttle")]
    for kind, intended_bytes in (("produce", intended["bytes"]), ("fetch", intended["fetch_bytes"])):
        rows = results[results["kind"] == kind]
        if rows.empty:
            continue
        done = rows[rows["done_ms"].notna()]
        ok = done[done["error"].isna()]
        # Achieved rate over the span from the first due time to the last completion: a
        # target that lags stretches the span and so lowers the rate.
        span_s = max((done["done_ms"].max() - rows["intended_ms"].min()) / 1000.0, 1e-3) if len(done) else 0.0
        kind_throttles = throttles[throttles["kind"] == f"{kind}_throttle"]["throttle_ms"]
        figures[kind] = {
            "requests": len(rows),
            "completed": len(done),
            "errors": rows["error"].dropna().value_counts().to_dict(),
            "schedule_lag_ms": percentiles((rows["actual_ms"] - rows["intended_ms"]).to_numpy()),
            "latency_ms": percentiles((done["done_ms"] - done["actual_ms"]).to_numpy()),
            "intended_bytes": int(intended_bytes),
            "achieved_bytes": int(ok["bytes"].sum()),
            "intended_bytes_per_s": intended_bytes / max(intended["duration_s"], 1e-3),
            "achieved_bytes_per_s": float(ok["bytes"].sum()) / span_s if span_s else 0.0,
            "throttle_events": len(kind_throttles),
            "throttle_ms_total": float(kind_throttles.sum()),
        }
    return figures


def _plot_intended_vs_achieved(series: pd.DataFrame) -> Any:
    import matplotlib.pyplot as plt

    kinds = list(series["kind"].unique())
    figure, axes = plt.subplots(len(kinds), 1, figsize=(11, 3.2 * len(kinds)), squeeze=False)
    for axis, kind in zip(axes[:, 0], kinds, strict=True):
        rows = series[series["kind"] == kind]
        axis.plot(rows["second"], rows["intended_bytes"] / 1e6, label="intended", drawstyle="steps-post")
        axis.plot(rows["second"], rows["achieved_bytes"] / 1e6, label="achieved", drawstyle="steps-post")
        axis.set_ylabel("MB/s")
        axis.set_title(f"{kind}: intended vs achieved bytes per second")
        axis.legend()
    axes[-1, 0].set_xlabel("second of the replay")
    return figure


def _plot_quantiles(results: pd.DataFrame) -> Any:
    import matplotlib.pyplot as plt

    quantiles = np.array([50, 75, 90, 95, 99, 99.9, 99.99])
    figure, axis = plt.subplots(figsize=(9, 4))
    for kind in ("produce", "fetch"):
        rows = results[(results["kind"] == kind) & results["done_ms"].notna()]
        if rows.empty:
            continue
        lag = np.percentile((rows["actual_ms"] - rows["intended_ms"]).to_numpy(), quantiles)
        latency = np.percentile((rows["done_ms"] - rows["actual_ms"]).to_numpy(), quantiles)
        axis.plot(range(len(quantiles)), np.maximum(lag, 1e-3), marker="o", label=f"{kind} schedule lag")
        axis.plot(range(len(quantiles)), np.maximum(latency, 1e-3), marker="s", label=f"{kind} latency")
    axis.set_xticks(range(len(quantiles)), [f"p{q:g}" for q in quantiles])
    axis.set_yscale("log")
    axis.set_ylabel("ms")
    axis.set_title("schedule lag (generator behind) vs service latency (target)")
    axis.legend()
    return figure


def write_live_outputs(summary: dict[str, Any], results: pd.DataFrame | None, output: str) -> None:
    from kqp.spark_jobs.report import Report, write_summary_and_report, write_tables

    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    intended = summary["intended"]
    report = Report("kqp live replay", out)
    options = summary["options"]
    report.paragraph(
        f"Capture `{options['capture']}` to `{options['bootstrap']}` at x{options['speedup']} speed, "
        f"{options['copies']} cop{'y' if options['copies'] == 1 else 'ies'}, topics prefixed "
        f"`{options['topic_prefix']}`. Schedule: {intended['requests']:,} Produce requests "
        f"({intended['bytes']:,} bytes, peak {intended['peak_bytes_per_s']:,.0f} B/s) and "
        f"{intended['fetch_requests']:,} Fetches ({intended['fetch_bytes']:,} bytes) over "
        f"{intended['duration_s']:.1f} s." + (" Dry run: nothing sent." if options["dry_run"] else "")
    )
    tables: dict[str, pd.DataFrame] = {}
    if results is not None:
        measured = summary["measured"]
        start_ms = float(results["intended_ms"].min())
        series = per_second(results[~results["kind"].str.endswith("_throttle")], start_ms)
        tables = {"requests": results, "per_second": series}
        rows = []
        for kind, figures in measured.items():
            for family in ("schedule_lag_ms", "latency_ms"):
                rows.append({"kind": kind, "measure": family, **figures[family]})
        report.heading("Schedule lag and latency (ms)")
        report.figure("quantiles", _plot_quantiles(results), "schedule lag vs latency quantiles")
        report.table(pd.DataFrame(rows))
        report.heading("Throughput: intended vs achieved")
        report.figure("intended_vs_achieved", _plot_intended_vs_achieved(series), "intended vs achieved bytes/s")
        report.table(
            pd.DataFrame(
                [
                    {
                        "kind": kind,
                        "requests": f["requests"],
                        "completed": f["completed"],
                        "intended_bytes_per_s": f["intended_bytes_per_s"],
                        "achieved_bytes_per_s": f["achieved_bytes_per_s"],
                        "errors": sum(f["errors"].values()),
                        "throttle_events": f["throttle_events"],
                        "throttle_ms_total": f["throttle_ms_total"],
                    }
                    for kind, f in measured.items()
                ]
            )
        )
        report.bullets([f"{kind} errors: {f['errors']}" for kind, f in measured.items() if f["errors"]])
    write_tables(out, tables)
    write_summary_and_report(out, summary, report, list(tables))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kqp replay live", description="Re-send captured Produce/Fetch load.", formatter_class=HelpFormatter
    )
    parser.add_argument("capture", help="capture directory (local path or Hadoop-compatible URI)")
    parser.add_argument("--bootstrap", required=True, help="target cluster bootstrap servers")
    parser.add_argument(
        "--output",
        help="directory for summary.json, report.html and the per-request results (default: none, summary on stdout)",
    )
    parser.add_argument(
        "--topic-prefix", default="replay.", help="prefix of the target topics: <prefix><captured topic>"
    )
    parser.add_argument("--speedup", type=float, default=1.0, help="time-scale factor (2 = twice as fast)")
    parser.add_argument("--copies", type=int, default=1, help="volume multiplier: replay each connection N times")
    parser.add_argument("--no-fetch", action="store_true", help="replay Produce only")
    parser.add_argument(
        "--tasks", type=int, help="Spark tasks the connections are spread over (default: the default parallelism)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the expected duration, requests, bytes, peaks")
    parser.add_argument("--master", help="Spark master URL (default: spark-submit's, else local[*])")
    return parser


def run_live(
    spark: SparkSession, options: LiveOptions, progress: Progress
) -> tuple[dict[str, Any], pd.DataFrame | None]:
    """Schedule (and unless a dry run, send); returns the summary and the per-request results."""
    if options.speedup <= 0 or options.copies < 1:
        raise ValueError("speedup must be > 0 and copies >= 1")
    entries = schedule(read_capture(spark, options.capture), options.speedup, options.copies, options.fetch).persist()
    intended = dry_run_figures(entries)
    progress.step(
        f"schedule: {intended['requests']} Produce requests, {intended['bytes']:,} bytes over "
        f"{intended['duration_s']:.1f} s, peak {intended['peak_bytes_per_s']:,.0f} B/s and "
        f"{intended['peak_requests_per_s']:,.0f} requests/s; {intended['fetch_requests']} Fetches, "
        f"{intended['fetch_bytes']:,} bytes"
    )
    summary: dict[str, Any] = {"schema": SUMMARY_SCHEMA, "options": asdict(options), "intended": intended}
    if options.dry_run:
        entries.unpersist()
        return summary, None
    results = to_pandas(replay(entries, options))
    entries.unpersist()
    progress.step(f"sent {int((~results['kind'].str.endswith('_throttle')).sum())} requests")
    summary["measured"] = measurements(results, intended)
    return summary, results


def main(argv: Sequence[str] | None = None) -> int:
    """Run live; exit 0, or 1 when the target returned errors."""
    from kqp.spark_jobs.session import get_spark

    args = build_parser().parse_args(argv)
    options = LiveOptions(
        capture=args.capture,
        bootstrap=args.bootstrap,
        output=args.output,
        topic_prefix=args.topic_prefix,
        speedup=args.speedup,
        copies=args.copies,
        dry_run=args.dry_run,
        fetch=not args.no_fetch,
        tasks=args.tasks,
    )
    spark = get_spark("kqp-live", args.master)
    summary, results = run_live(spark, options, Progress("live", 2))
    if options.output:
        write_live_outputs(summary, results, options.output)
    print(json.dumps(summary, indent=2, default=str))
    errors = sum(sum(f["errors"].values()) for f in summary.get("measured", {}).values())
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
