"""Acceptance (issue 11): who may describe/alter the proxy's quotas is what the brokers' ACLs say.

A broker with StandardAuthorizer (super user admin) sits behind the proxy's SASL listener.
kafka-configs through the proxy as alice is refused with the broker's own error and the
quota file is untouched; as admin it works and applies live; after kafka-acls grants alice
AlterConfigs and DescribeConfigs on the cluster, her alteration works too. A quota request
sent before SASL authentication gets the connection closed, as the broker does it.
"""

from __future__ import annotations

import re
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer

from harness.local_kafka import USERS, KafkaCluster
from kqp.protocol.apis import API_SPECS
from kqp.protocol.codec import decode_body, encode_body
from kqp.protocol.headers import encode_request_header, response_body_offset
from tests.integration.helpers.quota_proxy import ConfiguredProxy

pytestmark = pytest.mark.integration

ALTER_CLIENT_QUOTAS_KEY = 49
SASL_HANDSHAKE_KEY = 17
ILLEGAL_SASL_STATE = 34
# ConfigCommand prints the exception of Kafka's error 31 by its class name and message.
REFUSAL = "ClusterAuthorizationException"


@pytest.fixture(scope="module")
def kafka_acl() -> Iterator[KafkaCluster]:
    # Inter-broker and controller traffic uses the PLAINTEXT listener (principal ANONYMOUS),
    # so ANONYMOUS must be a super user too or the node cannot talk to itself; the proxy is
    # put in front of the SASL listener only, where principals are real.
    cluster = KafkaCluster(nodes=1, extra_config={
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin;User:ANONYMOUS",
    })
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def proxy_and_file(kafka_acl: KafkaCluster, tmp_path: Path) -> Iterator[tuple[ConfiguredProxy, Path]]:
    config = tmp_path / "quotas.yaml"
    config.write_text("quotas:\n  entries:\n    - entity: {user: alice}\n      producer_byte_rate: 1000\n")
    proxy = ConfiguredProxy(kafka_acl.sasl_bootstrap, tmp_path / "proxy.log", config)
    proxy.start()
    try:
        yield proxy, config
    finally:
        assert proxy.stop() == 0, proxy.log_tail()


def client_properties(tmp_path: Path, user: str) -> Path:
    path = tmp_path / f"{user}.properties"
    path.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{user}" password="{USERS[user]}";\n'
    )
    return path


def configs(cluster: KafkaCluster, bootstrap: str, properties: Path, *args: str) -> tuple[int, str]:
    result = cluster.run_tool("kafka.admin.ConfigCommand", "--bootstrap-server", bootstrap,
                              "--command-config", str(properties), *args, check=False)
    return result.returncode, result.stdout + result.stderr


ALTER_ALICE = ("--alter", "--add-config", "producer_byte_rate=99999999", "--entity-type", "users",
               "--entity-name", "alice")
DESCRIBE_ALICE = ("--describe", "--entity-type", "users", "--entity-name", "alice")


