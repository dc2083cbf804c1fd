"""Acceptance: every Kafka 4.3 client feature works through the proxy.

The proxy advertises every API and version the brokers do and forwards what it does not
need to read as bytes, so the newer protocols work unchanged: the consumer group protocol
(KIP-848) with Java and librdkafka, share groups (KIP-932), transactions, and
kafka-metadata-quorum. Each client's sockets are watched: none may reach a broker port.
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from confluent_kafka import Producer

from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess
from tests.integration.helpers.feature_clients import api_versions_request, ask_api_versions, feature_clients
from tests.integration.helpers.socket_watch import SocketWatch
from tests.integration.helpers.through_proxy import (
    PARTITIONS,
    assert_only_proxy,
    committed_offsets,
    consume_and_commit,
    create_topic,
    end_offsets,
    run_watched,
)

pytestmark = pytest.mark.integration

RECORDS = 3000


def _java(cluster: KafkaCluster, *args: str) -> list[str]:
    return feature_clients(cluster, *args)


def _produce(bootstrap: str, topic: str, count: int, batches: int = 1, pause_s: float = 0.0) -> None:
    """`count` records spread over every partition (so every partition has a position to
    commit), in `batches` flushed `pause_s` apart."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    per_batch = -(-count // batches)
    for start in range(0, count, per_batch):
        for i in range(start, min(start + per_batch, count)):
            producer.produce(topic, str(i).encode(), partition=i % PARTITIONS)
        assert producer.flush(60) == 0
        if pause_s and start + per_batch < count:
            time.sleep(pause_s)  # traffic shape: records keep arriving while both members join


# ---- raw ApiVersions ------------------------------------------------------------------










@pytest.fixture
def proxy(proxy_for_test: ProxyProcess) -> ProxyProcess:
    """One proxy for the module's tests (conftest's shared_proxy): each passes its own topics and
    groups through it and reads nothing of the proxy's own."""
    return proxy_for_test


def test_proxy_advertises_every_api_and_version_of_every_broker(kafka_3nodes: KafkaCluster,
                                                                proxy: ProxyProcess) -> None:
    # Versions the proxy does not advertise as the broker does; the goal is none.
    documented_caps: dict[int, tuple[int, int]] = {}
    for node_id, node in kafka_3nodes.nodes.items():
        broker = ask_api_versions(node.plaintext_port)
        # The newer protocols are the point: they must be among what the brokers offer.
        assert {68, 69, 76, 77, 78, 79, 88} <= broker.keys()
        expected = {**broker, **documented_caps}
        assert ask_api_versions(proxy.node_port(node_id)) == expected
        assert ask_api_versions(proxy.bootstrap_port) == expected


def test_api_versions_error_for_a_bad_client_software_name_keeps_the_connection(proxy: ProxyProcess) -> None:
    with socket.create_connection(("127.0.0.1", proxy.bootstrap_port), timeout=10) as sock:
        error_code, _ = api_versions_request(sock, 7, software="bad name!")
        assert error_code == 42  # INVALID_REQUEST, as the broker answers it
        error_code, apis = api_versions_request(sock, 8)
        assert error_code == 0
        assert 18 in apis


# ---- clients --------------------------------------------------------------------------


