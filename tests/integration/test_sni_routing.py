"""Acceptance (issue 24, SNI routing): one TLS port of a real `kqp serve` in front of a
3-broker Kafka 4.3.1 cluster, the bootstrap and each broker told apart by the TLS server name.

The proxy holds one certificate whose SANs name `bootstrap.kqp.localhost` and
`broker-N.kqp.localhost`; it advertises the brokers as those names on its one port. Kafka's
Java clients and tools, and librdkafka, trust the test CA, connect by those names (so they
send them as SNI and check the certificate against them), and must get everything done
through that one port: the socket watch fails the test if a client holds a connection to any
other port, a broker's above all.

The names resolve to loopback without DNS because glibc's `myhostname` NSS module answers
every name under `.localhost` (RFC 6761) with 127.0.0.1 and ::1, for the JVM and librdkafka
alike (both ask getaddrinfo); `make system-deps` installs it (docs/testing.md).
"""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from harness.certificates import CertificateAuthority
from harness.local_kafka import KafkaCluster, recv_exact
from kqp.protocol.apis import API_VERSIONS_KEY, METADATA_KEY
from kqp.protocol.codec import decode_body
from kqp.protocol.headers import encode_request_header, response_body_offset
from tests.integration.helpers.leader_moves import (
    RATE_PER_S,
    RECORDS,
    Operator,
    assert_moves_survived,
    java_client,
    run_through_leader_moves,
    wait_until,
)
from tests.integration.helpers.proxies import TlsProxyProcess
from tests.integration.helpers.socket_watch import SocketWatch
from tests.integration.helpers.through_proxy import consume_and_commit, run_watched

pytestmark = pytest.mark.integration

DOMAIN = "kqp.localhost"
BOOTSTRAP_NAME = f"bootstrap.{DOMAIN}"
PATTERN = f"broker-$(nodeId).{DOMAIN}"
LIBRDKAFKA_RECORDS = 300


def broker_name(node_id: int) -> str:
    return PATTERN.replace("$(nodeId)", str(node_id))


@pytest.fixture(scope="module")
def names(kafka_3nodes: KafkaCluster) -> list[str]:
    """Every name the test uses, after checking each resolves to loopback here."""
    wanted = [BOOTSTRAP_NAME, *(broker_name(node) for node in sorted(kafka_3nodes.nodes))]
    for name in wanted:
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(name, 9, type=socket.SOCK_STREAM)}
        except socket.gaierror as exc:
            pytest.fail(f"{name} does not resolve ({exc}): this test needs names under .localhost to resolve to "
                        "loopback; `make system-deps` installs libnss-myhostname for that (docs/testing.md)")
        assert addresses <= {"127.0.0.1", "::1"}, f"{name} resolves to {addresses}, not loopback"
    return wanted


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority.create(tmp_path_factory.mktemp("sni-ca"))


@pytest.fixture
def proxy(kafka_3nodes: KafkaCluster, ca: CertificateAuthority, names: list[str],
          tmp_path: Path) -> Iterator[TlsProxyProcess]:
    certificate = ca.issue("proxy-sni", "/CN=kqp/O=kqp", san=",".join(f"DNS:{name}" for name in names))
    config = tmp_path / "sni.yaml"
    config.write_text(f"""
proxy:
  tls:
    cert_file: {certificate.cert}
    key_file: {certificate.key}
  sni_routing:
    bootstrap_host: {BOOTSTRAP_NAME}
    broker_host_pattern: {PATTERN}
""")
    proxy = TlsProxyProcess(kafka_3nodes.bootstrap, tmp_path / "proxy.log", config, per_broker_ports=False)
    proxy.start()
    yield proxy
    code = proxy.stop()
    assert code == 0, f"proxy exit code {code}:\n{proxy.log_tail()}"


def only_the_sni_port(watch: SocketWatch, proxy: TlsProxyProcess, cluster: KafkaCluster) -> None:
    """The watched client reached the proxy's one port and nothing else."""
    assert watch.samples >= 3, "socket watch took too few samples to mean anything"
    assert proxy.bootstrap_port in watch.seen, f"no connection to the proxy seen (saw ports {sorted(watch.seen)})"
    assert not watch.seen & cluster.broker_ports, f"client reached broker ports {sorted(watch.seen)} directly"
    assert watch.seen == {proxy.bootstrap_port}, f"client reached ports {sorted(watch.seen)}, not only the SNI port"


# ---- what the proxy answers, byte for byte ------------------------------------------------


def _tls_round_trip(port: int, ca: Path, server_name: str, request: bytes) -> bytes:
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=server_name) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        size = struct.unpack(">i", recv_exact(sock, 4))[0]
        return recv_exact(sock, size)


