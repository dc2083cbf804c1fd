"""Acceptance (issue 5): a known workload through the proxy with capture on, checked against
what the client says it sent and what the broker stored; the files read by pyarrow and Spark.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import KafkaError, Message, Producer

from harness import perf_tools
from harness.local_kafka import USERS, KafkaCluster
from kqp.capture.schema import META_RECORDS_DROPPED, META_RECORDS_WRITTEN
from kqp.protocol.apis import FETCH_KEY, PRODUCE_KEY, SASL_AUTHENTICATE_KEY, SASL_HANDSHAKE_KEY
from tests.integration.helpers.capture_workload import (
    FREE_CLIENT,
    REAL_CAPTURE_TOPIC,
    THROTTLED_CLIENT,
    THROTTLED_RECORDS,
    CaptureProxyConfig,
    capture_workload,
    read_capture,
    start_capture_proxy,
    stop_cleanly,
)

pytestmark = pytest.mark.integration

RECORDS = 3000
VALUE_SIZE = 500
PARTITIONS = 2
PRODUCER_ID = "capture-exact-producer"
CONSUMER_ID = "capture-exact-consumer"


class StatsProducer:
    """A librdkafka producer whose own statistics say how many Produce requests it sent."""

    def __init__(self, bootstrap: str, client_id: str, extra: dict[str, Any] | None = None) -> None:
        self._lock = threading.Lock()
        self._stats: list[dict[str, Any]] = []
        self.failures: list[KafkaError] = []
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "client.id": client_id, "acks": "all", "linger.ms": 5,
            "compression.type": "none", "enable.idempotence": False, "statistics.interval.ms": 100,
            "stats_cb": self._on_stats, **(extra or {}),
        })

    def _on_stats(self, text: str) -> None:
        with self._lock:
            self._stats.append(json.loads(text))

    def _on_delivery(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            self.failures.append(error)

    def send(self, topic: str, count: int, value_size: int, partitions: int) -> None:
        value = b"v" * value_size
        for index in range(count):
            while True:
                try:
                    self.producer.produce(topic, value, partition=index % partitions, on_delivery=self._on_delivery)
                    break
                except BufferError:
                    self.producer.poll(0.05)
            self.producer.poll(0)
        assert self.producer.flush(60) == 0
        assert not self.failures, self.failures

    def produce_requests_sent(self) -> int:
        """Produce requests over all broker connections, from a statistics report taken after the flush."""
        with self._lock:
            seen = len(self._stats)
        deadline = time.monotonic() + 10
        while True:
            self.producer.poll(0.1)
            with self._lock:
                if len(self._stats) >= seen + 2:
                    latest = self._stats[-1]
                    break
            assert time.monotonic() < deadline, "librdkafka sent no statistics"
        return sum(int(broker.get("req", {}).get("Produce", 0)) for broker in latest["brokers"].values())


def log_sizes(cluster: KafkaCluster, topic: str) -> dict[int, int]:
    """Bytes the broker holds per partition of `topic`, from DescribeLogDirs."""
    output = cluster.run_tool("org.apache.kafka.tools.LogDirsCommand", "--bootstrap-server", cluster.bootstrap,
                              "--describe", "--topic-list", topic).stdout
    report = json.loads(next(line for line in output.splitlines() if line.startswith("{")))
    return {int(p["partition"].rsplit("-", 1)[1]): int(p["size"])
            for broker in report["brokers"] for log_dir in broker["logDirs"] for p in log_dir["partitions"]}


def end_offsets(cluster: KafkaCluster, topic: str) -> dict[int, int]:
    output = cluster.run_tool("org.apache.kafka.tools.GetOffsetShell", "--bootstrap-server", cluster.bootstrap,
                              "--topic", topic, "--time", "-1").stdout
    return {int(line.split(":")[1]): int(line.split(":")[2]) for line in output.splitlines() if line.count(":") == 2}


def partition_rows(table: pa.Table) -> list[dict[str, Any]]:
    """One dict per (row, topic-partition entry), with the row's client_id and api_key."""
    return [{**entry, "client_id": row["client_id"], "api_key": row["api_key"]}
            for row in table.select(["client_id", "api_key", "partitions"]).to_pylist()
            for entry in row["partitions"] or []]


def rows_of(table: pa.Table, client_id: str, api_key: int) -> list[dict[str, Any]]:
    return [row for row in table.to_pylist() if row["client_id"] == client_id and row["api_key"] == api_key]


@pytest.fixture
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[1]").appName("kqp-capture-acceptance")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1").getOrCreate())
    try:
        yield session
    finally:
        session.stop()


