"""The socket check used by the acceptance tests can fail: a direct broker connection is caught."""

from __future__ import annotations

import pytest
from kafka import KafkaConsumer

from harness.local_kafka import KafkaCluster
from tests.integration.helpers.proxies import ProxyFactory
from tests.integration.helpers.socket_watch import SocketWatch
from tests.integration.helpers.through_proxy import assert_only_proxy

pytestmark = pytest.mark.integration


def test_direct_broker_connection_is_caught(kafka_1node: KafkaCluster, start_proxy: ProxyFactory) -> None:
    proxy = start_proxy(kafka_1node)
    with SocketWatch() as watch:
        through_proxy = KafkaConsumer(bootstrap_servers=proxy.bootstrap)
        assert through_proxy.topics() is not None
        direct = KafkaConsumer(bootstrap_servers=kafka_1node.bootstrap)
        assert direct.topics() is not None
        watch.sample()
        through_proxy.close()
        direct.close()
    assert watch.seen & kafka_1node.broker_ports
    with pytest.raises(AssertionError, match="directly"):
        assert_only_proxy(watch, proxy, kafka_1node)
