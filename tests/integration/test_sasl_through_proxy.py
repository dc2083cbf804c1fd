"""SASL (SCRAM-SHA-256 and PLAIN) passes through the proxy to the broker's SASL_PLAINTEXT listener."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer

from harness.local_kafka import USERS, KafkaCluster
from tests.integration.helpers.proxies import ProxyFactory
from tests.integration.helpers.socket_watch import SocketWatch
from tests.integration.helpers.tally import Tally, numbered_values
from tests.integration.helpers.through_proxy import assert_only_proxy

pytestmark = pytest.mark.integration

_RECORDS = 2000


def _scram(user: str, password: str) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": user, "sasl.password": password}


def test_scram_sha256_confluent_kafka(kafka_1node: KafkaCluster, start_proxy: ProxyFactory, topic_name: str) -> None:
    proxy = start_proxy(kafka_1node, sasl=True)
    auth = _scram("alice", USERS["alice"])
    with SocketWatch() as watch:
        admin = AdminClient({"bootstrap.servers": proxy.bootstrap, **auth})
        admin.create_topics([NewTopic(topic_name, 2, replication_factor=1)])[topic_name].result(timeout=60)
        del admin
        producer = Producer({"bootstrap.servers": proxy.bootstrap, **auth})
        # Both partitions get records: an empty one has no offset to commit (-1001), and
        # librdkafka's sticky partitioner may put 2,000 small records all in one.
        for index, value in enumerate(numbered_values(_RECORDS)):
            producer.produce(topic_name, value, partition=index % 2)
        assert producer.flush(60) == 0
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": f"{topic_name}-group",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False, **auth})
        consumer.subscribe([topic_name])
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(values) < _RECORDS and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=1000, timeout=1.0):
                assert message.error() is None, message.error()
                values.append(message.value())
        consumer.commit(asynchronous=False)
        committed = consumer.committed(consumer.assignment(), timeout=30)
        consumer.close()
    assert Tally.of(values) == Tally.of(numbered_values(_RECORDS))
    assert sum(tp.offset for tp in committed) == _RECORDS
    assert_only_proxy(watch, proxy, kafka_1node)


def test_scram_wrong_password_is_refused_through_proxy(kafka_1node: KafkaCluster, start_proxy: ProxyFactory) -> None:
    proxy = start_proxy(kafka_1node, sasl=True)
    authentication_failed = threading.Event()

    def on_error(error: KafkaError) -> None:
        if error.code() == KafkaError._AUTHENTICATION:
            authentication_failed.set()

    producer = Producer({"bootstrap.servers": proxy.bootstrap, "error_cb": on_error,
                         **_scram("alice", "not-the-password")})
    deadline = time.monotonic() + 30
    while not authentication_failed.is_set() and time.monotonic() < deadline:
        producer.poll(0.2)
    assert authentication_failed.is_set(), "the broker's SCRAM rejection never reached the client"


def test_plain_kafka_python(kafka_1node: KafkaCluster, start_proxy: ProxyFactory, topic_name: str) -> None:
    proxy = start_proxy(kafka_1node, sasl=True)
    auth = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
            "sasl_plain_username": "bob", "sasl_plain_password": USERS["bob"]}
    with SocketWatch() as watch:
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, **auth)
        futures = [producer.send(topic_name, value) for value in numbered_values(_RECORDS)]
        producer.flush(60)
        producer.close()
        assert all(f.succeeded() for f in futures)
        consumer = KafkaConsumer(topic_name, bootstrap_servers=proxy.bootstrap, group_id=f"{topic_name}-group",
                                 auto_offset_reset="earliest", enable_auto_commit=False, **auth)
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(values) < _RECORDS and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                values.extend(record.value for record in records)
        consumer.commit()
        committed = sum(consumer.committed(tp) or 0 for tp in consumer.assignment())
        consumer.close()
    assert Tally.of(values) == Tally.of(numbered_values(_RECORDS))
    assert committed == _RECORDS
    assert_only_proxy(watch, proxy, kafka_1node)
