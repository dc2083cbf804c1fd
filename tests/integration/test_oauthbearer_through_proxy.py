"""Acceptance (issue 24, 1): OAUTHBEARER logins get their own user quotas through the proxy.

The broker's SASL_PLAINTEXT listener validates with Kafka's own unsecured-JWT validator
(harness/local_kafka.py); the clients log in with Kafka's unsecured JWT login module (Java)
and librdkafka's builtin unsecured JWT (`sasl.oauthbearer.method=default`). alice has a
`{user: alice}` producer_byte_rate, bob has none. The proxy must name each connection by the
token's `sub`, throttle alice to her quota and leave bob alone, and keep no token anywhere.

The quota windows are 5 x 1 s (Kafka's quota.window.num, which the proxy mirrors) instead of
11 x 1 s: librdkafka ignores ThrottleTimeMs and is held by the mute alone, in bursts of about
a window's worth per window; shorter windows give whole cycles enough in 30 s of measurement.

What the librdkafka half asserts is what the phase of alice's large requests and the host's
load cannot move (issue 39): that her responses carry a throttle and bob's none, that her
connection is muted for each throttle, that no record is lost, and a ceiling on her rate that
no phase reaches. Her rate against the quota (the suite held it to
20%) moved to the system test (`make system-test`, shape `oauthbearer`), beside Kafka's broker:
her 1 MB requests are 4 s of her quota each and are acknowledged every 3 or 4 s as the quota
windows expire in whole seconds, so 25 s of whole cycles read 0.99x, 1.13x or 1.22x by the
phase alone (1.22x failed a fresh clone's `make test` at 67dcf8d).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import KafkaError, Producer

from harness import perf_tools
from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess
from tests.integration.helpers.kafka_throttles import throttles_differing_from_kafkas
from tests.integration.helpers.quota_proxy import _WINDOW, RECORD_SIZE, TOLERANCE, steady_rate, throttle_avg

pytestmark = pytest.mark.integration

QUOTA = 256 * 1024  # alice's producer_byte_rate, bytes/s
WINDOW_NUM = 5
MEASURED_S = 20  # Java: ProducerPerformance's 5 s reports after its 10 s warm-up
LIBRDKAFKA_S = 40  # librdkafka: several throttle cycles within this run ...
WARMUP_S = 10.0  # ... after the burst a fresh client may send
# What alice's muted librdkafka producer may be acknowledged at most, x her quota (see the test).
HELD_CEILING = 2.0
BOB_RATE = 4 * QUOTA  # what bob offers: well above alice's quota, little CPU on a shared machine

# Every part of a JWT (compact JWS) is base64url of JSON, so it starts with "eyJ" ('{"').
_JWT_MARKS = ("eyJ", "Bearer")


def _java_login(user: str) -> str:
    return ("org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
            f'unsecuredLoginStringClaim_sub="{user}";')


def _librdkafka_login(user: str) -> dict[str, str | bool]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.method": "default", "enable.sasl.oauthbearer.unsecure.jwt": True,
            "sasl.oauthbearer.config": f"principal={user}"}


@pytest.fixture
def oauth_proxy(kafka_1node: KafkaCluster, tmp_path: Path) -> Iterator[tuple[ProxyProcess, Path]]:
    capture = tmp_path / "capture"
    config = tmp_path / "kqp.yaml"
    config.write_text(
        "proxy:\n"
        "  sasl:\n"
        "    mechanisms: [PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER]\n"
        f"capture:\n  enabled: true\n  directory: {capture}\n"
        f"quotas:\n  window_num: {WINDOW_NUM}\n  entries:\n"
        f"    - entity: {{user: alice}}\n      producer_byte_rate: {QUOTA}\n"
    )
    proxy = ProxyProcess(kafka_1node.sasl_bootstrap, tmp_path / "proxy.log", config=config)
    proxy.start()
    try:
        yield proxy, capture
    finally:
        code = proxy.stop()
        assert code == 0, f"proxy exit code {code}:\n{proxy.log_tail()}"


def _java_producer(cluster: KafkaCluster, proxy: ProxyProcess, tmp_path: Path, topic: str, user: str,
                   records: int, throughput: int = -1) -> subprocess.Popen[str]:
    login = tmp_path / f"{user}.properties"
    login.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n"
                     f"sasl.jaas.config={_java_login(user)}\n")
    props = {"client.id": f"java-{user}", "acks": "1", "linger.ms": "5", "batch.size": "65536"}
    command = [*perf_tools.producer_perf_command(cluster, proxy.bootstrap, topic, records, RECORD_SIZE, props=props,
                                                 throughput=throughput, config_file=login), "--print-metrics"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finished(producer: subprocess.Popen[str]) -> str:
    stdout, stderr = producer.communicate(timeout=180)
    assert producer.returncode == 0, f"ProducerPerformance failed:\n{stdout[-2000:]}\n{stderr[-2000:]}"
    return stdout


def _per_second(deliveries: list[tuple[float, int]], seconds: int) -> list[int]:
    """Bytes acknowledged in each second of the run (for a failure's message)."""
    totals = [0] * (seconds + 1)
    for at, size in deliveries:
        totals[min(int(at), seconds)] += size
    return totals


def _samples(metrics: str, name: str, *labels: str) -> list[float]:
    """Values of the `name` series whose labels include every one of `labels`."""
    return [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
            if line.startswith(name + "{") and all(label in line for label in labels)]


def test_oauthbearer_users_get_their_own_quotas_and_no_token_is_kept(
    kafka_1node: KafkaCluster, oauth_proxy: tuple[ProxyProcess, Path], tmp_path: Path
) -> None:
    proxy, capture = oauth_proxy
    kafka_1node.create_topic("oauth-java", partitions=1, replication=1)
    kafka_1node.create_topic("oauth-librdkafka", partitions=1, replication=1)

    # Java: alice sends a burst the fresh windows absorb, then MEASURED_S at her quota; bob
    # offers BOB_RATE for as long.
    alice = _java_producer(kafka_1node, proxy, tmp_path, "oauth-java", "alice",
                           QUOTA * (10 + MEASURED_S) // RECORD_SIZE)
    bob = _java_producer(kafka_1node, proxy, tmp_path, "oauth-java", "bob",
                         BOB_RATE * (10 + MEASURED_S) // RECORD_SIZE, throughput=BOB_RATE // RECORD_SIZE)
    alice_out, bob_out = _finished(alice), _finished(bob)
    alice_rate, bob_rate = steady_rate(alice_out), steady_rate(bob_out)
    print(f"Java through the proxy: alice {alice_rate / QUOTA:.3f} x her quota, bob {bob_rate / QUOTA:.3f} x; "
          f"alice's 5 s reports: {[round(float(m[2]) * RECORD_SIZE / QUOTA, 2) for m in _WINDOW.finditer(alice_out)]}")
    # Phase and load cannot move this past its bound. Kafka's Java producer honours ThrottleTimeMs,
    # and after a throttle the proxy reads its connection one request at a time (as a broker's
    # channel), so it is acknowledged one 64 KB batch (a quarter second of the quota) and then
    # waits out the throttle that pays for it: each edge of the 20 s measured cuts at most one
    # batch, 2 x 0.25 s / 20 s = 2.5%, and Kafka's arithmetic holds a client that waits out
    # each throttle at the quota or a little under it (test_quota_enforcement compares the same
    # producer with Kafka's broker). A busy host delays when the JVM sends, never makes it send
    # more; it could only pull the figure under the bound, which no run has shown.
    assert abs(alice_rate - QUOTA) <= TOLERANCE * QUOTA, f"alice's Java producer: {alice_rate:.0f} B/s\n{alice_out}"
    assert throttle_avg(alice_out, "java-alice") > 0
    assert bob_rate >= 0.9 * BOB_RATE, f"bob's Java producer was held to {bob_rate:.0f} B/s"
    assert throttle_avg(bob_out, "java-bob") == 0

    # librdkafka: the same two users, each acknowledgement noted with its time, and every record
    # produced accounted for: acknowledged, or purged from the client's queue at the end.
    deliveries: dict[str, list[tuple[float, int]]] = {"alice": [], "bob": []}
    produced = {"alice": 0, "bob": 0}
    purged = {"alice": 0, "bob": 0}
    failed: dict[str, list[str]] = {"alice": [], "bob": []}
    # A client queue of 4 s of alice's quota, as test_quota_enforcement gives its librdkafka
    # producer (4 MB at 1 MiB/s): the application waits (BufferError) when it is full.
    producers = {user: Producer({"bootstrap.servers": proxy.bootstrap, "client.id": f"rdkafka-{user}",
                                 "linger.ms": 5, "queue.buffering.max.kbytes": 4 * QUOTA // 1024,
                                 **_librdkafka_login(user)})
                 for user in deliveries}
    payload = b"x" * RECORD_SIZE
    start = time.monotonic()

    def on_delivery(user: str) -> Callable[[KafkaError | None, object], None]:
        def delivered(error: KafkaError | None, _message: object) -> None:
            if error is None:
                deliveries[user].append((time.monotonic() - start, RECORD_SIZE))
            elif error.code() in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
                purged[user] += 1
            else:
                failed[user].append(error.name())
        return delivered

    try:
        while (now := time.monotonic()) < start + LIBRDKAFKA_S:
            try:
                producers["alice"].produce("oauth-librdkafka", payload, on_delivery=on_delivery("alice"))
                produced["alice"] += 1
            except BufferError:
                producers["alice"].poll(0.02)
            while produced["bob"] * RECORD_SIZE < (now - start) * BOB_RATE:
                producers["bob"].produce("oauth-librdkafka", payload, on_delivery=on_delivery("bob"))
                produced["bob"] += 1
            for producer in producers.values():
                producer.poll(0)
    finally:
        for producer in producers.values():
            producer.purge()  # what is still queued after the run is not measured
            producer.flush(10)
            producer.close()
    span = LIBRDKAFKA_S - WARMUP_S
    alice_rate = sum(size for at, size in deliveries["alice"] if WARMUP_S <= at < LIBRDKAFKA_S) / span
    bob_rate = sum(size for at, size in deliveries["bob"] if WARMUP_S <= at < LIBRDKAFKA_S) / span
    print(f"librdkafka through the proxy: alice {alice_rate / QUOTA:.3f} x her quota, bob {bob_rate / QUOTA:.3f} x, "
          f"seconds {WARMUP_S:.0f}-{LIBRDKAFKA_S}; produced {produced}, purged at the end {purged}")
    # Nothing lost: every record is acknowledged or was still queued when the run ended.
    for user in deliveries:
        assert not failed[user], f"{user}'s librdkafka producer lost records: {failed[user][:10]}"
        assert len(deliveries[user]) + purged[user] == produced[user], (user, produced, purged)
    # Bob is not held (he offers BOB_RATE in records of 1 KB, little CPU, paced: acknowledged as offered).
    assert bob_rate >= 0.9 * BOB_RATE, f"bob's librdkafka producer was held to {bob_rate:.0f} B/s"
    # Alice is held, whatever the phase of her requests. Her 1 MB requests (4 s of her quota) are
    # acknowledged every 3 or 4 s as the quota windows expire in whole seconds: 0.99x to 1.27x
    # (one request every 3 s) by the phase; the plain average over these 30 s adds at most one
    # request cut by each edge, 2 x 4 s / 30 s: 1.27 + 0.27 = 1.54x. A busy host only delays
    # her. Unheld she would be acknowledged her whole 1 MB queue every round trip, far more than
    # bob's 4x. So the ceiling, clear of every phase and far under unheld: HELD_CEILING x.
    ceiling = HELD_CEILING * QUOTA
    assert alice_rate <= ceiling, \
        f"alice's librdkafka producer: {alice_rate / QUOTA:.3f} x her quota, above the held ceiling " \
        f"{ceiling / QUOTA:.3f} x; acknowledged per second: {_per_second(deliveries['alice'], LIBRDKAFKA_S)}"

    # The proxy's quota sensor for user alice is bound to her quota. (Not the throttle counters:
    # the (user, "") series of a user-level sensor are dropped at the first top-N re-rank, 60 s.)
    metrics = proxy.metrics_text()
    limits = _samples(metrics, "kqp_quota_limit", 'quota_type="producer_byte_rate"', 'user="alice"')
    assert limits == [QUOTA], metrics[-3000:]
    assert _samples(metrics, "kqp_quota_usage", 'quota_type="producer_byte_rate"', 'user="alice"')[0] > 0
    assert 'kqp_unreadable_logins_total{' not in metrics, "a JWT login was counted as unreadable"

    # No token in the log, the metrics or the capture (the capture is complete once the proxy stopped).
    assert proxy.stop() == 0
    log = proxy.log_path.read_text(errors="replace")
    for mark in _JWT_MARKS:
        assert mark not in log and mark not in metrics, f"{mark!r} found in the proxy's log or metrics"
    files = sorted(capture.rglob("*.parquet"))
    assert files, "the capture wrote nothing"
    values = [str(value) for path in files for row in pq.read_table(path).to_pylist() for value in row.values()]
    assert not [v for v in values if any(mark in v for mark in _JWT_MARKS)], "a token reached the capture"
    rows = [row for path in files for row in pq.read_table(path).to_pylist()]
    principals = {row["principal"] for row in rows}
    assert {"alice", "bob"} <= principals, principals
    assert_muted_for_each_throttle(rows)
    assert_kafka_throttles(rows)


PRODUCE = 0


def assert_muted_for_each_throttle(rows: list[dict[str, Any]]) -> None:
    """The quota engages for alice and not for bob, and alice's librdkafka connections are
    muted for each throttle the proxy gave her (KIP-219: a client that ignores ThrottleTimeMs
    gets none of its requests handled before the throttle has passed).

    The capture's times are the proxy's own: the mute starts when the throttled response is
    written, after it came back from the broker (`ts_response_received_us`), so the next
    request the connection forwards to the broker comes at least the throttle after that.
    Neither the phase of the requests nor a busy host can move that: a late loop only makes
    the gap longer. (A response to a request that was already with the broker when the
    throttle was given may still come during the mute: the proxy forwards pipelined requests
    until a throttle starts its one-at-a-time span, kqp.protocol.gate.)"""
    produce = [row for row in rows if row["api_key"] == PRODUCE]
    by_client: dict[str, list[dict[str, Any]]] = {}
    for row in produce:
        by_client.setdefault(str(row["client_id"]), []).append(row)
    for client_id in ("java-bob", "rdkafka-bob"):
        assert by_client.get(client_id), f"no Produce of {client_id} captured"
        assert all(row["proxy_throttle_ms"] == 0 and row["broker_throttle_ms"] == 0 for row in by_client[client_id])
    for client_id in ("java-alice", "rdkafka-alice"):
        throttled = [row for row in by_client.get(client_id, []) if int(row["proxy_throttle_ms"] or 0) > 0]
        assert throttled, f"{client_id} got no throttled response"
        assert all(row["broker_throttle_ms"] == 0 and row["error_code"] == 0 for row in by_client[client_id])
    connections: dict[int, list[dict[str, Any]]] = {}
    for row in by_client["rdkafka-alice"]:
        connections.setdefault(row["connection_id"], []).append(row)
    checked = 0
    for on_connection in connections.values():
        for row in on_connection:
            throttle_ms = int(row["proxy_throttle_ms"] or 0)
            if throttle_ms <= 0 or row["ts_response_received_us"] is None:
                continue
            muted_from = int(row["ts_response_received_us"])
            muted_until = muted_from + 1000 * throttle_ms
            forwarded = [int(r["ts_request_sent_us"]) for r in on_connection
                         if r["ts_request_sent_us"] is not None and muted_from < int(r["ts_request_sent_us"])
                         < muted_until]
            assert not forwarded, \
                f"alice's connection was served during her {throttle_ms} ms throttle from {muted_from} us: " \
                f"requests forwarded at {forwarded}"
            checked += 1
    assert checked >= 3, f"only {checked} throttled responses of alice's librdkafka producer were captured"


def assert_kafka_throttles(rows: list[dict[str, Any]]) -> None:
    """Each of alice's Produce responses carried the ThrottleTimeMs Kafka's arithmetic gives for
    that request: her charges replayed through the reference written from Kafka's source apart
    from kqp.quotas, with her `{user: alice}` quota and WINDOW_NUM windows of 1 s
    (tests/integration/helpers/kafka_throttles.py). Neither phase nor load moves this."""
    compared, differences = throttles_differing_from_kafkas(
        rows, {("alice", None): QUOTA}, window_num=WINDOW_NUM, charged=lambda row: row["principal"] == "alice")
    assert compared, "no Produce of alice's was captured"
    print(f"alice's {compared} Produce responses against Kafka's arithmetic: {len(differences)} differ")
    assert not differences, f"throttles (client, correlation id, kqp ms, Kafka's ms) that differ: {differences[:20]}"
