"""Acceptance (issue 11): librdkafka's admin client is held to controller_mutation_rate.

librdkafka ignores ThrottleTimeMs, so only the proxy's mute holds it, whether the throttle
rides on a broker's response or on the proxy's own THROTTLING_QUOTA_EXCEEDED answer.

The figure: `controller_mutation_rate: 5` with the default 11 one-second windows is a token
bucket of 5 x 11 = 55 partitions that refills at 5 partitions/s. A client creating
1-partition topics as fast as it can spends the full bucket at once, then gets 5 per second:
over D seconds about 55 + 5 x D partitions (the last request admitted may overdraw the
bucket by its own partition, hence "about"). 60 s, as issue 11 asks: the refill (300)
dominates the burst (55).
"""

from __future__ import annotations

import concurrent.futures
import socket
import struct
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from harness.local_kafka import KafkaCluster
from kqp.protocol.apis import API_SPECS, CREATE_TOPICS_KEY, METADATA_KEY
from kqp.protocol.codec import decode_body, encode_body
from kqp.protocol.headers import encode_request_header, response_body_offset, response_correlation_id
from tests.integration.helpers.quota_proxy import ConfiguredProxy

pytestmark = pytest.mark.integration

RATE = 5.0
BURST = RATE * 11
DURATION_S = 60.0
THROTTLING_QUOTA_EXCEEDED = 89


@pytest.mark.parametrize("in_flight", [1, 20], ids=["one-at-a-time", "pipelined"])
def test_librdkafka_admin_creates_partitions_at_the_mutation_rate(
    kafka_1node: KafkaCluster, mutation_proxy: tuple[ConfiguredProxy, Path], in_flight: int
) -> None:
    proxy, _config = mutation_proxy
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap, "client.id": "creator"})
    prefix = f"rate-{uuid.uuid4().hex[:6]}-"
    pending: set[concurrent.futures.Future[None]] = set()
    created = refused = 0
    serial = 0
    start = time.monotonic()
    deadline = start + DURATION_S
    while (now := time.monotonic()) < deadline:
        while len(pending) < in_flight:
            futures = admin.create_topics([NewTopic(f"{prefix}{serial}", 1, 1)], request_timeout=120,
                                          operation_timeout=60)
            serial += 1
            pending |= set(futures.values())
        done, pending = concurrent.futures.wait(pending, timeout=deadline - now,
                                                return_when=concurrent.futures.FIRST_COMPLETED)
        for future in done:
            if future.exception() is None:
                created += 1
            else:
                refused += 1
    elapsed = time.monotonic() - start
    expected = RATE * elapsed + BURST
    print(f"{in_flight} in flight: {created} partitions created in {elapsed:.1f} s "
          f"({refused} refused), expected {expected:.0f} = 5 x {elapsed:.1f} + 55: {created / expected:.3f}x")
    versions = [line for line in proxy.metrics_text().splitlines()
                if line.startswith("kqp_requests_total") and 'api="CreateTopics"' in line]
    print("CreateTopics versions librdkafka sent:", versions)
    # Phase cannot move this past its bound (issue 39's audit): each request is one partition,
    # a fifth of a second of the rate, against 5 x DURATION_S + 55 expected; the controller
    # creates a partition in milliseconds, far under the 200 ms the rate allows each one.
    assert abs(created - expected) <= 0.10 * expected


def test_a_pipelined_request_behind_a_local_throttled_answer_waits_for_the_mute(
    kafka_1node: KafkaCluster, mutation_proxy: tuple[ConfiguredProxy, Path]
) -> None:
    """Strict CreateTopics (v6+) over the quota is answered by the proxy; what follows waits.

    A raw client (ignoring ThrottleTimeMs, as librdkafka does) sends a 60-partition topic on a
    full 55-token bucket (admitted, 5 in debt), then pipelines a 1-partition topic (rejected
    by the proxy itself: THROTTLING_QUOTA_EXCEEDED, throttle about 5 / 5 s = 1 s) and a
    Metadata request. The Metadata answer must come at least the throttle after the rejection.
    """
    proxy, _config = mutation_proxy
    prefix = f"strict-{uuid.uuid4().hex[:6]}-"
    with socket.create_connection(("127.0.0.1", proxy.bootstrap_port), timeout=60) as sock:
        sock.sendall(_create_topics_frame(1, f"{prefix}big", 60))
        first = _receive(sock)
        sock.sendall(_create_topics_frame(2, f"{prefix}small", 1) + _metadata_frame(3))
        rejected = _receive(sock)
        rejected_at = time.monotonic()
        metadata = _receive(sock)
        waited = time.monotonic() - rejected_at
    assert [t.error_code for t in _create_topics_response(first).topics] == [0]
    response = _create_topics_response(rejected)
    assert [t.error_code for t in response.topics] == [THROTTLING_QUOTA_EXCEEDED]
    print(f"rejected with throttle {response.throttle_time_ms} ms; the pipelined Metadata waited {waited:.3f} s")
    assert 500 <= response.throttle_time_ms <= 1000  # 1 s less what refilled while the first was created
    assert response_correlation_id(metadata) == 3
    assert waited >= response.throttle_time_ms / 1000.0 - 0.02


def _create_topics_frame(correlation_id: int, name: str, partitions: int, version: int = 7) -> bytes:
    request_class = API_SPECS[CREATE_TOPICS_KEY].request_class[version]
    topic = request_class.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1,
                                         assignments=[], configs=[])
    request = request_class(topics=[topic], timeout_ms=30000, validate_only=False)
    frame = encode_request_header(CREATE_TOPICS_KEY, version, correlation_id, "creator") + encode_body(
        request, version)
    return struct.pack(">i", len(frame)) + frame


def _metadata_frame(correlation_id: int) -> bytes:
    # Metadata v12: no topics (compact array 0 -> 1), no auto-creation, no authorized ops, no tags.
    frame = encode_request_header(METADATA_KEY, 12, correlation_id, "creator") + b"\x01\x00\x00\x00"
    return struct.pack(">i", len(frame)) + frame


def _receive(sock: socket.socket) -> bytes:
    size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    return sock.recv(size, socket.MSG_WAITALL)


def _create_topics_response(frame: bytes) -> Any:
    offset = response_body_offset(frame, CREATE_TOPICS_KEY, 7)
    return decode_body(CREATE_TOPICS_KEY, 7, frame[offset:], is_request=False)
