"""Acceptance (issue 44, criterion 1): real HAProxy in front of `kqp serve`, sending the PROXY
protocol (`send-proxy-v2`, and `send-proxy` for v1) from a source address of its own
(127.0.0.20, kqp's one trusted network), with clients bound to distinct loopback addresses.

Without the header kqp would see every client as the balancer: the per-IP rules below would
lump 127.0.0.2 and 127.0.0.3 together. With it, `max_connections_per_ip` and a KIP-612
connection-rate quota apply to each client's own address, and the capture and the logs name
it. A header from a source kqp does not trust, and none from a trusted one where the mode
requires it, are refused with a reason in the log and the metric. TLS with SNI routing works
behind HAProxy with PROXY v2 (the header comes before the ClientHello), for librdkafka too.

The per-IP checks use a raw ApiVersions client, because a Kafka client cannot be told which
local address to connect from (librdkafka, kafka-python and the Java client all leave it to
the kernel); the end-to-end client is librdkafka through HAProxy from 127.0.0.1.
"""

from __future__ import annotations

import re
import socket
import ssl
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from prometheus_client.parser import text_string_to_metric_families

from harness.certificates import CertificateAuthority
from harness.load_balancer import LoadBalancer
from harness.local_kafka import KafkaCluster, recv_exact
from harness.proxy_process import ProxyProcess, free_port_block
from tests.integration.helpers.capture_workload import read_capture
from tests.integration.helpers.proxies import TlsProxyProcess
from tests.unit.helpers.proxy_header import v2

pytestmark = pytest.mark.integration

BALANCER = "127.0.0.10"  # where clients connect
INSTANCE = "127.0.0.11"  # where kqp listens
BALANCER_SOURCE = "127.0.0.20"  # where HAProxy connects to kqp from: the one trusted network
CLIENT_A, CLIENT_B = "127.0.0.2", "127.0.0.3"
DOMAIN = "kqp.localhost"  # glibc's myhostname resolves it to loopback (see test_sni_routing.py)


CLIENT_ID = "kqp-proxy-protocol-test"


def api_versions_request(correlation_id: int) -> bytes:
    client_id = CLIENT_ID.encode()
    request = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    return struct.pack(">i", len(request)) + request


class RawClient:
    """One connection from `source` that sends ApiVersions: answered, or closed/held unanswered."""

    def __init__(self, source: str, host: str, port: int, prefix: bytes = b"", timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout, source_address=(source, 0))
        self.sock.sendall(prefix + api_versions_request(1))

    def answered(self) -> bool:
        try:
            size = struct.unpack(">i", recv_exact(self.sock, 4))[0]
            correlation_id, error_code = struct.unpack(">ih", recv_exact(self.sock, size)[:6])
        except OSError:  # closed (or reset, or held past the timeout) without an answer
            return False
        return bool(correlation_id == 1 and error_code == 0)

    def close(self) -> None:
        self.sock.close()


def one_round_trip(source: str, host: str, port: int) -> bool:
    client = RawClient(source, host, port)
    try:
        return client.answered()
    finally:
        client.close()