def test_quota_admin_follows_the_brokers_acls(
    kafka_acl: KafkaCluster, proxy_and_file: tuple[ConfiguredProxy, Path], tmp_path: Path, topic_name: str
) -> None:
    proxy, config = proxy_and_file
    alice, admin = client_properties(tmp_path, "alice"), client_properties(tmp_path, "admin")
    before = config.read_text()

    # The broker's own answer to alice, for comparison.
    direct_code, direct = configs(kafka_acl, kafka_acl.sasl_bootstrap, alice, *ALTER_ALICE)
    assert direct_code != 0 and REFUSAL in direct, direct

    # ConfigCommand describes the entity's quotas before altering them, so with no ACL at
    # all alice is stopped at the DescribeClientQuotas, as she is straight to the broker.
    code, out = configs(kafka_acl, proxy.bootstrap, alice, *ALTER_ALICE)
    print("alice --alter through the proxy:", out.strip().splitlines()[-1:])
    assert code != 0 and REFUSAL in out, out
    assert config.read_text() == before
    # Her traffic still follows the old quota, 1000 B/s: ~15.5 KB produced at once over
    # Kafka's 10-11 s rate window is ~1.5 kB/s, a throttle of (1.5 - 1) / 1 x ~10 s = ~5 s.
    # At the 99999999 she asked for there would be none.
    throttle_ms = produce_throttle_ms(kafka_acl, admin, proxy.bootstrap, topic_name, "alice")
    assert 3000 <= throttle_ms <= 8000, throttle_ms
    code, out = configs(kafka_acl, proxy.bootstrap, alice, *DESCRIBE_ALICE)
    assert code != 0 and REFUSAL in out, out
    assert refusals(proxy, "DescribeClientQuotas") == 2
    assert config.read_text() == before

    # admin (a super user) may: the change is written and is what the proxy now describes.
    code, out = configs(kafka_acl, proxy.bootstrap, admin, "--alter", "--add-config", "producer_byte_rate=2000",
                        "--entity-type", "users", "--entity-name", "alice")
    assert code == 0, out
    assert _alice_rate(config) == 2000
    code, out = configs(kafka_acl, proxy.bootstrap, admin, *DESCRIBE_ALICE)
    assert code == 0 and "producer_byte_rate=2000.0" in out, out
    # The brokers were only asked: their own quotas are unchanged.
    code, out = configs(kafka_acl, kafka_acl.sasl_bootstrap, admin, *DESCRIBE_ALICE)
    assert code == 0 and "producer_byte_rate" not in out, out

    # DescribeConfigs on the cluster: alice may describe, her AlterClientQuotas is refused by
    # the broker's authorizer (same error as straight to the broker), nothing is written.
    # (Describe too: ConfigCommand's --describe of a user also lists its SCRAM credentials,
    # which Kafka guards with DESCRIBE on the cluster; that request is forwarded as it is.)
    acl(kafka_acl, admin, "DescribeConfigs", "Describe")
    code, out = configs(kafka_acl, proxy.bootstrap, alice, *DESCRIBE_ALICE)
    assert code == 0 and "producer_byte_rate=2000.0" in out, out
    direct_code, direct = configs(kafka_acl, kafka_acl.sasl_bootstrap, alice, *ALTER_ALICE)
    assert direct_code != 0 and REFUSAL in direct, direct
    before = config.read_text()
    code, out = configs(kafka_acl, proxy.bootstrap, alice, *ALTER_ALICE)
    assert code != 0 and REFUSAL in out, out
    assert config.read_text() == before
    assert refusals(proxy, "AlterClientQuotas") == 1

    # AlterConfigs on the cluster too: her alteration goes through and applies.
    acl(kafka_acl, admin, "AlterConfigs")
    code, out = configs(kafka_acl, proxy.bootstrap, alice, "--alter", "--add-config", "producer_byte_rate=3000",
                        "--entity-type", "users", "--entity-name", "alice")
    assert code == 0, out
    assert _alice_rate(config) == 3000
    code, out = configs(kafka_acl, proxy.bootstrap, alice, *DESCRIBE_ALICE)
    assert code == 0 and "producer_byte_rate=3000.0" in out, out
    assert refusals(proxy, "AlterClientQuotas") == 1


def produce_throttle_ms(cluster: KafkaCluster, admin: Path, bootstrap: str, topic: str, user: str) -> float:
    """The longest throttle `user` is told of after producing 15 records of 1 KB at once."""
    cluster.run_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", cluster.sasl_bootstrap,
                     "--command-config", str(admin), "--create", "--topic", topic, "--partitions", "1")
    cluster.run_tool("org.apache.kafka.tools.AclCommand", "--bootstrap-server", cluster.sasl_bootstrap,
                     "--command-config", str(admin), "--add", "--allow-principal", f"User:{user}",
                     "--operation", "Write", "--operation", "Describe", "--topic", topic)
    throttles: list[float] = []
    producer = Producer({"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": USERS[user],
                         "linger.ms": 50, "throttle_cb": lambda event: throttles.append(event.throttle_time * 1000)})
    for _ in range(15):
        producer.produce(topic, b"x" * 1000)
    assert producer.flush(60) == 0
    deadline = time.monotonic() + 10
    while not throttles and time.monotonic() < deadline:
        producer.poll(0.2)  # throttle events are delivered from poll
    return max(throttles, default=0.0)