def test_java_consumer_with_the_consumer_group_protocol(kafka_3nodes: KafkaCluster, proxy: ProxyProcess,
                                                        topic_name: str) -> None:
    create_topic(proxy.bootstrap, topic_name)
    _produce(proxy.bootstrap, topic_name, RECORDS)
    group = f"{topic_name}-kip848"
    run = run_watched(_java(kafka_3nodes, "consume", proxy.bootstrap, topic_name, group, str(RECORDS),
                            "group.protocol=consumer"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"consumed {RECORDS}" in run.stdout
    values = [line.split(" ", 1)[1] for line in run.stdout.splitlines() if line.startswith("value ")]
    assert sorted(values, key=int) == [str(i) for i in range(RECORDS)]
    ends = end_offsets(proxy.bootstrap, topic_name)
    assert sum(ends) == RECORDS
    assert committed_offsets(proxy.bootstrap, group, topic_name) == ends
    assert_only_proxy(run.watch, proxy, kafka_3nodes)


def test_librdkafka_consumer_with_the_consumer_group_protocol(kafka_3nodes: KafkaCluster, proxy: ProxyProcess,
                                                              topic_name: str) -> None:
    create_topic(proxy.bootstrap, topic_name)
    group = f"{topic_name}-kip848"
    with SocketWatch() as watch:
        _produce(proxy.bootstrap, topic_name, RECORDS)
        values = consume_and_commit(proxy.bootstrap, topic_name, group, RECORDS, **{"group.protocol": "consumer"})
    assert sorted(values, key=int) == [str(i) for i in range(RECORDS)]
    ends = end_offsets(proxy.bootstrap, topic_name)
    assert committed_offsets(proxy.bootstrap, group, topic_name) == ends
    assert sum(ends) == RECORDS
    assert_only_proxy(watch, proxy, kafka_3nodes)


def test_share_group_consumers_get_every_record(kafka_3nodes: KafkaCluster, proxy: ProxyProcess,
                                                topic_name: str) -> None:
    create_topic(proxy.bootstrap, topic_name)
    _produce(proxy.bootstrap, topic_name, RECORDS)
    run = run_watched(_java(kafka_3nodes, "share-consume", proxy.bootstrap, topic_name, f"{topic_name}-share",
                            str(RECORDS), "90"), timeout_s=240)
    assert run.returncode == 0, run.stderr[-3000:]
    values = [line.split(" ", 1)[1] for line in run.stdout.splitlines() if line.startswith("value ")]
    assert sorted(values, key=int) == [str(i) for i in range(RECORDS)]
    assert_only_proxy(run.watch, proxy, kafka_3nodes)


def test_two_share_consumers_split_the_records_with_none_lost(kafka_3nodes: KafkaCluster, proxy: ProxyProcess,
                                                              topic_name: str) -> None:
    create_topic(proxy.bootstrap, topic_name)
    command = _java(kafka_3nodes, "share-consume", proxy.bootstrap, topic_name, f"{topic_name}-share",
                    str(RECORDS), "120", "15")
    with ThreadPoolExecutor(2) as pool:
        members = [pool.submit(run_watched, command, timeout_s=240) for _ in range(2)]
        # Records arrive over ~12 s, so both members are in the group while there is work to
        # share: records produced before the second member joined could all go to the first.
        _produce(proxy.bootstrap, topic_name, RECORDS, batches=30, pause_s=0.4)
        runs = [member.result() for member in members]
    per_consumer = []
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
        per_consumer.append([line.split(" ", 1)[1] for line in run.stdout.splitlines() if line.startswith("value ")])
    # Every record delivered and acknowledged once, across the two members.
    assert sorted(per_consumer[0] + per_consumer[1], key=int) == [str(i) for i in range(RECORDS)]
    assert all(per_consumer), f"one member got nothing: {[len(v) for v in per_consumer]}"
    for run in runs:
        assert_only_proxy(run.watch, proxy, kafka_3nodes)


def test_transactions_read_committed_gets_exactly_the_committed_records(
        kafka_3nodes: KafkaCluster, proxy: ProxyProcess, topic_name: str) -> None:
    create_topic(proxy.bootstrap, topic_name)
    committed, aborted = 1500, 700
    produced = run_watched(_java(kafka_3nodes, "txn-produce", proxy.bootstrap, topic_name,
                                 str(committed), str(aborted)))
    assert produced.returncode == 0, produced.stderr[-3000:]
    assert f"committed {committed} aborted {aborted}" in produced.stdout
    consumed = run_watched(_java(kafka_3nodes, "consume", proxy.bootstrap, topic_name, f"{topic_name}-rc",
                                 str(committed), "isolation.level=read_committed"))
    assert consumed.returncode == 0, consumed.stderr[-3000:]
    values = [line.split(" ", 1)[1] for line in consumed.stdout.splitlines() if line.startswith("value ")]
    assert sorted(values) == sorted(f"c{i}" for i in range(committed))
    assert f"consumed {committed}" in consumed.stdout
    for run in (produced, consumed):
        assert_only_proxy(run.watch, proxy, kafka_3nodes)


@pytest.mark.parametrize("mode", ["--status", "--replication"])
def test_metadata_quorum_tool_prints_no_upstream_address(kafka_3nodes: KafkaCluster, proxy: ProxyProcess,
                                                         mode: str) -> None:
    run = run_watched(kafka_3nodes.tool_command("org.apache.kafka.tools.MetadataQuorumCommand",
                                                "--bootstrap-server", proxy.bootstrap, "describe", mode))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "LeaderId" in run.stdout or "NodeId" in run.stdout, run.stdout
    upstream_ports = {str(n.plaintext_port) for n in kafka_3nodes.nodes.values()} | {
        str(n.controller_port) for n in kafka_3nodes.nodes.values()} | {
        str(n.sasl_port) for n in kafka_3nodes.nodes.values()}
    leaked = [port for port in upstream_ports if f":{port}" in run.stdout]
    assert not leaked, run.stdout
    assert_only_proxy(run.watch, proxy, kafka_3nodes)

