"""A fleet of proxies sharing one quota: its config, its metrics, and a producer paced through it."""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
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
                 quota_type: str = "producer_byte_rate", quota: int = QUOTA,
                 count_other_instances: bool = False) -> Path:
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
        f"  count_other_instances: {str(count_other_instances).lower()}\n"
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


@dataclass
class ProducerTally:
    """What one producer got: bytes acknowledged by second, librdkafka's request time-outs (its
    statistics' `req_timeouts`, summed over the brokers it talked to) and the longest
    ThrottleTimeMs it was given (its statistics' `throttle.max`, a window of one interval)."""

    per_second: list[int]
    request_timeouts: int = 0
    longest_throttle_ms: int = 0


def produce_through(bootstrap: str, topic: str, seconds: float, per_second: list[int], lock: threading.Lock,
                    start: float, offer: float = QUOTA, tally: ProducerTally | None = None,
                    stop: threading.Event | None = None) -> None:
    """One librdkafka producer offering `offer` bytes/s with librdkafka's default queue;
    acknowledged bytes are added to `per_second` (and to `tally`) by the second they were
    acknowledged in. It stops after `seconds`, or earlier when `stop` is set.

    An application that produces faster than it is acknowledged fills its queue and then
    waits for room (a full queue raises BufferError): the producer waits too, and catches up
    with its offer when there is room, never dropping what it offered.
    """
    stats: dict[str, int] = {}

    def on_stats(text: str) -> None:
        brokers = json.loads(text).get("brokers", {})
        stats["req_timeouts"] = sum(int(b.get("req_timeouts", 0)) for b in brokers.values())
        longest = max((int(b.get("throttle", {}).get("max", 0)) for b in brokers.values()), default=0)
        stats["throttle_max"] = max(stats.get("throttle_max", 0), longest)

    producer = Producer({"bootstrap.servers": bootstrap, "client.id": CLIENT_ID, "linger.ms": 5, "acks": "all",
                         "statistics.interval.ms": 1000, "stats_cb": on_stats})
    payload = b"x" * RECORD_SIZE

    def on_delivery(error: object, message: object) -> None:
        second = int(time.monotonic() - start)
        if error is None and second < len(per_second):
            with lock:
                per_second[second] += RECORD_SIZE
            if tally is not None and second < len(tally.per_second):
                tally.per_second[second] += RECORD_SIZE

    sent = 0
    began = time.monotonic()  # the offer starts when this producer does
    while time.monotonic() - start < seconds and not (stop is not None and stop.is_set()):
        if sent * RECORD_SIZE < (time.monotonic() - began) * offer:
            try:
                producer.produce(topic, payload, on_delivery=on_delivery)
                sent += 1
            except BufferError:  # the queue is full: wait for acknowledgements to make room
                producer.poll(0.05)
        else:
            producer.poll(0.002)
        producer.poll(0)
    # What is still queued or in flight would be acknowledged after the measured seconds.
    producer.poll(1.5)  # the last statistics
    producer.purge(in_queue=True, in_flight=True)
    producer.flush(10)
    if tally is not None:
        tally.request_timeouts = stats.get("req_timeouts", 0)
        tally.longest_throttle_ms = stats.get("throttle_max", 0)


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



def acknowledged_slope(per_second: list[int], first: int, last: int) -> float:
    """Bytes/s acknowledged from second `first` to `last` (excluded): the least-squares slope of
    the cumulative acknowledged bytes. Large requests (a second of the quota each) come in bursts
    of several seconds' worth, and a plain average moves by several percent with where its edges
    cut a burst; the slope weighs every second, so one burst at an edge moves it far less."""
    cumulative = list(itertools.accumulate(per_second[first:last]))
    n = len(cumulative)
    mean_x, mean_y = (n - 1) / 2, sum(cumulative) / n
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(cumulative))
    return covariance / sum((x - mean_x) ** 2 for x in range(n))
