"""Steps the acceptance tests share: topics and committed offsets through the proxy, and the
check that a client only ever talked to the proxy."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from harness.proxy_process import ProxyProcess
from tests.integration.helpers.socket_watch import SocketWatch

PARTITIONS = 3


def create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, replication_factor=-1)], operation_timeout=30)
    futures[topic].result(timeout=60)


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int = PARTITIONS) -> list[int]:
    """The group's committed offset per partition, read back through `bootstrap`."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
        return [tp.offset for tp in sorted(committed, key=lambda tp: tp.partition)]
    finally:
        consumer.close()


def consume_and_commit(bootstrap: str, topic: str, group: str, count: int, **config: str | int) -> list[str]:
    """Up to `count` values (decoded) read in `group` within 120 s, then committed synchronously."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, **config})
    values: list[str] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 120
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            values.append(message.value().decode())
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return values


def end_offsets(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> list[int]:
    """Log end offset (high watermark) per partition, read through `bootstrap`."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-end-offsets"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)]
    finally:
        consumer.close()


class Upstream(Protocol):
    """What the proxy fronts: a KafkaCluster, or a TansuBroker."""

    @property
    def nodes(self) -> Mapping[int, object]: ...

    @property
    def broker_ports(self) -> set[int]: ...


def assert_only_proxy(watch: SocketWatch, proxy: ProxyProcess, cluster: Upstream) -> None:
    """The watched process reached the proxy and never held a connection to a broker port."""
    proxy_ports = {proxy.bootstrap_port, *(proxy.node_port(n) for n in cluster.nodes)}
    assert watch.samples >= 3, "socket watch took too few samples to mean anything"
    assert watch.seen & proxy_ports, f"no connection to the proxy seen (saw ports {sorted(watch.seen)})"
    direct = watch.seen & cluster.broker_ports
    assert not direct, f"client connected to broker ports {sorted(direct)} directly"


@dataclass
class WatchedRun:
    returncode: int
    stdout: str
    stderr: str
    watch: SocketWatch


def run_watched(command: list[str], timeout_s: float = 180.0, stdin: bytes | None = None) -> WatchedRun:
    """Run a client process while sampling its sockets; raises if it does not finish in time."""
    process = subprocess.Popen(command, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with SocketWatch(process.pid) as watch:
        try:
            stdout, stderr = process.communicate(stdin, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            process.kill()
            stdout, stderr = process.communicate()
            message = f"{command[0]} did not finish in {timeout_s:.0f} s:\n{stderr.decode()[-3000:]}"
            raise AssertionError(message) from exc
    return WatchedRun(process.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace"), watch)
