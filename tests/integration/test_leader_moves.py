"""Acceptance: a partition leader moves while Kafka's Java clients produce and fetch through the proxy.

Java clients of Kafka 4.3.1 speak Produce v13 and Fetch v18. When a partition moves away from
a broker, that broker answers them NOT_LEADER_OR_FOLLOWER with the new leader's id and its
address in NodeEndpoints (KIP-951), and the client goes straight there without a Metadata
round trip. The proxy must rewrite that address to its own: the proxy's
kqp_node_endpoints_rewritten_total shows it did, for Produce and for Fetch (so the test fails
if the moves missed the clients or the rewrite were skipped), and the socket watch shows the
clients never reached a broker. The partition moves by reassignment, as an operator would
move it, twice, with no broker stopped, so every record must be produced once and consumed.
"""

from __future__ import annotations

import pytest

from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess
from tests.integration.helpers.leader_moves import (
    RATE_PER_S,
    RECORDS,
    Operator,
    assert_moves_survived,
    java_client,
    run_through_leader_moves,
    wait_until,
)
from tests.integration.helpers.proxies import ProxyFactory

pytestmark = pytest.mark.integration


@pytest.fixture
def proxy(kafka_3nodes: KafkaCluster, start_proxy: ProxyFactory) -> ProxyProcess:
    proxy = start_proxy(kafka_3nodes)
    assert proxy.readyz() == 200
    return proxy


def test_leader_moves_under_java_producer_and_consumer(kafka_3nodes: KafkaCluster, proxy: ProxyProcess,
                                                      topic_name: str, request: pytest.FixtureRequest) -> None:
    one, two = sorted(kafka_3nodes.nodes)[:2]
    kafka_3nodes.run_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", kafka_3nodes.bootstrap,
                          "--create", "--topic", topic_name, "--replica-assignment", f"{one}:{two}")
    operator = Operator(kafka_3nodes, topic_name)
    request.addfinalizer(operator.close)
    wait_until(lambda: operator.leader() == one, 30, "the first replica to lead")

    producer_command = java_client(kafka_3nodes, "produce", proxy.bootstrap, topic_name, str(RECORDS), str(RATE_PER_S))
    # The classic protocol: in fresh-clone run 8 the KIP-848 AsyncKafkaConsumer died with
    # "IllegalStateException: Cannot set a new position without a valid current position"
    # during a move (KIP-848 through the proxy is covered in test_transparency.py).
    consumer_command = java_client(kafka_3nodes, "consume", proxy.bootstrap, topic_name, f"{topic_name}-group",
                             str(RECORDS), "group.protocol=classic")
    produced, consumed = run_through_leader_moves(proxy, operator, producer_command, consumer_command)
    assert_moves_survived(kafka_3nodes, proxy, operator, produced, consumed)

