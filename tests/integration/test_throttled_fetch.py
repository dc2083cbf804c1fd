"""A throttled fetch on the wire: Kafka's Java consumer (ConsoleConsumer, which uses incremental
fetch sessions, read_committed) reads a topic through kqp under a consumer_byte_rate quota.
Kafka answers a throttled fetch empty, unrecords its bytes and the consumer fetches the same
offsets again after the throttle (KafkaApis.handleFetchRequest); kqp now answers the same way,
having dropped the data the broker sent. Every record must arrive exactly once and in order,
whether the broker's responses were forwarded whole (captured connections) or cut through.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Producer

from harness.local_kafka import KafkaCluster
from kqp.protocol.apis import FETCH_KEY
from tests.integration.helpers.capture_workload import (
    CaptureProxyConfig,
    read_capture,
    start_capture_proxy,
    stop_cleanly,
)
from tests.integration.helpers.quota_proxy import ConfiguredProxy, quota_file

pytestmark = pytest.mark.integration

RECORDS = 3_000
VALUE_BYTES = 1_000
QUOTA = 128 * 1024  # 3 MB at 128 KiB/s: the ~1.3 MB a fresh window admits, then ~13 s of throttles
CLIENT_ID = "throttled-reader"
ENTRY = f"    - entity: {{client-id: {CLIENT_ID}}}\n      consumer_byte_rate: {QUOTA}\n"


def values() -> list[str]:
    # Numbered, so order and duplicates show; padded, so the topic is several windows' worth.
    return [f"{index:08d}" + "x" * (VALUE_BYTES - 8) for index in range(RECORDS)]


def produce_directly(cluster: KafkaCluster, topic: str) -> None:
    cluster.create_topic(topic, partitions=1, replication=1)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})
    for value in values():
        producer.produce(topic, value.encode())
        producer.poll(0)
    assert producer.flush(60) == 0


def consume_through(cluster: KafkaCluster, bootstrap: str, topic: str) -> list[str]:
    result = cluster.run_tool(
        "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", bootstrap, "--topic", topic,
        "--group", f"{topic}-readers", "--from-beginning", "--max-messages", str(RECORDS),
        "--timeout-ms", "60000", "--isolation-level", "read_committed",
        "--command-property", f"client.id={CLIENT_ID}", timeout=180.0)
    return result.stdout.splitlines()


def metric(text: str, name: str, *labels: str) -> float:
    lines = [line for line in text.splitlines() if line.startswith(name) and all(label in line for label in labels)]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_captured_throttled_fetches_are_answered_empty_and_nothing_is_lost(
    kafka_1node: KafkaCluster, tmp_path: Path
) -> None:
    topic = "throttled-fetch-captured"
    produce_directly(kafka_1node, topic)
    capture_dir = tmp_path / "capture"
    proxy = start_capture_proxy(kafka_1node.bootstrap, tmp_path / "proxy",
                                CaptureProxyConfig(capture_dir, quota_entries=ENTRY))
    try:
        consumed = consume_through(kafka_1node, proxy.bootstrap, topic)
    finally:
        stop_cleanly(proxy)
    assert consumed == values(), f"{len(consumed)} records, first differences: " + str(
        [(i, v[:8]) for i, v in enumerate(consumed) if i >= RECORDS or v != values()[i]][:5])
    fetches = [row for row in read_capture(capture_dir).to_pylist()
               if row["api_key"] == FETCH_KEY and row["client_id"] == CLIENT_ID]
    throttled = [row for row in fetches if row["proxy_throttle_ms"] > 0]
    delivered = [row for row in fetches if row["partitions"] and any(p["records"] for p in row["partitions"])]
    print(f"{len(fetches)} fetches: {len(throttled)} throttled, {len(delivered)} with records")
    assert throttled, "the quota never engaged"
    # Kafka's answer to a throttled fetch: no partitions at all (a few dozen bytes).
    assert all(row["partitions"] == [] and row["response_bytes"] < 100 for row in throttled), throttled[:3]
    assert all(row["proxy_throttle_ms"] == 0 for row in delivered)


def test_cut_through_throttled_fetches_lose_nothing(kafka_1node: KafkaCluster, tmp_path: Path) -> None:
    topic = "throttled-fetch-streamed"
    produce_directly(kafka_1node, topic)
    config = quota_file(tmp_path / "quotas.yaml", ENTRY)
    proxy = ConfiguredProxy(kafka_1node.bootstrap, tmp_path / "proxy.log", config)
    proxy.start()
    try:
        consumed = consume_through(kafka_1node, proxy.bootstrap, topic)
        metrics = proxy.metrics_text()
    finally:
        code = proxy.stop()
        assert code == 0, f"proxy exit code {code}:\n{proxy.log_tail()}"
    assert consumed == values(), f"{len(consumed)} records, first differences: " + str(
        [(i, v[:8]) for i, v in enumerate(consumed) if i >= RECORDS or v != values()[i]][:5])
    throttled_s = metric(metrics, "kqp_throttle_time_seconds_total", f'client_id="{CLIENT_ID}"', 'source="proxy"')
    print(f"proxy throttle time for {CLIENT_ID}: {throttled_s:.1f} s")
    assert throttled_s > 0, metrics[-3000:]
