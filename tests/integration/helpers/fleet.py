"""A fleet of proxies sharing one quota: its config, its metrics, and a producer paced through it."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer

from harness.proxy_process import ProxyProcess

QUOTA = 256 * 1024  # bytes/s, for the three clients together
RECORD_SIZE = 1024
CLIENT_ID = "fleet-client"
# Kafka's default windows (11 x 1 s): a fresh sensor admits about ten windows' worth first.
WARMUP_S = 14
STEADY_S = 60
TOLERANCE = 0.10
# What one Kafka 4.3.1 broker that enforces the quota itself admits from these three producers,
# measured with this file's producer and averaging (bench/fleet_reference.py: 0.929x in two
# runs): each client waits out the whole throttle, so Kafka admits a little less than the
# quota. The fleet must admit what Kafka admits, within TOLERANCE.
KAFKA_ADMITS = 0.93 * QUOTA


def fleet_config(path: Path, usage_topic: str, policy: str = "share", enabled: bool = True,
                 quota_type: str = "producer_byte_rate", quota: int = QUOTA) -> Path:
    """CLIENT_ID limited to `quota` for the cluster; `enabled: false` leaves the exchange to --workers."""
    path.write_text(
        "quotas:\n"
        "  scope: cluster\n"
        "  entries:\n"
        f"    - entity: {{client-id: {CLIENT_ID}}}\n"
        f"      {quota_type}: {quota}\n"
        "fleet:\n"
        f"  enabled: {str(enabled).lower()}\n"
        f"  topic: {usage_topic}\n"
        f"  on_unreachable: {policy}\n"
        "  report_interval_seconds: 0.1\n"
        "  unreachable_after_seconds: 2\n"
    )
    return path


def metric(proxy: ProxyProcess, name: str, **labels: str) -> float | None:
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    for line in proxy.metrics_text().splitlines():
        if line.startswith(name) and re.match(rf"{re.escape(name)}[{{ ]", line) and all(w in line for w in wanted):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds it took; fails with `what` when it does not happen in time."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.1)
    return time.monotonic() - start


def wait_for_fleet(proxies: list[ProxyProcess]) -> None:
    wait_until(lambda: all(metric(p, "kqp_fleet_instances") == len(proxies) for p in proxies), 60,
               f"every instance sees {len(proxies)} instances")


def produce_through(bootstrap: str, topic: str, seconds: float, per_second: list[int], lock: threading.Lock,
                    start: float) -> None:
    """One librdkafka producer offering one quota's worth of bytes/s; acknowledged bytes are
    added to `per_second` by the second they were acknowledged in."""
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": CLIENT_ID, "linger.ms": 5,
                         "queue.buffering.max.kbytes": 2048})
    payload = b"x" * RECORD_SIZE

    def on_delivery(error: object, message: object) -> None:
        second = int(time.monotonic() - start)
        if error is None and second < len(per_second):
            with lock:
                per_second[second] += RECORD_SIZE

    sent = 0
    began = time.monotonic()  # the offer starts when this producer does
    while time.monotonic() - start < seconds:
        if sent * RECORD_SIZE < (time.monotonic() - began) * QUOTA:
            # Muted: the offer beyond the queue is dropped, as a bounded client would drop it.
            with contextlib.suppress(BufferError):
                producer.produce(topic, payload, on_delivery=on_delivery)
            sent += 1
        else:
            producer.poll(0.002)
        producer.poll(0)
    # What is still queued would be acknowledged after the measured seconds: drop it.
    producer.purge(in_queue=True, in_flight=False)
    producer.flush(10)


def steady_rate(per_second: list[int], first: int, last: int, quota: int = QUOTA) -> float:
    """Bytes/s acknowledged from second `first` to `last`, over whole throttling cycles.

    librdkafka ignores ThrottleTimeMs and is held by the mute alone, so it sends in cycles (a
    burst of several seconds, then seconds near zero) of about one quota window: averaging
    over a window that cuts a cycle would count part of a burst or part of a pause. A burst
    starts at a second above the quota after three seconds below it (a dip inside a burst's
    tail is not a start); the average runs from the first burst that starts in [first, last]
    to the last one. Traffic with fewer than two bursts there is smooth, and is averaged over
    [first, last].
    """
    starts = [i for i in range(max(first, 3), last + 1)
              if per_second[i] > quota and max(per_second[i - 3:i]) < quota]
    if len(starts) >= 2:
        first, last = starts[0], starts[-1]
    return sum(per_second[first:last]) / (last - first)
