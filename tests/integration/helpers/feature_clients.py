"""Kafka's Java feature clients (tests/integration/java/FeatureClients.java), and an ApiVersions probe
that reads what a listener advertises."""

from __future__ import annotations

import socket
import struct

from harness.local_kafka import CLIENT_JVM_OPTIONS, KafkaCluster, recv_exact
from tests.integration.helpers.java_programs import java_program


def feature_clients(cluster: KafkaCluster, *args: str, jvm_options: tuple[str, ...] = ()) -> list[str]:
    """The command that runs FeatureClients in the mode and with the arguments `args`, as the
    suite runs Kafka's own tools (harness.local_kafka.CLIENT_JVM_OPTIONS), with 256 MB of heap."""
    return java_program(cluster.kafka_dir, "FeatureClients", *args,
                        jvm_options=("-Xmx256m", *CLIENT_JVM_OPTIONS, *jvm_options))


def _compact_string(text: str) -> bytes:
    raw = text.encode()
    return bytes([len(raw) + 1]) + raw


def api_versions_request(sock: socket.socket, correlation_id: int, version: int = 3,
                         software: str = "kqp-test") -> tuple[int, dict[int, tuple[int, int]]]:
    """One ApiVersions round trip: (error code, {api key: (min, max)})."""
    header = struct.pack(">hhih", 18, version, correlation_id, 4) + b"test"
    if version >= 3:
        request = header + b"\x00" + _compact_string(software) + _compact_string("1.0") + b"\x00"
    else:
        request = header
    sock.sendall(struct.pack(">i", len(request)) + request)
    size = struct.unpack(">i", recv_exact(sock, 4))[0]
    payload = recv_exact(sock, size)
    assert struct.unpack(">i", payload[:4])[0] == correlation_id
    body = payload[4:]
    error_code = struct.unpack(">h", body[:2])[0]
    apis: dict[int, tuple[int, int]] = {}
    if version >= 3:
        count = body[2] - 1  # compact array; fine below 127 entries
        offset = 3
        for _ in range(max(count, 0)):
            key, low, high = struct.unpack(">hhh", body[offset:offset + 6])
            apis[key] = (low, high)
            offset += 7  # and an empty tagged-field section per entry
    return error_code, apis


def ask_api_versions(port: int, version: int = 3) -> dict[int, tuple[int, int]]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        error_code, apis = api_versions_request(sock, 1, version)
    assert error_code == 0
    return apis
