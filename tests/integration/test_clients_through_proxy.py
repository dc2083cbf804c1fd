"""Acceptance: real Kafka clients use the proxy as if it were the 3-broker cluster.

Each client produces 100,000 numbered records through the proxy and reads them back in a
consumer group that commits its offsets. What came back must be exactly what was sent
(count, distinct values and a checksum), the topic must hold exactly 100,000 records, the
group's committed offsets must cover all of them, and the client's sockets must only ever
have pointed at the proxy.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, Producer
from kafka import KafkaConsumer, KafkaProducer

from harness import perf_tools
from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess
from tests.integration.helpers.proxies import ProxyFactory
from tests.integration.helpers.socket_watch import SocketWatch
from tests.integration.helpers.tally import EXPECTED, RECORDS, Tally, numbered_values
from tests.integration.helpers.through_proxy import (
    PARTITIONS,
    assert_only_proxy,
    committed_offsets,
    create_topic,
    end_offsets,
    run_watched,
)

pytestmark = pytest.mark.integration

_CONSUME_DEADLINE_S = 120.0


def assert_group_complete(proxy: ProxyProcess, group: str, topic: str) -> None:
    """The topic holds exactly RECORDS records and the group has committed past all of them."""
    ends = end_offsets(proxy.bootstrap, topic)
    assert sum(ends) == RECORDS, f"topic holds {sum(ends)} records per partition {ends}, expected {RECORDS}"
    committed = committed_offsets(proxy.bootstrap, group, topic)
    assert committed == ends, f"group {group} committed {committed}, log end offsets are {ends}"


@pytest.fixture
def proxy(proxy_for_test: ProxyProcess, topic_name: str) -> ProxyProcess:
    """One proxy for the module's client tests (conftest's shared_proxy): each passes its own
    topic and group through it and reads nothing of the proxy's own."""
    create_topic(proxy_for_test.bootstrap, topic_name)
    return proxy_for_test


def test_confluent_kafka(kafka_3nodes: KafkaCluster, proxy: ProxyProcess, topic_name: str) -> None:
    group = f"{topic_name}-group"
    failures: list[str] = []

    def delivered(error: object, _message: object) -> None:
        if error is not None:
            failures.append(str(error))

    with SocketWatch() as watch:
        # librdkafka's sticky partitioner may put these small records in a few batches and
        # leave a partition empty, with nothing for the group to commit: a random partition per record.
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 5, "acks": "all",
                             "sticky.partitioning.linger.ms": 0})
        for value in numbered_values():
            while True:
                try:
                    producer.produce(topic_name, value, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
        assert producer.flush(60) == 0
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": group,
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.subscribe([topic_name])
        values: list[bytes] = []
        deadline = time.monotonic() + _CONSUME_DEADLINE_S
        while len(values) < RECORDS and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=5000, timeout=1.0):
                assert message.error() is None, message.error()
                values.append(message.value())
        consumer.commit(asynchronous=False)
        consumer.close()
    assert not failures, failures[:5]
    assert Tally.of(values) == EXPECTED
    assert_group_complete(proxy, group, topic_name)
    assert_only_proxy(watch, proxy, kafka_3nodes)


async def test_aiokafka(kafka_3nodes: KafkaCluster, proxy: ProxyProcess, topic_name: str) -> None:
    group = f"{topic_name}-group"
    with SocketWatch() as watch:
        producer = AIOKafkaProducer(bootstrap_servers=proxy.bootstrap, linger_ms=5, acks="all")
        await producer.start()
        try:
            sent = [await producer.send(topic_name, value) for value in numbered_values()]
            await asyncio.gather(*sent)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic_name, bootstrap_servers=proxy.bootstrap, group_id=group,
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        values: list[bytes] = []
        try:
            deadline = time.monotonic() + _CONSUME_DEADLINE_S
            while len(values) < RECORDS and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=1000, max_records=10000)
                for records in batches.values():
                    values.extend(record.value for record in records if record.value is not None)
            await consumer.commit()
        finally:
            await consumer.stop()
    assert Tally.of(values) == EXPECTED
    assert_group_complete(proxy, group, topic_name)
    assert_only_proxy(watch, proxy, kafka_3nodes)


