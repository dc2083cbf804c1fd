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
from confluent_kafka import Producer

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


def cycle_rate(per_second: list[int]) -> float:
    """Bytes/s over whole throttling cycles in the steady state.

    A client that ignores ThrottleTimeMs (librdkafka) is held back by the mute alone: it
    queues up while muted and, once the window has rolled over, sends a burst of about ten
    windows' worth, on a broker as through the proxy. The first cycle starts from a fresh
    sensor (the warm-up); averaging from the second burst to the start of the last one covers
    whole steady cycles, whatever the phase of the run's end. A burst that straddles a second
    boundary fills two seconds; it counts once, from its first second.
    """
    bursting = [size > 3 * QUOTA for size in per_second]
    bursts = [i for i, burst in enumerate(bursting) if burst and (i == 0 or not bursting[i - 1])]
    assert len(bursts) >= 4, f"expected at least four throttling bursts, per-second bytes {per_second}"
    first, last = bursts[1], bursts[-1]
    return sum(per_second[first:last]) / (last - first)


def test_librdkafka_producer_is_held_to_the_quota_by_muting(
    kafka_1node: KafkaCluster, configured_proxy: tuple[ConfiguredProxy, Path]
) -> None:
    proxy, _config = configured_proxy
    kafka_1node.create_topic("quota-librdkafka", partitions=1, replication=1)
    # One cycle's rate varies from 0.96 to 1.16 x with where the burst falls in the window
    # (measured), so the average needs three or four whole cycles to be within 10%.
    seconds = 72
    per_second = [0] * (seconds + 1)
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "client.id": "limited", "linger.ms": 5,
                         "queue.buffering.max.kbytes": 4096})
    payload = b"x" * RECORD_SIZE
    start = time.monotonic()

    def on_delivery(error: object, message: object) -> None:
        second = int(time.monotonic() - start)
        if error is None and second <= seconds:
            per_second[second] += RECORD_SIZE

    while time.monotonic() < start + seconds:
        try:
            producer.produce("quota-librdkafka", payload, on_delivery=on_delivery)
        except BufferError:
            producer.poll(0.05)
        producer.poll(0)
    producer.flush(60)
    rate = cycle_rate(per_second)
    print(f"librdkafka rate through the proxy over whole cycles: {rate / QUOTA:.3f} x quota; "
          f"per second: {[round(b / QUOTA, 1) for b in per_second]}")
    # Held by the mute alone: 1.4-1.8 x before the one-request-at-a-time span, 1.04-1.12 x
    # before client sockets got a broker's 100 KB receive buffer, 0.97 x since (the broker's
    # own quota: 0.97-1.01 x over whole cycles in bench/quota_accuracy.py). docs/design.md.
    assert abs(rate - QUOTA) <= TOLERANCE * QUOTA, f"librdkafka achieved {rate:.0f} B/s"


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