def test_answers_carry_only_the_sni_names(proxy: TlsProxyProcess, kafka_3nodes: KafkaCluster,
                                          ca: CertificateAuthority, names: list[str]) -> None:
    port = proxy.bootstrap_port
    # ApiVersions v3 (a compact client software name and version) and Metadata v12 for every
    # topic, asked by each name: the bootstrap and every broker answer through the one port.
    api_versions = encode_request_header(API_VERSIONS_KEY, 3, 1, "sni-test") + b"\x04kqp\x041.0\x00"
    metadata = encode_request_header(METADATA_KEY, 12, 2, "sni-test") + b"\x00\x00\x00\x00"
    for name in names:
        answer = _tls_round_trip(port, ca.cert, name, api_versions)
        body = decode_body(API_VERSIONS_KEY, 3, answer[response_body_offset(answer, API_VERSIONS_KEY, 3):],
                           is_request=False)
        assert body.error_code == 0 and body.api_keys
        answer = _tls_round_trip(port, ca.cert, name, metadata)
        message = decode_body(METADATA_KEY, 12, answer[response_body_offset(answer, METADATA_KEY, 12):],
                              is_request=False)
        assert sorted((b.node_id, b.host, b.port) for b in message.brokers) == [
            (node, broker_name(node), port) for node in sorted(kafka_3nodes.nodes)
        ]
        assert b"127.0.0.1" not in answer

    # No name, or a name that is not ours: refused, and the proxy says which name it was.
    for server_name, logged in ((None, "it sent no TLS server name (SNI)"),
                                (f"kafka.{DOMAIN}", f"TLS server name 'kafka.{DOMAIN}' is neither")):
        context = ssl.create_default_context(cafile=str(ca.cert))
        context.check_hostname = server_name is not None
        with pytest.raises((ssl.SSLError, ConnectionError)), \
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname=server_name) as sock:
            sock.sendall(struct.pack(">i", len(api_versions)) + api_versions)
            recv_exact(sock, 4)
        wait_until(lambda logged=logged: logged in proxy.log_path.read_text(), 10, f"the log line {logged!r}")


# ---- librdkafka ---------------------------------------------------------------------------


def test_librdkafka_admin_produce_and_group_consume_through_one_port(
    proxy: TlsProxyProcess, kafka_3nodes: KafkaCluster, ca: CertificateAuthority, topic_name: str
) -> None:
    port = proxy.bootstrap_port
    tls = {"bootstrap.servers": f"{BOOTSTRAP_NAME}:{port}", "security.protocol": "SSL",
           "ssl.ca.location": str(ca.cert)}
    # This process talks to nothing else meanwhile, so watching the sockets it opens from here
    # on watches librdkafka (a connection an earlier test's client left open is not ours).
    with SocketWatch(only_new=True) as watch:
        admin = AdminClient(tls)
        admin.create_topics([NewTopic(topic_name, 3, replication_factor=3)])[topic_name].result(timeout=60)
        cluster = admin.describe_cluster(request_timeout=30).result()
        assert sorted((n.id, n.host, n.port) for n in cluster.nodes) == [
            (node, broker_name(node), port) for node in sorted(kafka_3nodes.nodes)
        ]

        errors: list[object] = []
        producer = Producer({**tls, "acks": "all"})
        for i in range(LIBRDKAFKA_RECORDS):
            producer.produce(topic_name, str(i).encode(), partition=i % 3,
                             on_delivery=lambda error, _message: errors.append(error) if error else None)
        assert producer.flush(60) == 0
        assert not errors

        # The metadata librdkafka works from names every broker by its SNI name.
        metadata = producer.list_topics(topic_name, timeout=10)
        assert {b.host for b in metadata.brokers.values()} == {broker_name(n) for n in kafka_3nodes.nodes}
        values = consume_and_commit(tls["bootstrap.servers"], topic_name, f"{topic_name}-group",
                                    LIBRDKAFKA_RECORDS, **tls)
        del admin, producer  # librdkafka's admin client has no close(): let both go before the proxy stops
    assert sorted(values, key=int) == [str(i) for i in range(LIBRDKAFKA_RECORDS)]
    only_the_sni_port(watch, proxy, kafka_3nodes)


# ---- Kafka's Java clients and tools, and a leader that moves -------------------------------


def test_java_admin_producer_and_consumer_through_leader_moves(
    proxy: TlsProxyProcess, kafka_3nodes: KafkaCluster, ca: CertificateAuthority, topic_name: str,
    tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    bootstrap = f"{BOOTSTRAP_NAME}:{proxy.bootstrap_port}"
    tls = ("security.protocol=SSL", "ssl.truststore.type=PEM", f"ssl.truststore.location={ca.cert}")
    client_config = tmp_path / "client-ssl.properties"
    client_config.write_text("\n".join(tls) + "\n")
    one, two = sorted(kafka_3nodes.nodes)[:2]

    # Kafka's admin tools through the proxy: create the topic, then ask every broker for its
    # API versions, each by the name the proxy advertised for it.
    created = run_watched(kafka_3nodes.tool_command(
        "org.apache.kafka.tools.TopicCommand", "--bootstrap-server", bootstrap, "--command-config",
        str(client_config), "--create", "--topic", topic_name, "--replica-assignment", f"{one}:{two}"))
    assert created.returncode == 0, created.stderr[-3000:]
    versions = run_watched(kafka_3nodes.tool_command(
        "org.apache.kafka.tools.BrokerApiVersionsCommand", "--bootstrap-server", bootstrap, "--command-config",
        str(client_config)))
    assert versions.returncode == 0, versions.stderr[-3000:]
    answered = sorted(line.split(" ", 1)[0] for line in versions.stdout.splitlines() if "(id: " in line)
    assert answered == [f"{broker_name(node)}:{proxy.bootstrap_port}" for node in sorted(kafka_3nodes.nodes)]
    for run in (created, versions):
        only_the_sni_port(run.watch, proxy, kafka_3nodes)

    operator = Operator(kafka_3nodes, topic_name)
    request.addfinalizer(operator.close)
    wait_until(lambda: operator.leader() == one, 30, "the first replica to lead")
    producer_command = java_client(kafka_3nodes, "produce", bootstrap, topic_name, str(RECORDS), str(RATE_PER_S), *tls)
    consumer_command = java_client(kafka_3nodes, "consume", bootstrap, topic_name, f"{topic_name}-group",
                                   str(RECORDS), "group.protocol=classic", *tls)
    produced, consumed = run_through_leader_moves(proxy, operator, producer_command, consumer_command)
    assert_moves_survived(kafka_3nodes, proxy, operator, produced, consumed)
    for run in (produced, consumed):
        only_the_sni_port(run.watch, proxy, kafka_3nodes)
