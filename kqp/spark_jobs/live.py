"""`live`: re-send a capture's Produce traffic to a target cluster, time-scaled.

Dry run (no cluster needed)::

    kqp replay live CAPTURE_DIR --bootstrap target:9092 --speedup 2 --dry-run

Against a cluster::

    cd /path/to/kqp && zip -qr /tmp/kqp.zip kqp
    spark-submit --master spark://host:7077 --conf spark.speculation=false --py-files /tmp/kqp.zip \\
        kqp/spark_jobs/live.py hdfs:///captures/kqp --bootstrap target:9092 --topic-prefix replay. \\
        --speedup 2 --copies 1 --output /shared/out/live

Schedule: a request captured at `ts` is due at `start + (ts - t0) / speedup`. Each original
connection is owned by one task (grouped by connection), which sends its requests in
captured order, so per-connection order is kept; `--copies N` replays every connection N
times (client-ids suffixed `-copyK`), which differs from speeding up. Payloads are
synthetic: per captured partition entry, the same record count and byte size, the same
acks and compression, to `<prefix><topic>` keyed by the captured partition number (the
target topic must exist; its partitioner maps keys to partitions).

Measured the way OpenMessaging Benchmark does: intended vs actual send time (schedule lag,
when the generator fell behind) separately from ack latency (actual send to delivery
report), with percentiles to p99.99, and achieved vs intended bytes/s. A retried Spark task
replays its slice again; speculation is off (session.BASE_CONF). Not yet replayed: Fetch
load (consumers reading the remapped topics).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kqp.spark_jobs.analyze import PRODUCE_KEY, Progress
from kqp.spark_jobs.capture_source import read_capture
from kqp.spark_jobs.session import to_pandas

SUMMARY_SCHEMA = "kqp.replay.live/1"
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
LATENCY_PERCENTILES = (50, 95, 99, 99.9, 99.99)
# How long a task waits for outstanding delivery reports after its last send.
FLUSH_TIMEOUT_S = 60.0


RESULT_SCHEMA = (
    "connection_id long, copy int, intended_ms double, actual_ms double, ack_ms double, bytes long, "
    "records int, error string"
)


@dataclass(frozen=True)
class LiveOptions:
    capture: str
    bootstrap: str
    output: str | None = None
    topic_prefix: str = "replay."
    speedup: float = 1.0
    copies: int = 1
    dry_run: bool = False
    start_delay_s: float = 5.0


def schedule(raw: DataFrame, speedup: float, copies: int) -> DataFrame:
    """One row per (connection copy, Produce partition entry) with its offset from the start."""
    produce = raw.where(F.col("api_key") == PRODUCE_KEY)
    t0 = produce.agg(F.min("ts_request_received_us")).first()
    start_us = int(t0[0]) if t0 and t0[0] is not None else 0
    entries = produce.select(
        "connection_id",
        ((F.col("ts_request_received_us") - start_us) / 1000.0 / speedup).alias("offset_ms"),
        F.coalesce(F.col("acks"), F.lit(-1)).cast("int").alias("acks"),
        F.explode("partitions").alias("p"),
    ).select(
        "connection_id",
        "offset_ms",
        "acks",
        F.col("p.topic").alias("topic"),
        F.col("p.partition").alias("partition"),
        F.greatest(F.col("p.records"), F.lit(1)).alias("records"),
        F.col("p.bytes").alias("bytes"),
        F.coalesce(F.col("p.compression"), F.lit(0)).cast("int").alias("compression"),
    )
    copies_frame = raw.sparkSession.range(copies).select(F.col("id").cast("int").alias("copy"))
    return entries.crossJoin(copies_frame)


def dry_run_figures(entries: DataFrame) -> dict[str, Any]:
    """Expected duration, requests, bytes and peak rates of a schedule."""
    totals = entries.agg(
        F.max("offset_ms").alias("duration_ms"),
        F.count("*").alias("batches"),
        F.countDistinct("connection_id", "copy", "offset_ms").alias("requests"),
        F.sum("bytes").alias("bytes"),
        F.sum("records").alias("records"),
    ).first()
    per_second = entries.groupBy(F.floor(F.col("offset_ms") / 1000).alias("s")).agg(
        F.sum("bytes").alias("bps"), F.countDistinct("connection_id", "copy", "offset_ms").alias("rps")
    )
    peaks = per_second.agg(F.max("bps"), F.max("rps")).first()
    assert totals is not None and peaks is not None
    return {
        "duration_s": float(totals["duration_ms"] or 0) / 1000.0,
        "requests": int(totals["requests"]),
        "batches": int(totals["batches"]),
        "records": int(totals["records"] or 0),
        "bytes": int(totals["bytes"] or 0),
        "peak_bytes_per_s": float(peaks[0] or 0),
        "peak_requests_per_s": float(peaks[1] or 0),
    }


def send_connection(frame: pd.DataFrame, bootstrap: str, topic_prefix: str, start_at: float) -> pd.DataFrame:
    """Send one connection copy's batches in order at their due times (runs on an executor)."""
    from confluent_kafka import Producer

    frame = frame.sort_values("offset_ms", kind="stable")
    first = frame.iloc[0]
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": f"kqp-replay-{first['connection_id']}-copy{first['copy']}",
            "acks": str(int(first["acks"])) if int(first["acks"]) != -1 else "all",
            "compression.type": CODEC_NAMES.get(int(first["compression"]), "none"),
            "linger.ms": 0,
            # One request in flight keeps the connection's order, as the captured client had.
            "max.in.flight.requests.per.connection": 1,
        }
    )
    rng = np.random.default_rng(int(first["connection_id"]))
    rows: list[dict[str, Any]] = []

    def reporter(row: dict[str, Any]) -> Any:
        def on_delivery(error: Any, _message: Any) -> None:
            row["ack_ms"] = time.time() * 1000.0
            if error is not None:
                row["error"] = str(error)

        return on_delivery

    for entry in frame.itertuples():
        due = start_at + entry.offset_ms / 1000.0
        wait = due - time.time()
        if wait > 0:
            time.sleep(wait)
        per_record = max(int(entry.bytes) // int(entry.records), 1)
        row: dict[str, Any] = {
            "connection_id": int(entry.connection_id),
            "copy": int(entry.copy),
            "intended_ms": due * 1000.0,
            "actual_ms": time.time() * 1000.0,
            "ack_ms": float("nan"),
            "bytes": int(entry.bytes),
            "records": int(entry.records),
            "error": None,
        }
        callback = reporter(row)
        for index in range(int(entry.records)):
            last = index == int(entry.records) - 1
            producer.produce(
                f"{topic_prefix}{entry.topic}",
                value=rng.bytes(per_record),
                key=str(entry.partition).encode(),
                on_delivery=callback if last else None,
            )
        producer.poll(0)
        rows.append(row)
    producer.flush(FLUSH_TIMEOUT_S)
    return pd.DataFrame(rows, columns=[c.split()[0] for c in RESULT_SCHEMA.split(", ")])


def replay(entries: DataFrame, options: LiveOptions) -> DataFrame:
    start_at = time.time() + options.start_delay_s
    bootstrap, prefix = options.bootstrap, options.topic_prefix

    def task(frame: pd.DataFrame) -> pd.DataFrame:
        return send_connection(frame, bootstrap, prefix, start_at)

    return entries.groupBy("connection_id", "copy").applyInPandas(task, RESULT_SCHEMA)


def measurements(results: pd.DataFrame, intended: dict[str, Any]) -> dict[str, Any]:
    """Schedule lag and ack latency percentiles, achieved vs intended throughput, errors."""
    lag = (results["actual_ms"] - results["intended_ms"]).to_numpy()
    acked = results[results["ack_ms"].notna()]
    latency = (acked["ack_ms"] - acked["actual_ms"]).to_numpy()

    def percentiles(values: np.ndarray) -> dict[str, float | None]:
        figures: dict[str, float | None] = dict.fromkeys([f"p{q}" for q in LATENCY_PERCENTILES] + ["max"])
        if len(values):
            for q, v in zip(LATENCY_PERCENTILES, np.percentile(values, LATENCY_PERCENTILES), strict=True):
                figures[f"p{q}"] = float(v)
            figures["max"] = float(values.max())
        return figures

    span_s = max((results["ack_ms"].max() - results["intended_ms"].min()) / 1000.0, 1e-3) if len(results) else 0.0
    return {
        "requests_sent": len(results),
        "requests_acked": len(acked),
        "errors": results["error"].dropna().value_counts().to_dict(),
        "schedule_lag_ms": percentiles(lag),
        "ack_latency_ms": percentiles(latency),
        "intended_bytes_per_s": intended["bytes"] / max(intended["duration_s"], 1e-3),
        "achieved_bytes_per_s": float(results["bytes"].sum()) / span_s if len(results) else 0.0,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kqp replay live", description="Re-send captured Produce traffic.")
    parser.add_argument("capture")
    parser.add_argument("--bootstrap", required=True, help="target cluster bootstrap servers")
    parser.add_argument("--output", help="directory for summary.json and the per-request results")
    parser.add_argument("--topic-prefix", default="replay.")
    parser.add_argument("--speedup", type=float, default=1.0, help="time-scale factor (2 = twice as fast)")
    parser.add_argument("--copies", type=int, default=1, help="volume multiplier: replay each connection N times")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--master")
    return parser


def run_live(spark: SparkSession, options: LiveOptions, progress: Progress) -> dict[str, Any]:
    if options.speedup <= 0 or options.copies < 1:
        raise ValueError("speedup must be > 0 and copies >= 1")
    entries = schedule(read_capture(spark, options.capture), options.speedup, options.copies).persist()
    intended = dry_run_figures(entries)
    progress.step(
        f"schedule: {intended['requests']} requests, {intended['bytes']:,} bytes over {intended['duration_s']:.1f} s, "
        f"peak {intended['peak_bytes_per_s']:,.0f} B/s and {intended['peak_requests_per_s']:,.0f} requests/s"
    )
    summary: dict[str, Any] = {"schema": SUMMARY_SCHEMA, "options": options.__dict__, "intended": intended}
    if options.dry_run:
        return summary
    results = to_pandas(replay(entries, options))
    progress.step(f"sent {len(results)} requests")
    summary["measured"] = measurements(results, intended)
    if options.output:
        out = Path(options.output)
        out.mkdir(parents=True, exist_ok=True)
        results.to_parquet(out / "requests.parquet", index=False)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    from kqp.spark_jobs.report import write_json
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
    )
    spark = get_spark("kqp-live", args.master)
    summary = run_live(spark, options, Progress("live", 2))
    print(json.dumps(summary, indent=2, default=str))
    if options.output:
        os.makedirs(options.output, exist_ok=True)
        write_json(Path(options.output) / "summary.json", summary)
    errors = summary.get("measured", {}).get("errors", {})
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
