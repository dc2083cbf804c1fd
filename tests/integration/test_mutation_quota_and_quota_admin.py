"""Acceptance (issue 4): KIP-599 controller mutation quota, and kafka-configs against the proxy.

The mutation quota is answered exactly as a broker answers it: topics over the quota get
THROTTLING_QUOTA_EXCEEDED (89) with the throttle, are left out of the request sent upstream,
and Kafka's AdminClient retries them until they all exist. DescribeClientQuotas and
AlterClientQuotas are answered by the proxy for its own quotas, so Kafka's ConfigCommand
shows and edits the quota file.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from harness.local_kafka import KafkaCluster
from tests.integration.helpers.mutations import THROTTLING_QUOTA_EXCEEDED, create_topics_raw
from tests.integration.helpers.quota_proxy import ConfiguredProxy

pytestmark = pytest.mark.integration

JAVA_ADMIN = Path(__file__).parent / "java" / "CreateTopicsWithRetries.java"








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
