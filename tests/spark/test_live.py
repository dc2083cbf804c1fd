"""live: the schedule and dry-run figures, and a real replay against a local Kafka broker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.dataset as ds
import pytest

from harness.local_kafka import KafkaCluster
from kqp.spark_jobs.capture_source import read_capture
from kqp.spark_jobs.common import Progress
from kqp.spark_jobs.live import LiveOptions, dry_run_figures, run_live, schedule, write_live_outputs
from kqp.spark_jobs.synthetic import SyntheticSpec, write_capture
from tests.spark.helpers import exploded

pytestmark = pytest.mark.spark

REPLAY_SPEC = SyntheticSpec(
    requests=300, seconds=6, brokers=1, clients=4, principals=2, topics=2, partitions_per_topic=3, seed=5
)
PREFIX = "replay."


def test_dry_run_figures_scale_with_speedup_and_copies(
    spark: Any, capture_dir: Path, capture_rows: pd.DataFrame
) -> None:
    entries = schedule(read_capture(spark, str(capture_dir)), speedup=2.0, copies=3)
    figures = dry_run_figures(entries)
    traffic = capture_rows[capture_rows["api_key"].isin([0, 1])]
    produce = capture_rows[capture_rows["api_key"] == 0]
    parts = exploded(capture_rows)
    produce_parts = parts[parts["api_key"] == 0]
    start_us = traffic["ts_request_received_us"].min()
    span_ms = (parts["ts_request_received_us"].max() - start_us) / 1000.0
    assert figures["duration_s"] == pytest.approx(span_ms / 2 / 1000.0)
    assert figures["bytes"] == 3 * produce_parts["bytes"].sum()
    assert figures["batches"] == 3 * len(produce_parts)
    assert figures["requests"] == 3 * len(produce)
    assert figures["fetch_bytes"] == 3 * parts[parts["api_key"] == 1]["bytes"].sum()
    offset_s = (produce_parts["ts_request_received_us"] - start_us) / 1e6 / 2
    peak = produce_parts.groupby(offset_s.astype(int))["bytes"].sum().max() * 3
    assert figures["peak_bytes_per_s"] == peak


@pytest.fixture(scope="module")
def replay_capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    directory = tmp_path_factory.mktemp("replay-capture")
    write_capture(REPLAY_SPEC, directory)
    rows = ds.dataset(str(directory), format="parquet", partitioning="hive").to_table().to_pandas()
    return directory, rows


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kqp-test-offsets"})
    try:
        return {p: consumer.get_watermark_offsets(_partition(topic, p), timeout=30)[1] for p in range(partitions)}
    finally:
        consumer.close()


def _partition(topic: str, partition: int) -> Any:
    from confluent_kafka import TopicPartition

    return TopicPartition(topic, partition)


def test_replay_against_a_real_broker(
    spark: Any, kafka: KafkaCluster, replay_capture: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    directory, rows = replay_capture
    for topic in range(REPLAY_SPEC.topics):
        kafka.create_topic(f"{PREFIX}topic-{topic}", partitions=REPLAY_SPEC.partitions_per_topic, replication=1)
    copies, speedup = 2, 3.0
    options = LiveOptions(
        capture=str(directory),
        bootstrap=kafka.bootstrap,
        output=str(tmp_path),
        topic_prefix=PREFIX,
        speedup=speedup,
        copies=copies,
        start_delay_s=3.0,
        tasks=2,
    )
    summary, results = run_live(spark, options, Progress("live", 2))
    assert results is not None
    write_live_outputs(summary, results, str(tmp_path))

    parts = exploded(rows)
    produce_parts = parts[parts["api_key"] == 0]
    produce = summary["measured"]["produce"]
    # Every captured Produce partition entry was sent, once per copy, and acknowledged.
    assert produce["requests"] == copies * len(produce_parts)
    assert produce["completed"] == produce["requests"] and produce["errors"] == {}
    # The target holds exactly the captured record counts per partition, times the copies.
    expected = produce_parts.assign(records=produce_parts["records"].clip(lower=1))
    expected_counts = expected.groupby(["topic", "partition"])["records"].sum() * copies
    for topic in range(REPLAY_SPEC.topics):
        name = f"topic-{topic}"
        offsets = end_offsets(kafka.bootstrap, PREFIX + name, REPLAY_SPEC.partitions_per_topic)
        for partition, count in offsets.items():
            assert count == expected_counts.get((name, partition), 0), (name, partition)

    # The schedule keeps the captured spacing, compressed by the speed-up.
    produced = results[results["kind"] == "produce"]
    span_ms = (produced["intended_ms"].max() - produced["intended_ms"].min()) * speedup
    captured_us = produce_parts["ts_request_received_us"]
    assert span_ms == pytest.approx((captured_us.max() - captured_us.min()) / 1000.0, abs=1.0)
    assert (produced["actual_ms"] >= produced["intended_ms"]).all()
    assert produce["latency_ms"]["p50"] is not None and produce["latency_ms"]["p50"] > 0

    # Consumers replayed the captured Fetches on the replayed topics and read data.
    fetch = summary["measured"]["fetch"]
    fetches = rows[(rows["api_key"] == 1) & rows["partitions"].map(lambda p: p is not None and len(p) > 0)]
    assert fetch["requests"] == copies * len(fetches)
    assert fetch["completed"] == fetch["requests"]
    assert 0 < fetch["achieved_bytes"] <= fetch["intended_bytes"] + produce["intended_bytes"]

    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["schema"] == "kqp.replay.live/1"
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2
    per_second = pd.read_csv(tmp_path / "csv" / "per_second.csv")
    assert per_second[per_second["kind"] == "produce"]["intended_bytes"].sum() == copies * produce_parts["bytes"].sum()
