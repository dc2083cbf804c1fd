"""Acceptance: failures around the proxy lose nothing that was acknowledged.

Real clients (confluent-kafka: an idempotent acks=all producer and a consumer group) run
through `kqp serve` while a broker of the 3-node cluster is killed, while the proxy itself is
restarted on the same ports, and while the only broker of a 1-node cluster is down. The
same client objects carry on throughout: nobody restarts them. Afterwards every
acknowledged value must be in the log exactly once and must have been consumed.
"""

from __future__ import annotations

import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess
from tests.integration.helpers.proxies import ProxyFactory
from tests.integration.helpers.socket_watch import SocketWatch
from tests.integration.helpers.tally import Tally
from tests.integration.helpers.through_proxy import assert_only_proxy

pytestmark = pytest.mark.integration

_PARTITIONS = 3


def create_replicated_topic(bootstrap: str, topic: str, replication: int, min_insync: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new_topic = NewTopic(topic, _PARTITIONS, replication_factor=replication,
                         config={"min.insync.replicas": str(min_insync)})
    admin.create_topics([new_topic], operation_timeout=30)[topic].result(timeout=60)


def wait_until(condition: object, timeout_s: float, what: str, interval_s: float = 0.1) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


@dataclass
class ProducerRun:
    """An idempotent acks=all producer sending b"0", b"1", ... from a thread at a steady rate.

    The thread keeps serving delivery reports and errors until `finish()`.
    """

    bootstrap: str
    topic: str
    records: int
    rate_per_s: float
    values: list[bytes] | None = None  # default: b"0" .. str(records - 1)
    acked: list[bytes] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    errors: list[tuple[float, str]] = field(default_factory=list)
    produced: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.producer = Producer({
            "bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            "message.timeout.ms": 180_000, "reconnect.backoff.max.ms": 1000,
            "error_cb": self._error,
        })
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"produce-{self.topic}", daemon=True)

    def _error(self, error: KafkaError) -> None:
        self.errors.append((time.monotonic(), str(error)))

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        with self._lock:
            if error is not None:
                self.failures.append(str(error))
            else:
                value = message.value()
                assert value is not None
                self.acked.append(value)

    @property
    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    def _run(self) -> None:
        started = time.monotonic()
        for i in range(self.records):
            # Pace by schedule, so a stall does not stretch the run by the records it held up.
            pause = started + i / self.rate_per_s - time.monotonic()
            if pause > 0:
                self.producer.poll(pause)
            while True:
                try:
                    value = str(i).encode() if self.values is None else self.values[i]
                    self.producer.produce(self.topic, value, on_delivery=self._delivered)
                    break
                except BufferError:
                    self.producer.poll(0.1)
            self.produced = i + 1
            self.producer.poll(0)
        # Delivery reports (and the counts waited on) only arrive while someone polls.
        while not self._done.is_set():
            self.producer.poll(0.05)

    def start(self) -> ProducerRun:
        self._thread.start()
        return self

    def finish(self, timeout_s: float = 180.0) -> None:
        wait_until(lambda: self.produced == self.records, timeout_s, "the producer to hand over every record")
        self._done.set()
        self._thread.join(timeout_s)
        remaining = self.producer.flush(timeout_s)
        assert remaining == 0, f"{remaining} records neither acknowledged nor failed after {timeout_s:.0f} s"


@dataclass
class ConsumerRun:
    """A consumer group member polling from a thread; records what it saw at each offset."""

    bootstrap: str
    topic: str
    group: str
    by_offset: dict[tuple[int, int], bytes] = field(default_factory=dict)
    deliveries: int = 0
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.consumer = Consumer({
            "bootstrap.servers": self.bootstrap, "group.id": self.group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "reconnect.backoff.max.ms": 1000,
        })
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"consume-{self.group}", daemon=True)

    def _run(self) -> None:
        self.consumer.subscribe([self.topic])
        while not self._stop.is_set():
            messages = self.consumer.consume(500, timeout=0.2)
            got = False
            for message in messages:
                error = message.error()
                if error is not None:
                    self.errors.append(str(error))
                    continue
                value = message.value()
                assert value is not None
                with self._lock:
                    self.by_offset[(message.partition() or 0, message.offset() or 0)] = value
                    self.deliveries += 1
                got = True
            if got:
                try:
                    self.consumer.commit(asynchronous=True)
                except KafkaException as exc:  # nothing to commit yet, or the coordinator moving: retried
                    self.errors.append(f"commit: {exc}")

    def values(self) -> set[bytes]:
        with self._lock:
            return set(self.by_offset.values())

    def start(self) -> ConsumerRun:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.consumer.close()