def metric(proxy: ProxyProcess, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(proxy.metrics_text()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def wait_until(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.fixture
def ports() -> tuple[int, int]:
    """(bootstrap port, node port base), free on the balancer's and kqp's addresses."""
    base = free_port_block(4, hosts=[BALANCER, INSTANCE, "127.0.0.12", "127.0.0.13"])
    return base + 3, base


def start_behind_haproxy(cluster: KafkaCluster, tmp_path: Path, ports: tuple[int, int], config: str,
                         server_options: str) -> tuple[ProxyProcess, LoadBalancer]:
    bootstrap_port, node_port_base = ports
    config_path = tmp_path / "kqp.yaml"
    config_path.write_text(config)
    proxy = ProxyProcess(cluster.bootstrap, tmp_path / "kqp.log", config=config_path, bind_host=INSTANCE,
                         advertised_host=BALANCER, ports=ports).start()
    (node,) = cluster.nodes
    (tmp_path / "haproxy").mkdir()
    balancer = LoadBalancer(BALANCER, [bootstrap_port, node_port_base + node], [INSTANCE], tmp_path / "haproxy",
                            server_options=server_options)
    try:
        balancer.start()
    except BaseException:
        proxy.stop()
        raise
    return proxy, balancer


def stop(proxy: ProxyProcess, *balancers: LoadBalancer) -> None:
    for balancer in balancers:
        balancer.stop()
    code = proxy.stop()
    assert code == 0, f"kqp exit code {code}:\n{proxy.log_tail()}"


V2_CONFIG = f"""
proxy:
  max_connections_per_ip: 2
  proxy_protocol:
    mode: v2
    trusted_networks: [{BALANCER_SOURCE}/32]
capture:
  enabled: true
  directory: {{capture}}
quotas:
  ip_entries:
    - ip: {CLIENT_B}
      connection_creation_rate: 1
"""


@pytest.fixture
def v2_behind_haproxy(kafka_1node: KafkaCluster, tmp_path: Path,
                      ports: tuple[int, int]) -> Iterator[tuple[ProxyProcess, LoadBalancer]]:
    proxy, balancer = start_behind_haproxy(kafka_1node, tmp_path, ports,
                                           V2_CONFIG.format(capture=tmp_path / "capture"),
                                           f"send-proxy-v2 source {BALANCER_SOURCE}")
    yield proxy, balancer
    balancer.stop()
    proxy.stop()  # the test stops it first, to read its capture; this is for a test that failed before


def test_v2_each_client_is_its_own_ip(v2_behind_haproxy: tuple[ProxyProcess, LoadBalancer], tmp_path: Path,
                                      ports: tuple[int, int]) -> None:
    proxy, balancer = v2_behind_haproxy
    bootstrap_port = ports[0]

    # max_connections_per_ip = 2, per client: A's third connection is refused, B's two are not
    # (seen as one IP, B's would have been refused too).
    held = [RawClient(CLIENT_A, BALANCER, bootstrap_port) for _ in range(2)]
    held += [RawClient(CLIENT_B, BALANCER, bootstrap_port) for _ in range(2)]
    assert [client.answered() for client in held] == [True] * 4
    third = RawClient(CLIENT_A, BALANCER, bootstrap_port)
    assert not third.answered()
    for client in [*held, third]:
        client.close()
    log = proxy.log_path.read_text()
    assert re.search(rf"from {re.escape(CLIENT_A)}:\d+ via bootstrap closed: too many connections from one IP "
                     rf"\({re.escape(CLIENT_A)}, max_connections_per_ip=2\)", log), proxy.log_tail()
    assert f"({CLIENT_B}, max_connections_per_ip" not in log

    # A KIP-612 rate of one connection a second for B's address alone: B's connections are held
    # then closed once it bursts past what Kafka's sample windows allow; A's are all served.
    attempts = 14
    served_a = sum(one_round_trip(CLIENT_A, BALANCER, bootstrap_port) for _ in range(attempts))
    served_b = 0
    for _ in range(attempts):
        if not one_round_trip(CLIENT_B, BALANCER, bootstrap_port):
            break
        served_b += 1
    assert served_a == attempts
    assert served_b < attempts, "the connection-rate quota of 127.0.0.3 never held a connection"
    wait_until(lambda: metric(proxy, "kqp_connections_closed_total", listener="bootstrap", upstream_node="bootstrap",
                              reason="connection_creation_rate quota exceeded") >= 1, 15,
               "the held connection was not closed")
    log = proxy.log_path.read_text()
    assert re.search(rf"from {re.escape(CLIENT_B)}:\d+: connection_creation_rate exceeded", log)
    assert not re.search(rf"from {re.escape(CLIENT_A)}:\d+: connection_creation_rate exceeded", log)
    assert BALANCER_SOURCE not in "\n".join(line for line in log.splitlines() if "closed:" in line)
    print(f"served through HAProxy: {CLIENT_A} {served_a}/{attempts}, {CLIENT_B} {served_b} before its rate held one")

    # The capture names each client, never the balancer.
    code = proxy.stop()
    assert code == 0, proxy.log_tail()
    capture = read_capture(tmp_path / "capture").select(["client_address", "client_id"]).to_pylist()
    ips = {row["client_address"].rsplit(":", 1)[0] for row in capture if row["client_id"] == CLIENT_ID}
    assert ips == {CLIENT_A, CLIENT_B}, ips
    # The harness's readiness probe connects to kqp directly from 127.0.0.1, untrusted and
    # without a header: it keeps its own address. No row names the balancer.
    assert {row["client_address"].rsplit(":", 1)[0] for row in capture if row["client_id"] != CLIENT_ID} <= \
        {"127.0.0.1"}
    assert balancer.process is not None


def test_refused_headers_from_a_real_balancer(kafka_1node: KafkaCluster, tmp_path: Path,
                                              ports: tuple[int, int]) -> None:
    """Two misconfigured HAProxies: one sends headers from an address kqp does not trust, the
    other connects from the trusted address without `send-proxy-v2`."""
    proxy, balancer = start_behind_haproxy(kafka_1node, tmp_path, ports, V2_CONFIG.format(capture=tmp_path / "c"),
                                           f"send-proxy-v2 source {BALANCER_SOURCE}")
    untrusted = LoadBalancer("127.0.0.12", [ports[0]], [INSTANCE], tmp_path, server_options="send-proxy-v2")
    (tmp_path / "headerless").mkdir()
    headerless = LoadBalancer("127.0.0.13", [ports[0]], [INSTANCE], tmp_path / "headerless",
                              server_options=f"source {BALANCER_SOURCE}")
    try:
        untrusted.start()
        headerless.start()
        assert not one_round_trip(CLIENT_A, "127.0.0.12", ports[0])
        assert not one_round_trip(CLIENT_A, "127.0.0.13", ports[0])
        # The correctly configured balancer still serves.
        assert one_round_trip(CLIENT_A, BALANCER, ports[0])
        # A client reaching kqp directly may not name an address either.
        direct = RawClient(CLIENT_B, INSTANCE, ports[0], prefix=v2(("10.9.9.9", 1234)))
        assert not direct.answered()
        direct.close()
        wait_until(lambda: metric(proxy, "kqp_proxy_protocol_refused_total",
                                  reason="no header from trusted source") >= 1, 10, "no refusal counted")
        assert metric(proxy, "kqp_proxy_protocol_refused_total", reason="header from untrusted source") >= 2
        log = proxy.log_path.read_text()
        assert re.search(r"connection from 127\.0\.0\.1:\d+ via bootstrap refused: header from untrusted source: it "
                         r"sent a PROXY header but does not come from proxy_protocol.trusted_networks", log)
        assert re.search(rf"connection from {re.escape(CLIENT_B)}:\d+ via bootstrap refused: header from untrusted "
                         rf"source", log)
        assert re.search(rf"connection from {re.escape(BALANCER_SOURCE)}:\d+ via bootstrap refused: no header from "
                         rf"trusted source: it comes from a trusted network but sent no PROXY header; this listener "
                         rf"requires v2 from there", log)
    finally:
        untrusted.stop()
        headerless.stop()
        stop(proxy, balancer)


def test_v1_each_client_is_its_own_ip(kafka_1node: KafkaCluster, tmp_path: Path, ports: tuple[int, int]) -> None:
    config = f"""
proxy:
  max_connections_per_ip: 1
  proxy_protocol:
    mode: v1
    trusted_networks: [{BALANCER_SOURCE}/32]
"""
    proxy, balancer = start_behind_haproxy(kafka_1node, tmp_path, ports, config,
                                           f"send-proxy source {BALANCER_SOURCE}")
    try:
        first_a = RawClient(CLIENT_A, BALANCER, ports[0])
        first_b = RawClient(CLIENT_B, BALANCER, ports[0])
        assert first_a.answered()
        assert first_b.answered()
        second_a = RawClient(CLIENT_A, BALANCER, ports[0])
        assert not second_a.answered()
        for client in (first_a, first_b, second_a):
            client.close()
        assert re.search(rf"from {re.escape(CLIENT_A)}:\d+ via bootstrap closed: too many connections from one IP "
                         rf"\({re.escape(CLIENT_A)}, max_connections_per_ip=1\)", proxy.log_path.read_text())
    finally:
        stop(proxy, balancer)


def test_tls_with_sni_behind_haproxy_with_v2(kafka_1node: KafkaCluster, tmp_path: Path, topic_name: str) -> None:
    """HAProxy passes TLS through (TCP mode) after its v2 header; kqp terminates TLS and routes
    by SNI; librdkafka produces and consumes through the one port."""
    kafka_1node.create_topic(topic_name, partitions=1)
    names = [f"bootstrap.{DOMAIN}", *(f"broker-{node}.{DOMAIN}" for node in kafka_1node.nodes)]
    ca = CertificateAuthority.create(tmp_path / "ca")
    certificate = ca.issue("kqp-sni", "/CN=kqp", san=",".join(f"DNS:{name}" for name in names))
    port = free_port_block(1, hosts=["127.0.0.1", INSTANCE]) + 1
    config = tmp_path / "kqp.yaml"
    config.write_text(f"""
proxy:
  tls:
    cert_file: {certificate.cert}
    key_file: {certificate.key}
  sni_routing:
    bootstrap_host: bootstrap.{DOMAIN}
    broker_host_pattern: broker-$(nodeId).{DOMAIN}
  proxy_protocol:
    mode: v2
    trusted_networks: [{BALANCER_SOURCE}/32]
capture:
  enabled: true
  directory: {tmp_path / "capture"}
""")
    proxy = TlsProxyProcess(kafka_1node.bootstrap, tmp_path / "kqp.log", config, per_broker_ports=False,
                            bind_host=INSTANCE, ports=(port, port + 1)).start()
    # The names resolve to loopback, where HAProxy listens on the port kqp advertises.
    (tmp_path / "haproxy").mkdir()
    balancer = LoadBalancer("127.0.0.1", [port], [INSTANCE], tmp_path / "haproxy",
                            server_options=f"send-proxy-v2 source {BALANCER_SOURCE}")
    try:
        balancer.start()
        tls = {"security.protocol": "SSL", "ssl.ca.location": str(ca.cert)}
        bootstrap = f"bootstrap.{DOMAIN}:{port}"
        producer = Producer({"bootstrap.servers": bootstrap, **tls})
        for i in range(20):
            producer.produce(topic_name, f"record-{i}".encode())
        assert producer.flush(60) == 0
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic_name}-group",
                             "auto.offset.reset": "earliest", **tls})
        consumer.subscribe([topic_name])
        values: list[str] = []
        deadline = time.monotonic() + 60
        while len(values) < 20 and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                values.append((message.value() or b"").decode())
        consumer.close()
        assert values == [f"record-{i}" for i in range(20)]

        # A raw TLS client from 127.0.0.2 with a name kqp does not route: refused in the
        # handshake, and the log names 127.0.0.2, not the balancer.
        context = ssl.create_default_context(cafile=str(ca.cert))
        context.check_hostname = False
        raw = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(CLIENT_A, 0))
        with pytest.raises((ssl.SSLError, OSError)):
            context.wrap_socket(raw, server_hostname=f"kafka.{DOMAIN}").close()
        raw.close()
        wait_until(lambda: f"refused: TLS server name 'kafka.{DOMAIN}'" in proxy.log_path.read_text(), 10,
                   "the refused name was not logged")
        assert re.search(rf"connection from {re.escape(CLIENT_A)}:\d+ refused: TLS server name 'kafka.{DOMAIN}'",
                         proxy.log_path.read_text())
    finally:
        balancer.stop()
        code = proxy.stop()
    assert code == 0, proxy.log_tail()
    # librdkafka connected from 127.0.0.1; the balancer's 127.0.0.20 is nowhere in the capture.
    ips = {a.rsplit(":", 1)[0] for a in read_capture(tmp_path / "capture").column("client_address").to_pylist()}
    assert ips == {"127.0.0.1"}, ips
