"""TLS on both sides of a real `kqp serve` in front of a real broker's SSL listener.

Certificates are made for the run (harness/certificates.py). The broker requires client
certificates, so the proxy must originate TLS with its own; clients reach the proxy over TLS,
and an mTLS client's certificate subject, mapped by Kafka-style rules, is the user the proxy
reports in its metrics.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from kafka import KafkaConsumer, KafkaProducer

from harness.certificates import CertificateAuthority, IssuedCertificate, SslMaterial
from harness.local_kafka import KafkaCluster
from tests.integration.helpers.proxies import TlsProxyProcess

pytestmark = pytest.mark.integration

RECORDS = 500


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> SslMaterial:
    return SslMaterial.create(tmp_path_factory.mktemp("tls"), client_auth=True)


@pytest.fixture(scope="module")
def kafka_ssl(material: SslMaterial) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(nodes=1, ssl=material)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def certs(material: SslMaterial) -> dict[str, IssuedCertificate]:
    ca: CertificateAuthority = material.ca
    return {
        "proxy": ca.issue("proxy", "/CN=localhost/OU=proxies/O=kqp"),
        "proxy-upstream": ca.issue("proxy-upstream", "/CN=kqp-proxy/OU=proxies/O=kqp"),
        "alice": ca.issue("alice", "/O=kqp/OU=clients/CN=Alice"),
        "bob": ca.issue("bob", "/O=kqp/OU=clients/CN=Bob"),
    }


@pytest.fixture
def tls_proxy(kafka_ssl: KafkaCluster, material: SslMaterial, certs: dict[str, IssuedCertificate],
              tmp_path: Path) -> Iterator[TlsProxyProcess]:
    config = tmp_path / "kqp.yaml"
    config.write_text(f"""
proxy:
  tls:
    cert_file: {certs["proxy"].cert}
    key_file: {certs["proxy"].key}
    ca_file: {material.ca.cert}
    client_auth: requested
    principal_mapping_rules: "RULE:^CN=([^,]+),OU=clients,.*$/$1/L, DEFAULT"
upstream:
  bootstrap_servers: ["{kafka_ssl.ssl_bootstrap}"]
  tls:
    ca_file: {material.ca.cert}
    cert_file: {certs["proxy-upstream"].cert}
    key_file: {certs["proxy-upstream"].key}
quotas:
  entries:
    - entity: {{user: alice}}
      producer_byte_rate: 100000000
""")
    proxy = TlsProxyProcess(kafka_ssl.ssl_bootstrap, tmp_path / "proxy.log", config)
    proxy.start()
    yield proxy
    code = proxy.stop()
    assert code == 0, f"proxy exit code {code}:\n{proxy.log_tail()}"


def metric_value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_confluent_kafka_mtls_and_kafka_python_through_tls_both_ways(
    tls_proxy: TlsProxyProcess, material: SslMaterial, certs: dict[str, IssuedCertificate], topic_name: str
) -> None:
    ca = str(material.ca.cert)
    alice = certs["alice"]
    errors: list[object] = []
    producer = Producer({
        "bootstrap.servers": tls_proxy.bootstrap, "security.protocol": "SSL", "ssl.ca.location": ca,
        "ssl.certificate.location": str(alice.cert), "ssl.key.location": str(alice.key),
        "client.id": "alice-producer", "acks": "all", "linger.ms": 5,
    })
    for i in range(RECORDS):
        producer.produce(topic_name, key=str(i).encode(), value=f"record-{i}".encode(),
                         on_delivery=lambda error, _message: errors.append(error) if error else None)
    assert producer.flush(60) == 0
    assert not errors

    # kafka-python, no client certificate: the proxy accepts it (client_auth: requested).
    consumer = KafkaConsumer(
        topic_name, bootstrap_servers=tls_proxy.bootstrap, security_protocol="SSL", ssl_cafile=ca,
        group_id=f"{topic_name}-kp", auto_offset_reset="earliest", consumer_timeout_ms=20000,
        client_id="anonymous-consumer",
    )
    try:
        values = []
        for message in consumer:
            values.append(message.value.decode())
            if len(values) == RECORDS:
                break
    finally:
        consumer.close()
    assert sorted(values) == sorted(f"record-{i}" for i in range(RECORDS))

    # confluent-kafka reads them too, over mTLS as bob.
    bob = certs["bob"]
    reader = Consumer({
        "bootstrap.servers": tls_proxy.bootstrap, "security.protocol": "SSL", "ssl.ca.location": ca,
        "ssl.certificate.location": str(bob.cert), "ssl.key.location": str(bob.key),
        "group.id": f"{topic_name}-ck", "auto.offset.reset": "earliest",
    })
    try:
        reader.subscribe([topic_name])
        seen = 0
        deadline = time.monotonic() + 60
        while seen < RECORDS and time.monotonic() < deadline:
            message = reader.poll(1.0)
            if message is not None and message.error() is None:
                seen += 1
    finally:
        reader.close()
    assert seen == RECORDS

    # alice is the user of her requests: the certificate subject mapped by the rules.
    metrics = tls_proxy.metrics_text()
    produced = metric_value(metrics, "kqp_client_request_bytes_total", user="alice", client_id="alice-producer")
    assert produced > RECORDS * len("record-0")
    assert not re.search(r'user="CN=', metrics)

    # kafka-python producing with a client certificate works as well.
    kp = KafkaProducer(bootstrap_servers=tls_proxy.bootstrap, security_protocol="SSL", ssl_cafile=ca,
                       ssl_certfile=str(alice.cert), ssl_keyfile=str(alice.key), acks="all")
    try:
        kp.send(topic_name, b"from kafka-python").get(timeout=30)
    finally:
        kp.close()


def test_plaintext_client_on_the_tls_port_is_refused(tls_proxy: TlsProxyProcess) -> None:
    consumer = Consumer({"bootstrap.servers": tls_proxy.bootstrap, "group.id": "plaintext",
                         "socket.timeout.ms": 3000})
    try:
        with pytest.raises(KafkaException):
            consumer.list_topics(timeout=5)
    finally:
        consumer.close()


def test_untrusted_proxy_certificate_is_refused_by_the_client(
    tls_proxy: TlsProxyProcess, tmp_path: Path
) -> None:
    stranger = CertificateAuthority.create(tmp_path / "stranger", name="stranger CA")
    consumer = Consumer({"bootstrap.servers": tls_proxy.bootstrap, "group.id": "stranger",
                         "security.protocol": "SSL", "ssl.ca.location": str(stranger.cert)})
    try:
        with pytest.raises(KafkaException):
            consumer.list_topics(timeout=5)
    finally:
        consumer.close()
    # The client aborts the handshake; the proxy says so.
    deadline = time.monotonic() + 10
    while "TLS handshake failed" not in tls_proxy.log_path.read_text():
        assert time.monotonic() < deadline, tls_proxy.log_tail()
        time.sleep(0.05)