def read_whole_topic(bootstrap: str, topic: str, expected: int, timeout_s: float = 60.0) -> list[bytes]:
    """Every value in the topic, read by a fresh consumer (no group offsets) through `bootstrap`."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-read-back-{time.monotonic_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    values: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout_s
        while len(values) < expected and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.5):
                if message.error() is None and message.value() is not None:
                    values.append(message.value())  # type: ignore[arg-type]
        # Anything past `expected` would be a duplicate: give it a moment to show up.
        for message in consumer.consume(1000, timeout=2.0):
            if message.error() is None and message.value() is not None:
                values.append(message.value())  # type: ignore[arg-type]
    finally:
        consumer.close()
    return values


def assert_nothing_acknowledged_lost(producers: list[ProducerRun], consumer: ConsumerRun, bootstrap: str) -> None:
    """Every value the producers had acked was consumed, and the log holds each of them exactly once."""
    acked: list[bytes] = []
    for producer in producers:
        assert not producer.failures, f"{len(producer.failures)} records failed: {producer.failures[:5]}"
        assert producer.acked_count == producer.records
        acked += producer.acked
    wait_until(lambda: set(acked) <= consumer.values(), 120, "the consumer group to read every acknowledged record")
    # Distinct offsets carrying the same value would be a duplicate written by a retry.
    assert Tally.of(consumer.by_offset.values()) == Tally.of(acked), "the group's view of the log is not what was acked"
    stored = read_whole_topic(bootstrap, consumer.topic, len(acked))
    assert Tally.of(stored) == Tally.of(acked), "the topic does not hold each acked record exactly once"


def isr_complete(bootstrap: str, topics: list[str], brokers: int) -> bool:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    if len(metadata.brokers) < brokers:
        return False
    for name in topics:
        topic = metadata.topics.get(name)
        if topic is None or topic.error is not None:
            return False
        if any(len(p.isrs) < len(p.replicas) or p.leader < 0 for p in topic.partitions.values()):
            return False
    return True


def group_coordinator(bootstrap: str, group: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    description = admin.describe_consumer_groups([group])[group].result(timeout=30)
    return int(description.coordinator.id)


def test_broker_killed_under_idempotent_producer_and_group(
    kafka_3nodes: KafkaCluster, start_proxy: ProxyFactory, topic_name: str
) -> None:
    proxy = start_proxy(kafka_3nodes)
    create_replicated_topic(proxy.bootstrap, topic_name, replication=3, min_insync=2)
    group = f"{topic_name}-group"
    consumer = ConsumerRun(proxy.bootstrap, topic_name, group).start()
    producer = ProducerRun(proxy.bootstrap, topic_name, records=30_000, rate_per_s=1500).start()
    wait_until(lambda: producer.acked_count >= 5_000 and len(consumer.values()) >= 1_000, 60,
               "traffic through the proxy before the kill")
    # The group coordinator: losing it moves the group as well as partition leaders.
    victim = kafka_3nodes.nodes[group_coordinator(proxy.bootstrap, group)]
    kafka_3nodes.kill_node(victim.node_id)
    try:
        acked_at_kill = producer.acked_count
        killed_at = time.monotonic()
        wait_until(lambda: producer.acked_count >= acked_at_kill + 5_000, 90,
                   f"acknowledgements to resume after killing node {victim.node_id}")
        print(f"\nnode {victim.node_id} killed: 5,000 more acks {time.monotonic() - killed_at:.1f} s later")
        after_kill = set(producer.acked[acked_at_kill:])
    finally:
        if not victim.running:
            kafka_3nodes.start_node(victim.node_id)
    try:
        producer.finish()
        assert_nothing_acknowledged_lost([producer], consumer, proxy.bootstrap)
        assert after_kill <= consumer.values(), "the group stopped consuming after the kill"
    finally:
        consumer.stop()
        # Later tests share this cluster: leave every replica back in sync.
        wait_until(lambda: isr_complete(proxy.bootstrap, [topic_name, "__consumer_offsets"], 3), 120,
                   "under-replicated partitions to clear", interval_s=1.0)
    log = proxy.log_path.read_text()
    assert re.search(rf"upstream 127\.0\.0\.1:{victim.plaintext_port} unreachable"
                     rf"|via node-{victim.node_id} closed: broker (closed the connection|connection lost)", log), \
        f"the proxy did not log node {victim.node_id}'s failure"


def test_proxy_restarted_mid_run(kafka_3nodes: KafkaCluster, start_proxy: ProxyFactory, topic_name: str) -> None:
    proxy = start_proxy(kafka_3nodes)
    create_replicated_topic(proxy.bootstrap, topic_name, replication=3, min_insync=2)
    with SocketWatch() as watch:
        consumer = ConsumerRun(proxy.bootstrap, topic_name, f"{topic_name}-group").start()
        producer = ProducerRun(proxy.bootstrap, topic_name, records=20_000, rate_per_s=1500).start()
        try:
            wait_until(lambda: producer.acked_count >= 4_000 and len(consumer.values()) >= 1_000, 60,
                       "traffic through the proxy before the restart")
            # SIGTERM: in-flight requests are answered, then the process exits cleanly.
            assert proxy.stop() == 0
            acked_at_restart = producer.acked_count
            stopped_at = time.monotonic()
            proxy.start()  # a new `kqp serve` on the same bootstrap, node and metrics ports
            restarted_at = time.monotonic()
            wait_until(lambda: producer.acked_count > acked_at_restart, 60, "acks through the restarted proxy")
            print(f"\nproxy restart: serving again after {restarted_at - stopped_at:.2f} s, "
                  f"first ack {time.monotonic() - restarted_at:.2f} s later")
            wait_until(lambda: producer.acked_count >= acked_at_restart + 4_000, 90,
                       "acknowledgements to resume through the restarted proxy")
            producer.finish()
            assert_nothing_acknowledged_lost([producer], consumer, proxy.bootstrap)
        finally:
            consumer.stop()
    assert_only_proxy(watch, proxy, kafka_3nodes)


def api_versions_until_closed(port: int, timeout_s: float) -> tuple[float, bytes]:
    """Send ApiVersions v0; return the seconds until the proxy closed the connection and what it sent."""
    request = struct.pack(">hhih", 18, 0, 1, 0)
    started = time.monotonic()
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.sendall(struct.pack(">i", len(request)) + request)
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
    return time.monotonic() - started, received


def broker_drops(proxy: ProxyProcess) -> float:
    """Client connections the proxy closed because their broker went away."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in proxy.metrics_text().splitlines()
               if line.startswith("kqp_connections_closed_total") and 'reason="broker' in line)


