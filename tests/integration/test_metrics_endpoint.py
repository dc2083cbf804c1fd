"""Acceptance (issue 5): /metrics during a throttled consumer on real Kafka shows that client's
fetch throttle time and byte rate, and the latency the proxy adds. The producer side is
checked in test_quota_enforcement.py."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import perf_tools
from harness.local_kafka import KafkaCluster
from tests.integration.helpers.quota_proxy import ConfiguredProxy

pytestmark = pytest.mark.integration

CLIENT = "slow-consumer"
QUOTA = 128 * 1024  # bytes/s
RECORD_SIZE = 1024
RECORDS = 4096  # 4 MB: the first ~10 quota windows pass at once, then every fetch is throttled


def sample_values(text: str, name: str, **labels: str) -> list[float]:
    """Values of the samples called `name` whose labels include `labels`."""
    return [sample.value for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())]


@pytest.fixture
def throttling_proxy(kafka_1node: KafkaCluster, tmp_path: Path) -> Iterator[ConfiguredProxy]:
    config = tmp_path / "quotas.yaml"
    config.write_text(f"quotas:\n  entries:\n    - entity: {{client-id: {CLIENT}}}\n"
                      f"      consumer_byte_rate: {QUOTA}\n")
    proxy = ConfiguredProxy(kafka_1node.bootstrap, tmp_path / "proxy.log", config)
    proxy.start()
    try:
        yield proxy
    finally:
        code = proxy.stop()
        assert code == 0, f"proxy exit code {code}:\n{proxy.log_tail()}"


def test_metrics_show_fetch_throttle_byte_rate_and_proxy_latency_of_a_throttled_consumer(
    kafka_1node: KafkaCluster, throttling_proxy: ConfiguredProxy, tmp_path: Path, topic_name: str
) -> None:
    proxy = throttling_proxy
    kafka_1node.create_topic(topic_name, partitions=1, replication=1)
    perf_tools.producer_perf(kafka_1node, kafka_1node.bootstrap, topic_name, RECORDS, RECORD_SIZE,
                             props={"acks": "1", "linger.ms": "5", "batch.size": "65536"}, timeout=120)
    props = tmp_path / "consumer.properties"
    props.write_text(f"client.id={CLIENT}\n")
    command = perf_tools.consumer_perf_command(kafka_1node, proxy.bootstrap, topic_name, RECORDS,
                                               group=f"{topic_name}-group", props_file=props)
    consumer = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    throttle_labels = {"quota_type": "consumer_byte_rate", "client_id": CLIENT, "source": "proxy",
                       "enforced": "true"}
    try:
        deadline = time.monotonic() + 90
        while True:
            text = proxy.metrics_text()
            if sum(sample_values(text, "kqp_throttle_time_seconds_total", **throttle_labels)) > 0:
                break
            assert consumer.poll() is None, "the consumer finished without ever being throttled"
            assert time.monotonic() < deadline, "no fetch throttle reported for the client in time"
            time.sleep(0.5)
        later = proxy.metrics_text()
    finally:
        consumer.kill()
        consumer.wait()

    assert sum(sample_values(text, "kqp_throttles_total", **throttle_labels)) >= 1
    assert sum(sample_values(later, "kqp_throttle_duration_seconds_count", quota_type="consumer_byte_rate",
                             source="proxy")) >= 1
    # The byte rate Kafka's Fetch byte-rate sensor reports, and the quota it is held to. The
    # sensor is not over the quota after a throttle: as KafkaApis.handleFetchRequest does, a
    # fetch that is throttled is unrecorded (unrecordQuotaSensor) and answered empty, so the
    # sensor holds what the consumer was given, the fetches admitted before it. (Before kqp
    # answered throttled fetches as Kafka does, it delivered and kept them, and this read over
    # the quota.) What it must show is the client's traffic, read against its quota.
    usage = sample_values(text, "kqp_quota_usage", quota_type="consumer_byte_rate", client_id=CLIENT)
    limit = sample_values(text, "kqp_quota_limit", quota_type="consumer_byte_rate", client_id=CLIENT)
    assert limit == [QUOTA]
    assert usage and usage[0] > 0, text[-3000:]
    assert sum(sample_values(later, "kqp_client_response_bytes_total", client_id=CLIENT)) > QUOTA
    # The proxy-added latency histogram for Fetch, next to the broker time.
    added = sample_values(later, "kqp_request_proxy_latency_seconds_count", api="Fetch")
    broker = sample_values(later, "kqp_request_broker_latency_seconds_count", api="Fetch")
    assert added and added[0] > 0 and broker and broker[0] > 0
    assert sample_values(later, "kqp_request_proxy_latency_seconds_bucket", api="Fetch", le="+Inf") == added