def test_produce_and_fetch_rows_match_what_the_client_sent_and_the_broker_stored(
    kafka_1node: KafkaCluster, tmp_path: Path, topic_name: str, spark: Any
) -> None:
    capture_dir = tmp_path / "capture"
    proxy = start_capture_proxy(kafka_1node.bootstrap, tmp_path, CaptureProxyConfig(capture_dir))
    try:
        kafka_1node.create_topic(topic_name, partitions=PARTITIONS, replication=1, bootstrap=proxy.bootstrap)
        producer = StatsProducer(proxy.bootstrap, PRODUCER_ID)
        producer.send(topic_name, RECORDS, VALUE_SIZE, PARTITIONS)
        produce_requests = producer.produce_requests_sent()
        del producer
        consumer_props = tmp_path / "consumer.properties"
        consumer_props.write_text(f"client.id={CONSUMER_ID}\n")
        consumed = perf_tools.consumer_perf(kafka_1node, proxy.bootstrap, topic_name, RECORDS,
                                            group=f"{topic_name}-group", props_file=consumer_props, timeout=120)
    finally:
        stop_cleanly(proxy)
    assert consumed.records == RECORDS
    assert not list(capture_dir.rglob("*.inprogress")), "a file was left unclosed after SIGTERM"
    table = read_capture(capture_dir)

    # Produce: one row per request the client sent, and the batches the broker stored.
    produce = rows_of(table, PRODUCER_ID, PRODUCE_KEY)
    assert len(produce) == produce_requests > 0
    assert {row["acks"] for row in produce} == {-1}
    assert all(row["response_bytes"] and row["error_code"] == 0 for row in produce)
    entries = [e for e in partition_rows(table) if e["client_id"] == PRODUCER_ID and e["api_key"] == PRODUCE_KEY]
    assert {e["topic"] for e in entries} == {topic_name}
    assert {e["compression"] for e in entries} == {0}
    records_by_partition = Counter[int]()
    bytes_by_partition = Counter[int]()
    for entry in entries:
        records_by_partition[entry["partition"]] += entry["records"]
        bytes_by_partition[entry["partition"]] += entry["bytes"]
    assert sum(records_by_partition.values()) == RECORDS
    assert dict(records_by_partition) == end_offsets(kafka_1node, topic_name)
    # Uncompressed v2 batches are stored as sent, so the log holds exactly the captured batch bytes.
    assert dict(bytes_by_partition) == log_sizes(kafka_1node, topic_name)
    for row in produce:
        batch_bytes = sum(p["bytes"] for p in row["partitions"])
        assert batch_bytes < row["request_bytes"]
        assert row["ts_request_received_us"] <= row["ts_request_sent_us"] <= row["ts_response_received_us"] \
            <= row["ts_response_sent_us"]

    # Fetch: the Java consumer names topics by id (Fetch v13+); the proxy resolved them.
    fetch = rows_of(table, CONSUMER_ID, FETCH_KEY)
    assert fetch and min(row["api_version"] for row in fetch) >= 13
    fetched = [e for row in fetch for e in row["partitions"] or []]
    assert {e["topic"] for e in fetched} == {topic_name}
    assert sum(e["records"] for e in fetched) == RECORDS
    for row in fetch:
        assert row["response_bytes"] >= sum(p["bytes"] for p in row["partitions"] or [])
        assert (row["fetch_max_wait_ms"], row["fetch_max_bytes"]) == (500, 52_428_800)  # Java defaults
    assert any(row["group_id"] == f"{topic_name}-group" for row in table.to_pylist())

    # Footers account for every row and report no drops.
    files = sorted(capture_dir.rglob("*.parquet"))
    footers = [pq.read_metadata(path).metadata for path in files]
    assert sum(int(f[META_RECORDS_WRITTEN]) for f in footers) == table.num_rows
    assert sum(int(f[META_RECORDS_DROPPED]) for f in footers) == 0

    # Spark reads the same capture: row count, and Produce records once the partitions are exploded.
    from pyspark.sql import functions as F

    frame = spark.read.parquet(str(capture_dir))
    assert frame.count() == table.num_rows
    spark_records = (frame.where((F.col("client_id") == PRODUCER_ID) & (F.col("api_key") == PRODUCE_KEY))
                     .select(F.explode("partitions").alias("p")).agg(F.sum("p.records")).first())
    assert spark_records is not None and spark_records[0] == RECORDS
    assert {row["date"] for row in frame.select("date").distinct().collect()}


def test_sasl_frames_are_never_captured_and_rows_carry_the_principal(
    kafka_1node: KafkaCluster, tmp_path: Path, topic_name: str
) -> None:
    capture_dir = tmp_path / "capture"
    kafka_1node.create_topic(topic_name, partitions=1, replication=1)
    proxy = start_capture_proxy(kafka_1node.sasl_bootstrap, tmp_path, CaptureProxyConfig(capture_dir))
    try:
        producer = StatsProducer(proxy.bootstrap, "sasl-producer", {
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "alice", "sasl.password": USERS["alice"]})
        producer.send(topic_name, 200, 100, 1)
        del producer
    finally:
        stop_cleanly(proxy)
    table = read_capture(capture_dir)
    api_keys = set(table["api_key"].to_pylist())
    assert PRODUCE_KEY in api_keys
    assert not api_keys & {SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY}
    produce = [row for row in table.to_pylist() if row["api_key"] == PRODUCE_KEY]
    assert {row["principal"] for row in produce} == {"alice"}
    assert sum(p["records"] for row in produce for p in row["partitions"]) == 200


def test_real_capture_helper_records_proxy_throttles(kafka_1node: KafkaCluster, tmp_path: Path) -> None:
    table = read_capture(capture_workload(kafka_1node, tmp_path))
    rows = table.to_pylist()
    throttled = [row for row in rows if row["client_id"] == THROTTLED_CLIENT and row["api_key"] == PRODUCE_KEY]
    assert sum(p["records"] for row in throttled for p in row["partitions"]) == THROTTLED_RECORDS
    assert any(row["proxy_throttle_ms"] > 0 for row in throttled)
    free = [row for row in rows if row["client_id"] == FREE_CLIENT and row["api_key"] == PRODUCE_KEY]
    assert free and all(row["proxy_throttle_ms"] == 0 for row in free)
    assert any(row["api_key"] == FETCH_KEY and row["partitions"] and row["partitions"][0]["topic"] == REAL_CAPTURE_TOPIC
               for row in rows)
