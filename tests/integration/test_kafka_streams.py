"""Acceptance: a Kafka Streams app works through the proxy, exactly once, with both protocols.

A stateless Streams app (processing.guarantee=exactly_once_v2) copies an input topic to an
output topic through the proxy, once with the classic group protocol and once with the
streams rebalance protocol (KIP-1071: StreamsGroupHeartbeat, API 88, production-ready since
Kafka 4.2 and on by default in 4.3). A read_committed consumer must then find every input
record in the output exactly once, and neither the app nor the consumer may have connected
to a broker directly.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess
from tests.integration.helpers.feature_clients import ask_api_versions, feature_clients
from tests.integration.helpers.through_proxy import PARTITIONS, assert_only_proxy, create_topic, run_watched

pytestmark = pytest.mark.integration

RECORDS = 2000
STREAMS_GROUP_HEARTBEAT = 88


def _java(cluster: KafkaCluster, *args: str) -> list[str]:
    return feature_clients(cluster, *args)


@pytest.fixture
def proxy(proxy_for_test: ProxyProcess) -> ProxyProcess:
    """One proxy for the module's tests (conftest's shared_proxy): each passes its own topics and
    groups through it and reads nothing of the proxy's own."""
    return proxy_for_test


@pytest.mark.parametrize("protocol", ["classic", "streams"])
def test_streams_app_processes_every_record_exactly_once(kafka_3nodes: KafkaCluster, proxy: ProxyProcess,
                                                         topic_name: str, protocol: str) -> None:
    if protocol == "streams":
        # The brokers offer the streams rebalance protocol, and so does the proxy.
        assert STREAMS_GROUP_HEARTBEAT in ask_api_versions(next(iter(kafka_3nodes.nodes.values())).plaintext_port)
        assert STREAMS_GROUP_HEARTBEAT in ask_api_versions(proxy.bootstrap_port)
    source, sink, app_id = f"{topic_name}-in", f"{topic_name}-out", f"{topic_name}-app"
    create_topic(proxy.bootstrap, source)
    create_topic(proxy.bootstrap, sink)
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(RECORDS):
        producer.produce(source, str(i).encode(), key=str(i).encode(), partition=i % PARTITIONS)
    assert producer.flush(60) == 0

    app = run_watched(_java(kafka_3nodes, "streams", proxy.bootstrap, source, sink, app_id, protocol,
                            str(RECORDS), "150"), timeout_s=240)
    assert app.returncode == 0, app.stderr[-3000:]
    assert f"processed {RECORDS}" in app.stdout, app.stdout[-2000:]

    consumed = run_watched(_java(kafka_3nodes, "consume", proxy.bootstrap, sink, f"{topic_name}-check",
                                 str(RECORDS), "isolation.level=read_committed"))
    assert consumed.returncode == 0, consumed.stderr[-3000:]
    values = [line.split(" ", 1)[1] for line in consumed.stdout.splitlines() if line.startswith("value ")]
    # Exactly once: every input record, no duplicate (the consumer polls on past RECORDS).
    assert sorted(values) == sorted(f"s-{i}" for i in range(RECORDS))

    # The app ran as a streams group only when asked to: the protocol really was exercised.
    listed = run_watched(kafka_3nodes.tool_command("org.apache.kafka.tools.streams.StreamsGroupCommand",
                                                   "--bootstrap-server", proxy.bootstrap, "--list"))
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert (app_id in listed.stdout.split()) == (protocol == "streams"), listed.stdout
    for run in (app, consumed, listed):
        assert_only_proxy(run.watch, proxy, kafka_3nodes)
