"""Acceptance (issue 11): SASL passwords never leave the proxy in its log, metrics or capture.

PLAIN carries the password in clear inside SaslAuthenticate; SCRAM carries a proof derived
from it. Clients authenticate through the proxy with both, produce and consume, then the
proxy's log, its /metrics text and every capture file (raw bytes and every decoded value)
are searched for each password.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, Producer

from harness.local_kafka import USERS, KafkaCluster
from tests.integration.helpers.quota_proxy import ConfiguredProxy

pytestmark = pytest.mark.integration


def _client(mechanism: str, user: str) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": USERS[user]}


def test_sasl_passwords_appear_nowhere(kafka_1node: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    capture = tmp_path / "capture"
    config = tmp_path / "kqp.yaml"
    config.write_text(
        f"capture:\n  enabled: true\n  directory: {capture}\n  rotate_seconds: 1\n"
        "quotas:\n  entries:\n    - entity: {user: alice}\n      producer_byte_rate: 10000000\n"
    )
    proxy = ConfiguredProxy(kafka_1node.sasl_bootstrap, tmp_path / "proxy.log", config)
    proxy.start()
    try:
        for mechanism, user in (("PLAIN", "alice"), ("SCRAM-SHA-256", "bob"), ("SCRAM-SHA-512", "admin")):
            auth = _client(mechanism, user)
            producer = Producer({"bootstrap.servers": proxy.bootstrap, **auth})
            for i in range(100):
                producer.produce(topic_name, f"{mechanism}-{i}".encode())
            assert producer.flush(60) == 0
            del producer  # closes its connections before the proxy stops
            consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": f"{topic_name}-{user}",
                                 "auto.offset.reset": "earliest", **auth})
            consumer.subscribe([topic_name])
            got = 0
            deadline = time.monotonic() + 60
            while got < 100 and time.monotonic() < deadline:
                got += sum(1 for m in consumer.consume(100, timeout=1.0) if m.error() is None)
            consumer.close()
            assert got >= 100, f"{mechanism}: consumed {got}"
        metrics = proxy.metrics_text()
    finally:
        assert proxy.stop() == 0, proxy.log_tail()
    log = proxy.log_path.read_bytes()
    files = sorted(p for p in capture.rglob("*") if p.is_file())
    assert any(p.suffix == ".parquet" for p in files), f"nothing captured: {files}"
    decoded = [repr(pq.read_table(p).to_pylist()) for p in files if p.suffix == ".parquet"]
    assert 'user="alice"' in metrics or "alice" in "".join(decoded), "the searches see the traffic"
    for password in USERS.values():
        assert password.encode() not in log, f"{password} in the proxy log"
        assert password not in metrics, f"{password} in /metrics"
        for path in files:
            assert password.encode() not in path.read_bytes(), f"{password} in {path.name}"
        assert not any(password in text for text in decoded), f"{password} in a decoded capture"