def test_kafka_python(kafka_3nodes: KafkaCluster, proxy: ProxyProcess, topic_name: str) -> None:
    group = f"{topic_name}-group"
    with SocketWatch() as watch:
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, linger_ms=5, acks="all",
                                 batch_size=64 * 1024)
        futures = [producer.send(topic_name, value) for value in numbered_values()]
        producer.flush(60)
        producer.close()
        failed = [f.exception for f in futures if not f.succeeded()]
        assert not failed, failed[:5]
        consumer = KafkaConsumer(topic_name, bootstrap_servers=proxy.bootstrap, group_id=group,
                                 auto_offset_reset="earliest", enable_auto_commit=False)
        values: list[bytes] = []
        deadline = time.monotonic() + _CONSUME_DEADLINE_S
        while len(values) < RECORDS and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000, max_records=10000).values():
                values.extend(record.value for record in records)
        consumer.commit()
        consumer.close()
    assert Tally.of(values) == EXPECTED
    assert_group_complete(proxy, group, topic_name)
    assert_only_proxy(watch, proxy, kafka_3nodes)


def test_kcat(kafka_3nodes: KafkaCluster, proxy: ProxyProcess, topic_name: str, tmp_path: Path) -> None:
    group = f"{topic_name}-group"
    values_file = tmp_path / "values.txt"
    values_file.write_bytes(b"\n".join(numbered_values()) + b"\n")
    # Sticky partitioning off (as for confluent-kafka above), or a partition may get no batch at all.
    produced = run_watched(["kcat", "-P", "-b", proxy.bootstrap, "-t", topic_name, "-X", "linger.ms=5",
                            "-X", "sticky.partitioning.linger.ms=0", "-l", str(values_file)])
    assert produced.returncode == 0, produced.stderr
    consumed = run_watched(["kcat", "-b", proxy.bootstrap, "-G", group, "-X", "auto.offset.reset=earliest",
                            "-c", str(RECORDS), "-f", "%s\n", "-q", topic_name])
    assert consumed.returncode == 0, consumed.stderr
    assert Tally.of(line.encode() for line in consumed.stdout.splitlines()) == EXPECTED
    assert_group_complete(proxy, group, topic_name)
    assert_only_proxy(produced.watch, proxy, kafka_3nodes)
    assert_only_proxy(consumed.watch, proxy, kafka_3nodes)


def test_kafka_java_perf_and_console_tools(kafka_3nodes: KafkaCluster, proxy: ProxyProcess, topic_name: str) -> None:
    """ProducerPerformance sends "0".."99999"; ConsumerPerformance and ConsoleConsumer read them in groups."""
    produced = run_watched(perf_tools.producer_perf_command(
        kafka_3nodes, proxy.bootstrap, topic_name, RECORDS, 0, {"acks": "all", "linger.ms": "5"},
        payload_monotonic=True))
    assert produced.returncode == 0, produced.stderr
    assert perf_tools.parse_producer_output(produced.stdout).records == RECORDS

    perf_group = f"{topic_name}-perf"
    perf = run_watched(perf_tools.consumer_perf_command(kafka_3nodes, proxy.bootstrap, topic_name, RECORDS,
                                                        group=perf_group))
    assert perf.returncode == 0, perf.stderr
    assert perf_tools.parse_consumer_output(perf.stdout).records == RECORDS

    console_group = f"{topic_name}-console"
    console = run_watched(kafka_3nodes.tool_command(
        "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", proxy.bootstrap,
        "--topic", topic_name, "--group", console_group, "--from-beginning", "--max-messages", str(RECORDS),
        "--timeout-ms", "60000"))
    assert console.returncode == 0, console.stderr
    assert Tally.of(line.encode() for line in console.stdout.splitlines()) == EXPECTED
    assert_group_complete(proxy, console_group, topic_name)
    for run in (produced, perf, console):
        assert_only_proxy(run.watch, proxy, kafka_3nodes)


def test_topic_command_creates_alters_and_deletes(kafka_3nodes: KafkaCluster, start_proxy: ProxyFactory,
                                                  topic_name: str) -> None:
    proxy = start_proxy(kafka_3nodes)
    topic_command = "org.apache.kafka.tools.TopicCommand"

    def topics(*args: str) -> str:
        run = run_watched(kafka_3nodes.tool_command(topic_command, "--bootstrap-server", proxy.bootstrap, *args))
        assert run.returncode == 0, run.stderr
        assert_only_proxy(run.watch, proxy, kafka_3nodes)
        return run.stdout

    topics("--create", "--topic", topic_name, "--partitions", "1", "--replication-factor", "3")
    assert "PartitionCount: 1" in topics("--describe", "--topic", topic_name)
    topics("--alter", "--topic", topic_name, "--partitions", str(PARTITIONS + 1))
    described = topics("--describe", "--topic", topic_name)
    assert f"PartitionCount: {PARTITIONS + 1}" in described
    assert described.count("Leader:") == PARTITIONS + 1
    topics("--delete", "--topic", topic_name)
    deadline = time.monotonic() + 30
    while topic_name in topics("--list").split() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert topic_name not in topics("--list").split()
