"""Acceptance (issue 13): `kqp serve --workers 2` serves clients on one set of ports, shows
Prometheus one proxy with its workers labelled, and holds a quota across both workers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from kafka import KafkaConsumer, KafkaProducer

from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess
from tests.integration.helpers.fleet import (
    CLIENT_ID,
    QUOTA,
    fleet_config,
    metric,
    produce_through,
    steady_rate,
    wait_until,
)

pytestmark = pytest.mark.integration

WARMUP_S = 14
# Long enough past the cold start for both workers to have throttled the client; the rate this
# test prints is for the log (its accuracy is the system test's, see the end of the test).
STEADY_S = 16


def samples(proxy: ProxyProcess, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of one metric name."""
    found = []
    for line in proxy.metrics_text().splitlines():
        if line.startswith(name + "{"):
            labels_text, value = line[len(name) + 1:].rsplit("} ", 1)
            labels = dict(item.split("=", 1) for item in labels_text.split('",') if item)
            found.append(({k: v.strip('"') for k, v in labels.items()}, float(value)))
    return found


@pytest.fixture
def two_workers(kafka_1node: KafkaCluster, tmp_path: Path, topic_name: str) -> Iterator[ProxyProcess]:
    # The fleet's exchange is not enabled in the file: the workers share through their supervisor,
    # with no topic, and count each other in kqp_fleet_instances.
    config = fleet_config(tmp_path / "workers.yaml", f"_kqp_usage-{topic_name}", enabled=False)
    proxy = ProxyProcess(kafka_1node.bootstrap, tmp_path / "workers.log", config=config, workers=2)
    proxy.start()
    try:
        wait_until(lambda: metric(proxy, "kqp_fleet_instances", worker="0") == 2
                   and metric(proxy, "kqp_fleet_instances", worker="1") == 2, 60, "both workers in the fleet")
        yield proxy
    finally:
        code = proxy.stop()
        assert code == 0, f"kqp serve --workers 2 exit code {code}:\n{proxy.log_tail()}"


def test_clients_work_through_two_workers_and_metrics_show_both(
    kafka_1node: KafkaCluster, two_workers: ProxyProcess, topic_name: str
) -> None:
    proxy = two_workers
    assert len(proxy.pids()) == 3  # the supervisor and its two workers
    kafka_1node.create_topic(topic_name, partitions=2, replication=1)
    # Enough connections that the kernel gives each worker some.
    for round_index in range(4):
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "client.id": f"librdkafka-{round_index}"})
        for i in range(50):
            producer.produce(topic_name, f"r{round_index}-{i}".encode())
        assert producer.flush(30) == 0
        java_style = KafkaProducer(bootstrap_servers=proxy.bootstrap, client_id=f"kafka-python-{round_index}")
        for i in range(50):
            java_style.send(topic_name, f"k{round_index}-{i}".encode())
        java_style.flush(30)
        java_style.close()
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": f"{topic_name}-g",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic_name])
    seen: set[bytes] = set()
    deadline = time.monotonic() + 60
    while len(seen) < 400 and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            seen.add(message.value())
    consumer.close()
    assert len(seen) == 400
    other = KafkaConsumer(topic_name, bootstrap_servers=proxy.bootstrap, auto_offset_reset="earliest",
                          consumer_timeout_ms=10_000)
    assert len({m.value for m in other}) == 400
    other.close()

    opened = samples(proxy, "kqp_connections_opened_total")
    by_worker = {w: sum(v for labels, v in opened if labels.get("worker") == w) for w in ("0", "1")}
    assert all(count > 0 for count in by_worker.values()), f"connections per worker: {by_worker}"
    assert proxy.readyz() == 200


def test_a_quota_holds_across_both_workers(kafka_1node: KafkaCluster, two_workers: ProxyProcess,
                                           topic_name: str) -> None:
    proxy = two_workers
    kafka_1node.create_topic(topic_name, partitions=2, replication=1)
    seconds = WARMUP_S + STEADY_S
    per_second = [0] * (seconds + 1)
    lock = threading.Lock()
    start = time.monotonic()
    threads: list[threading.Thread] = []

    def producers_on(worker: str | None) -> float:
        """Broker (not bootstrap) connections on one worker, or on both (None)."""
        return sum(v for labels, v in samples(proxy, "kqp_connections_open")
                   if worker in (None, labels.get("worker")) and labels.get("listener") != "bootstrap")

    # Producers join until the kernel has given each worker at least one (usually 2 or 3).
    while len(threads) < 2 or not (producers_on("0") and producers_on("1")):
        assert len(threads) < 12, "SO_REUSEPORT never spread the producers over both workers"
        before = producers_on(None)
        thread = threading.Thread(target=produce_through, args=(proxy.bootstrap, topic_name, seconds, per_second,
                                                                 lock, start))
        thread.start()
        threads.append(thread)
        wait_until(lambda before=before: producers_on(None) > before, 30, "the new producer's broker connection")
    for thread in threads:
        thread.join(seconds + 60)
    rate = steady_rate(per_second, WARMUP_S, WARMUP_S + STEADY_S)
    print(f"{len(threads)} producers through --workers 2: {rate / QUOTA:.3f} x quota; per second "
          f"{[round(b / QUOTA, 1) for b in per_second]}")
    for worker in ("0", "1"):
        assert (metric(proxy, "kqp_throttle_time_seconds_total", client_id=CLIENT_ID, source="proxy",
                       worker=worker) or 0) > 0, f"worker {worker} never throttled the client"
    # How close the two workers hold the client to what one Kafka broker admits is the system
    # test's (`make system-test`, shape `workers-busy`: --workers 2, 1 MiB/s, with two CPU-bound
    # loops on the host, 0.95-1.05x of the quota beside Kafka's broker), not this test's (it held
    # the rate here to 10% of KAFKA_ADMITS). At this 256 KiB/s quota librdkafka's requests are
    # up to 1 MB, 4 s of the quota each, and are acknowledged every 3 or 4 s as the quota windows
    # expire in whole seconds: one request more or less in the 40 s of whole cycles it measured was
    # 4 s / 40 s = 10%, the whole bound, by phase alone (test_oauthbearer_through_proxy's same
    # client read 0.99x, 1.13x and 1.22x); and on a busy host issue 39 measured 0.59x in one run
    # and 1.02x in the next. What phase and load cannot move stays: both workers throttle the
    # client (each counts the other in kqp_fleet_instances, the fixture).
