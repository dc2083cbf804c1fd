"""Acceptance (issue 4): KIP-599 controller mutation quota, and kafka-configs against the proxy.

The mutation quota is answered exactly as a broker answers it: topics over the quota get
THROTTLING_QUOTA_EXCEEDED (89) with the throttle, are left out of the request sent upstream,
and Kafka's AdminClient retries them until they all exist. DescribeClientQuotas and
AlterClientQuotas are answered by the proxy for its own quotas, so Kafka's ConfigCommand
shows and edits the quota file.
"""

from __future__ import annotations

import socket
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from harness.local_kafka import KafkaCluster
from kqp.protocol.apis import API_SPECS, CREATE_TOPICS_KEY
from kqp.protocol.codec import decode_body
from kqp.protocol.headers import encode_request_header, response_body_offset
from tests.integration.test_quota_enforcement import ConfiguredProxy

pytestmark = pytest.mark.integration

THROTTLING_QUOTA_EXCEEDED = 89
JAVA_ADMIN = Path(__file__).parent / "java" / "CreateTopicsWithRetries.java"


@pytest.fixture
def mutation_proxy(kafka_1node: KafkaCluster, tmp_path: Path) -> Iterator[tuple[ConfiguredProxy, Path]]:
    config = tmp_path / "quotas.yaml"
    config.write_text(
        "# quotas for the mutation test\n"
        "quotas:\n"
        "  entries:\n"
        "    - entity: {client-id: creator}\n"
        "      controller_mutation_rate: 5\n"
    )
    proxy = ConfiguredProxy(kafka_1node.bootstrap, tmp_path / "proxy.log", config)
    proxy.start()
    try:
        yield proxy, config
    finally:
        assert proxy.stop() == 0, proxy.log_tail()


def create_topics_raw(port: int, client_id: str, names: list[str], partitions: int, version: int = 7) -> object:
    """One CreateTopics request, sent as bytes, and its decoded response."""
    request_class = API_SPECS[CREATE_TOPICS_KEY].request_class[version]
    topic_class = request_class.CreatableTopic
    request = request_class(
        topics=[topic_class(name=n, num_partitions=partitions, replication_factor=1, assignments=[], configs=[])
                for n in names],
        timeout_ms=30000, validate_only=False,
    )
    frame = encode_request_header(CREATE_TOPICS_KEY, version, 7, client_id) + bytes(request.encode(version=version))
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _read(sock, 4))[0]
        response = _read(sock, size)
    offset = response_body_offset(response, CREATE_TOPICS_KEY, version)
    return decode_body(CREATE_TOPICS_KEY, version, response[offset:], is_request=False)


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "connection closed mid-response"
        data += chunk
    return data


def test_kip599_strict_create_topics_then_admin_client_retries_create_them_all(
    kafka_1node: KafkaCluster, mutation_proxy: tuple[ConfiguredProxy, Path]
) -> None:
    proxy, _config = mutation_proxy
    names = [f"mutation-{i}" for i in range(7)]
    response = create_topics_raw(proxy.bootstrap_port, "creator", names, 80)
    errors = {t.name: t.error_code for t in response.topics}  # type: ignore[attr-defined]
    throttle = response.throttle_time_ms  # type: ignore[attr-defined]
    print(f"CreateTopics v7 through the proxy: errors {errors}, throttle {throttle} ms")
    # A full bucket of 5 x 11 = 55 tokens admits the first topic (80 partitions, debt 25 tokens);
    # the other six wait 25 / 5 = 5 s.
    assert errors[names[0]] == 0
    assert all(errors[n] == THROTTLING_QUOTA_EXCEEDED for n in names[1:])
    assert 4500 <= throttle <= 5000
    listed = kafka_1node.run_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server",
                                  kafka_1node.bootstrap, "--list").stdout.split()
    assert names[0] in listed and not set(names[1:]) & set(listed), listed

    # Kafka's AdminClient retries throttled topics after the throttle time until all exist.
    libs = kafka_1node.kafka_dir / "libs"
    result = subprocess.run(
        ["java", "-cp", f"{libs}/*", str(JAVA_ADMIN), proxy.bootstrap, "creator", "80", *names[1:]],
        capture_output=True, text=True, timeout=300, check=False,
    )
    print(result.stdout)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-3000:]}"
    created = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("created")]
    assert sorted(created) == sorted(names[1:])
    listed = kafka_1node.run_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server",
                                  kafka_1node.bootstrap, "--list").stdout.split()
    assert set(names) <= set(listed)


def config_command(cluster: KafkaCluster, bootstrap: str, *args: str) -> str:
    return cluster.run_tool("kafka.admin.ConfigCommand", "--bootstrap-server", bootstrap, *args).stdout


def test_kafka_configs_describes_and_alters_the_proxys_quotas(
    kafka_1node: KafkaCluster, mutation_proxy: tuple[ConfiguredProxy, Path]
) -> None:
    proxy, config = mutation_proxy
    described = config_command(kafka_1node, proxy.bootstrap, "--describe", "--entity-type", "clients",
                               "--entity-name", "creator")
    assert "controller_mutation_rate=5.0" in described, described

    config_command(kafka_1node, proxy.bootstrap, "--alter", "--add-config", "producer_byte_rate=2048",
                   "--entity-type", "clients", "--entity-name", "batch-job")
    config_command(kafka_1node, proxy.bootstrap, "--alter", "--add-config", "consumer_byte_rate=4096",
                   "--entity-type", "users", "--entity-default")
    # Written back to the quota file, which still validates and keeps the existing entry.
    entries = yaml.safe_load(config.read_text())["quotas"]["entries"]
    by_entity = {tuple(sorted(e["entity"].items())): e for e in entries}
    assert by_entity[(("client-id", "batch-job"),)]["producer_byte_rate"] == 2048
    assert by_entity[(("user", "<default>"),)]["consumer_byte_rate"] == 4096
    assert by_entity[(("client-id", "creator"),)]["controller_mutation_rate"] == 5
    described = config_command(kafka_1node, proxy.bootstrap, "--describe", "--entity-type", "clients",
                               "--entity-name", "batch-job")
    assert "producer_byte_rate=2048.0" in described, described

    # Kafka's validation: a non-positive quota is refused and nothing is written.
    before = config.read_text()
    refused = kafka_1node.run_tool("kafka.admin.ConfigCommand", "--bootstrap-server", proxy.bootstrap, "--alter",
                                   "--add-config", "producer_byte_rate=0", "--entity-type", "clients",
                                   "--entity-name", "batch-job", check=False)
    assert refused.returncode != 0
    assert "must be greater than 0" in refused.stdout + refused.stderr
    assert config.read_text() == before

    config_command(kafka_1node, proxy.bootstrap, "--alter", "--delete-config", "producer_byte_rate",
                   "--entity-type", "clients", "--entity-name", "batch-job")
    described = config_command(kafka_1node, proxy.bootstrap, "--describe", "--entity-type", "clients",
                               "--entity-name", "batch-job")
    assert "producer_byte_rate" not in described, described
