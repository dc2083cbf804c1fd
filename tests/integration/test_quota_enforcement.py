"""Acceptance (issue 4): clients behind the proxy are throttled as a broker with those quotas would.

Quotas use Kafka's default windows (11 x 1 s), so a fresh client may first send about ten
seconds' worth of its quota before the average over the window exceeds it; rates are
therefore measured on the steady state, the reporting intervals after the first WARMUP_S.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer

from harness import perf_tools
from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess
from tests.integration.helpers.quota_proxy import (
    _WINDOW,
    QUOTA,
    RECORD_SIZE,
    TOLERANCE,
    WARMUP_S,
    ConfiguredProxy,
    producer_quota_entry,
    quota_file,
    steady_rate,
    throttle_avg,
)

pytestmark = pytest.mark.integration










@pytest.fixture
def configured_proxy(kafka_1node: KafkaCluster, tmp_path: Path) -> Iterator[tuple[ConfiguredProxy, Path]]:
    config = quota_file(tmp_path / "quotas.yaml", producer_quota_entry("limited", QUOTA))
    proxy = ConfiguredProxy(kafka_1node.bootstrap, tmp_path / "proxy.log", config)
    proxy.start()
    try:
        yield proxy, config
    finally:
        code = proxy.stop()
        assert code == 0, f"proxy exit code {code}:\n{proxy.log_tail()}"




def run_producer(cluster: KafkaCluster, bootstrap: str, topic: str, client_id: str, seconds: float) -> str:
    # Enough records for a 10-window burst plus `seconds` at the quota.
    records = int((QUOTA * 10 + QUOTA * seconds) / RECORD_SIZE)
    props = {"client.id": client_id, "acks": "1", "linger.ms": "5", "batch.size": "65536"}
    command = [*perf_tools.producer_perf_command(cluster, bootstrap, topic, records, RECORD_SIZE, props=props),
               "--print-metrics"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f"ProducerPerformance failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    return result.stdout




def test_producer_byte_rate_matches_broker_enforced_quota(
    kafka_1node: KafkaCluster, configured_proxy: tuple[ConfiguredProxy, Path]
) -> None:
    proxy, _config = configured_proxy
    kafka_1node.create_topic("quota-produce", partitions=1, replication=1)

    through_proxy = run_producer(kafka_1node, proxy.bootstrap, "quota-produce", "limited", 20)
    proxy_rate = steady_rate(through_proxy)
    metrics = proxy.metrics_text()

    # The same quota enforced by the broker itself, through kafka-configs.
    kafka_1node.run_tool(
        "kafka.admin.ConfigCommand", "--bootstrap-server", kafka_1node.bootstrap, "--alter",
        "--add-config", f"producer_byte_rate={QUOTA}", "--entity-type", "clients", "--entity-name", "broker-limited",
    )
    try:
        direct = run_producer(kafka_1node, kafka_1node.bootstrap, "quota-produce", "broker-limited", 20)
    finally:
        kafka_1node.run_tool(
            "kafka.admin.ConfigCommand", "--bootstrap-server", kafka_1node.bootstrap, "--alter",
            "--delete-config", "producer_byte_rate", "--entity-type", "clients", "--entity-name", "broker-limited",
        )
    broker_rate = steady_rate(direct)
    print(f"steady producer rate: proxy-enforced {proxy_rate / QUOTA:.3f} x quota, "
          f"broker-enforced {broker_rate / QUOTA:.3f} x quota")

    # Phase and load cannot move these past their bound (issue 39's audit): the Java producer
    # honours ThrottleTimeMs and is read one request at a time after a throttle, so each edge of
    # the 20 s of 5 s reports cuts at most one 64 KB batch, 1/16 s of the quota: 2 x 1/16 / 20 =
    # 0.6 %; a busy host delays the JVM's sends, never makes it send more than its throttles let.
    assert abs(proxy_rate - QUOTA) <= TOLERANCE * QUOTA, f"proxy-enforced rate {proxy_rate:.0f} B/s"
    assert abs(proxy_rate - broker_rate) <= TOLERANCE * broker_rate, (proxy_rate, broker_rate)
    assert throttle_avg(through_proxy, "limited") > 0
    # The proxy reports what it did: throttle time and byte rate for that client-id.
    throttle_lines = [line for line in metrics.splitlines()
                      if line.startswith("kqp_throttle_time_seconds_total") and 'client_id="limited"' in line
                      and 'source="proxy"' in line]
    assert throttle_lines and float(throttle_lines[0].rsplit(" ", 1)[1]) > 0, metrics[-3000:]
    usage = [line for line in metrics.splitlines()
             if line.startswith("kqp_quota_usage{") and 'client_id="limited"' in line
             and 'quota_type="producer_byte_rate"' in line]
    assert usage and float(usage[0].rsplit(" ", 1)[1]) > 0, metrics[-3000:]
    assert "kqp_request_proxy_latency_seconds_bucket" in metrics


# Kafka's default quota.window.num: the sensor's span, 11 x 1 s.
WINDOW_NUM = 11
# What the muted librdkafka producer may be acknowledged at most, x the quota (see the test).
HELD_CEILING = 2.0


def test_librdkafka_producer_is_held_to_the_quota_by_muting(
    kafka_1node: KafkaCluster, configured_proxy: tuple[ConfiguredProxy, Path]
) -> None:
    """librdkafka ignores ThrottleTimeMs: only the mute holds it. Asserted here is what the phase
    of its 1 MB requests and the host's load cannot move: the quota engages (it is throttled),
    it is held under a ceiling that no phase of Kafka's arithmetic reaches, and no record
    is lost. How close to the quota it is held, beside Kafka's broker, is the system test's
    (`make system-test`, shape `single`): this test held its rate over whole throttle cycles to
    10% of the quota, and one cycle's rate varies from 0.96 to 1.16x with where the burst falls
    in the whole-second quota windows (measured); cycles of a whole number of seconds keep that
    phase from one cycle to the next, so three or four cycles do not average it out."""
    proxy, _config = configured_proxy
    kafka_1node.create_topic("quota-librdkafka", partitions=1, replication=1)
    seconds = int(WARMUP_S) + 30
    per_second = [0] * (seconds + 1)
    produced = 0
    delivered: list[int] = []
    failed: list[str] = []
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "client.id": "limited", "linger.ms": 5,
                         "queue.buffering.max.kbytes": 4096})
    payload = b"x" * RECORD_SIZE
    start = time.monotonic()

    def on_delivery(error: KafkaError | None, message: object) -> None:
        second = int(time.monotonic() - start)
        if error is not None:
            failed.append(error.name())
            return
        delivered.append(RECORD_SIZE)
        if second <= seconds:
            per_second[second] += RECORD_SIZE

    while time.monotonic() < start + seconds:
        try:
            producer.produce("quota-librdkafka", payload, on_delivery=on_delivery)
            produced += 1
        except BufferError:
            producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(60) == 0
    span = seconds - int(WARMUP_S)
    rate = sum(per_second[int(WARMUP_S):seconds]) / span
    print(f"librdkafka rate through the proxy over seconds {WARMUP_S:.0f}-{seconds}: {rate / QUOTA:.3f} x quota; "
          f"per second: {[round(b / QUOTA, 1) for b in per_second]}")
    # Nothing lost: every record produced was acknowledged (the queue is flushed at the end).
    assert not failed, failed[:10]
    assert len(delivered) == produced, (len(delivered), produced)
    # Throttled, by the proxy (the broker enforces nothing here).
    throttled = [float(line.rsplit(" ", 1)[1]) for line in proxy.metrics_text().splitlines()
                 if line.startswith("kqp_throttle_time_seconds_total") and 'client_id="limited"' in line
                 and 'source="proxy"' in line]
    assert throttled and throttled[0] > 0, throttled
    # Held, whatever the phase. Over whole cycles Kafka's arithmetic and the proxy's give this
    # client 0.96-1.16x by the cycle's phase (above); the plain average over these 30 s adds at
    # most one burst cut by each edge, a burst being at most the sensor's span of the quota
    # (WINDOW_NUM s): 1.16 + 11 / 30 = 1.53x. Unheld, its 4 MB queue would be acknowledged every
    # round trip, tens of MB/s. A busy host only delays it. So the ceiling, halfway to any
    # unheld figure and clear of every phase: HELD_CEILING x the quota.
    ceiling = HELD_CEILING * QUOTA
    assert rate <= ceiling, f"librdkafka achieved {rate / QUOTA:.3f} x the quota, over Kafka's {ceiling / QUOTA:.3f} x"


def test_editing_the_quota_file_changes_the_rate_live_and_a_broken_file_changes_nothing(
    kafka_1node: KafkaCluster, configured_proxy: tuple[ConfiguredProxy, Path]
) -> None:
    proxy, config = configured_proxy
    kafka_1node.create_topic("quota-reload", partitions=1, replication=1)
    records = int(QUOTA * (10 + 20 + 4 * 25) / RECORD_SIZE)
    props = {"client.id": "limited", "acks": "1", "linger.ms": "5", "batch.size": "65536"}
    command = perf_tools.producer_perf_command(kafka_1node, proxy.bootstrap, "quota-reload", records, RECORD_SIZE,
                                               props=props)
    windows: list[tuple[float, float]] = []  # (end of the 5 s report, bytes/s)
    producer = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    start = time.monotonic()
    reader = threading.Thread(target=_read_windows, args=(producer, start, windows), daemon=True)
    reader.start()
    try:
        wait_until(lambda: time.monotonic() - start > 20)
        opened_before_reload = connections_opened(proxy)
        # A broken file: the running quota stays, and the log says why.
        config.write_text("quotas:\n  entries:\n    - entity: {client-id: limited}\n      producer_byte_rate: -1\n")
        wait_for_log(proxy, "rejected")
        wait_until(lambda: time.monotonic() - start > 26)
        # Four times the quota: the same connection runs faster within a quota window.
        quota_file(config, producer_quota_entry("limited", 4 * QUOTA))
        wait_for_log(proxy, "config reloaded")
        changed_at = time.monotonic() - start
        wait_until(lambda: any(end > changed_at + 17 for end, _ in windows), timeout_s=60)
    finally:
        producer.kill()
        producer.wait()
    # Kafka's windowed rate lets a client that honours its throttles alternate between
    # bursts and pauses, so compare averages over several 5 s reports, not single ones.
    before = [rate for end, rate in windows if end - 5 > WARMUP_S - 5 and end <= changed_at]
    after = [rate for end, rate in windows if end - 5 >= changed_at + 6]
    print(f"5 s windows (end s, x quota): {[(round(e), round(r / QUOTA, 2)) for e, r in windows]}; "
          f"reloaded at {changed_at:.1f} s")
    # The same Java producer as above: 64 KB batches (1/16 s of the quota) over at least two 5 s
    # reports, 2 x 1/16 / 10 = 1.3 % by phase; the 4x quota after the reload is far from 2.5x.
    assert len(before) >= 2 and abs(sum(before) / len(before) - QUOTA) <= 0.2 * QUOTA, windows
    assert len(after) >= 2 and sum(after) / len(after) > 2.5 * QUOTA, windows
    log = proxy.log_path.read_text()
    assert "producer_byte_rate" in log and "greater than 0" in log
    # The same connections carried the traffic before and after the reload.
    assert connections_opened(proxy) == opened_before_reload


def _read_windows(producer: subprocess.Popen[str], start: float, windows: list[tuple[float, float]]) -> None:
    assert producer.stdout is not None
    for line in producer.stdout:
        match = _WINDOW.match(line)
        if match and "th," not in line:
            windows.append((time.monotonic() - start, float(match[2]) * RECORD_SIZE))


def wait_until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def connections_opened(proxy: ProxyProcess) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in proxy.metrics_text().splitlines()
               if line.startswith("kqp_connections_opened_total"))


def wait_for_log(proxy: ProxyProcess, text: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in proxy.log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"{text!r} never appeared in the proxy log:\n{proxy.log_tail()}"
        time.sleep(0.1)