def seconds_to_first_error(run: ProducerRun, since: float, timeout_s: float) -> float:
    """Seconds from `since` until the producer's error callback first fired."""
    wait_until(lambda: any(at >= since for at, _ in run.errors), timeout_s, "the client to report an error",
               interval_s=0.02)
    return min(at for at, _ in run.errors if at >= since) - since


def test_all_brokers_down_then_back(start_proxy: ProxyFactory, topic_name: str) -> None:
    cluster = KafkaCluster(nodes=1, heap="384m").start()
    try:
        proxy = start_proxy(cluster)
        create_replicated_topic(proxy.bootstrap, topic_name, replication=1, min_insync=1)
        consumer = ConsumerRun(proxy.bootstrap, topic_name, f"{topic_name}-group").start()
        producer = ProducerRun(proxy.bootstrap, topic_name, records=12_000, rate_per_s=1000).start()
        try:
            wait_until(lambda: producer.acked_count >= 2_000 and len(consumer.values()) >= 1_000, 60,
                       "traffic through the proxy before the outage")
            dropped_before = broker_drops(proxy)
            cluster.kill_node(1)
            killed_at = time.monotonic()
            # A connected client hears of it as soon as the proxy loses the broker: the proxy
            # closes its connections. (Whether librdkafka also raises an error callback for
            # that depends on whether it had requests in flight, so it is not what is timed.)
            wait_until(lambda: broker_drops(proxy) > dropped_before, 10,
                       "the proxy to close client connections of the lost broker", interval_s=0.02)
            existing_client_s = time.monotonic() - killed_at
            # ... and a new connection is closed, unanswered, as soon as no broker accepts it.
            raw_close_s, answer = api_versions_until_closed(proxy.bootstrap_port, 15)
            assert answer == b"", "the proxy answered a request with no broker up"
            late = ProducerRun(proxy.bootstrap, topic_name, records=1, rate_per_s=1, values=[b"sent-during-outage"])
            late_started = time.monotonic()
            late.start()
            new_client_s = seconds_to_first_error(late, late_started, 15)
            assert existing_client_s < 5, f"connected clients dropped {existing_client_s:.1f} s after the outage"
            assert raw_close_s < 3, f"new connection closed after {raw_close_s:.1f} s"
            assert new_client_s < 5, f"new client's first error after {new_client_s:.1f} s"
            acked_before_return = producer.acked_count
            cluster.start_node(1)
            returned_at = time.monotonic()
        finally:
            if not cluster.nodes[1].running:
                cluster.start_node(1)
        try:
            wait_until(lambda: producer.acked_count > acked_before_return, 60, "acknowledgements after the return")
            print(f"\nall brokers down: connected clients dropped after {existing_client_s:.2f} s, first error "
                  f"{raw_close_s:.3f} s (raw ApiVersions), {new_client_s:.2f} s (new producer); "
                  f"acks resumed {time.monotonic() - returned_at:.2f} s after the broker answered again")
            producer.finish()
            late.finish()
            assert late.acked == [b"sent-during-outage"], f"outage record: {late.failures}"
            assert_nothing_acknowledged_lost([producer, late], consumer, proxy.bootstrap)
        finally:
            consumer.stop()
    finally:
        cluster.stop()