def acl(cluster: KafkaCluster, admin: Path, *operations: str) -> None:
    cluster.run_tool("org.apache.kafka.tools.AclCommand", "--bootstrap-server", cluster.sasl_bootstrap,
                     "--command-config", str(admin), "--add", "--allow-principal", "User:alice",
                     *(arg for operation in operations for arg in ("--operation", operation)), "--cluster")


def refusals(proxy: ConfiguredProxy, api: str) -> float:
    pattern = rf'^kqp_quota_admin_refused_total\{{api="{api}",reason="broker authorizer"\}} (\S+)$'
    match = re.search(pattern, proxy.metrics_text(), flags=re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _alice_rate(config: Path) -> float:
    entries = yaml.safe_load(config.read_text())["quotas"]["entries"]
    return float(next(e for e in entries if e["entity"] == {"user": "alice"})["producer_byte_rate"])


def _send(sock: socket.socket, frame: bytes) -> None:
    sock.sendall(struct.pack(">i", len(frame)) + frame)


def _alter_frame(correlation_id: int) -> bytes:
    request_class = API_SPECS[ALTER_CLIENT_QUOTAS_KEY].request_class[1]
    entry = request_class.EntryData
    request = request_class(entries=[entry(entity=[entry.EntityData(entity_type="user", entity_name="alice")],
                                           ops=[entry.OpData(key="producer_byte_rate", value=99999999.0,
                                                             remove=False)])],
                            validate_only=False)
    return encode_request_header(ALTER_CLIENT_QUOTAS_KEY, 1, correlation_id, "raw") + encode_body(request, 1)


def _answers_until_closed(sock: socket.socket) -> list[bytes]:
    """The response frames the peer sends before it closes the connection."""
    sock.settimeout(30)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    frames = []
    while len(data) >= 4 and len(data) >= 4 + struct.unpack(">i", data[:4])[0]:
        size = struct.unpack(">i", data[:4])[0]
        frames.append(data[4:4 + size])
        data = data[4 + size:]
    return frames


@pytest.mark.parametrize("handshake_first", [False, True])
def test_quota_request_before_sasl_authentication_is_refused(
    kafka_acl: KafkaCluster, proxy_and_file: tuple[ConfiguredProxy, Path], handshake_first: bool
) -> None:
    """Kafka's SaslServerAuthenticator refuses any other request before authentication.

    Before a SaslHandshake it closes the connection ("Unexpected Kafka request of type
    ALTER_CLIENT_QUOTAS during SASL handshake"); after one, it answers with the request's
    error response, ILLEGAL_SASL_STATE (34), and closes. The proxy passes on exactly that.
    """
    proxy, config = proxy_and_file
    before = config.read_text()
    with socket.create_connection(("127.0.0.1", proxy.bootstrap_port), timeout=30) as sock:
        if handshake_first:
            # SaslHandshake v1 for PLAIN, answered; then AlterClientQuotas instead of SaslAuthenticate.
            body = struct.pack(">h", 5) + b"PLAIN"
            _send(sock, encode_request_header(SASL_HANDSHAKE_KEY, 1, 1, "raw") + body)
            size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
            sock.recv(size, socket.MSG_WAITALL)
        _send(sock, _alter_frame(2))
        answers = _answers_until_closed(sock)
    if handshake_first:
        assert len(answers) == 1
        offset = response_body_offset(answers[0], ALTER_CLIENT_QUOTAS_KEY, 1)
        response = decode_body(ALTER_CLIENT_QUOTAS_KEY, 1, answers[0][offset:], is_request=False)
        assert [e.error_code for e in response.entries] == [ILLEGAL_SASL_STATE]
        assert 'reason="before authentication"} 1.0' in proxy.metrics_text()
    else:
        assert answers == []
    assert config.read_text() == before
