"""Soak: mixed produce, fetch and admin traffic through one proxy with a quota throttling one
client, while the proxy's memory and file descriptors are sampled.

    .venv/bin/python bench/soak.py [--duration-s 1800] [--interval-s 10] [--warmup-s 120]

A 1-node Kafka cluster and one `kqp serve` with a quota file. The traffic, all through the proxy:

* a steady producer (acks=all, 200-byte records at --rate records/s) on one topic;
* a producer whose client-id has producer_byte_rate --throttled-rate, offering twice that, so
  the proxy throttles it the whole time;
* a consumer group reading both topics and committing;
* an admin loop: Metadata, DescribeConfigs, DescribeConsumerGroups, DescribeClientQuotas, and a
  topic created and deleted (CreateTopics/DeleteTopics);
* connection churn: a short-lived producer every few seconds that connects, sends, closes.

Every --interval-s the proxy's RSS, open descriptors, CPU time and open connections are
sampled, with the traffic counters. Writes a CSV and a PNG of memory and descriptors over time,
and reports growth after warm-up: the least-squares slope and the change between the mean of
the first and the last fifth of the post-warm-up samples.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
)
from prometheus_client.parser import text_string_to_metric_families

from harness.local_kafka import REPO, KafkaCluster
from harness.proxy_process import ProxyProcess

STEADY_TOPIC = "soak-steady"
THROTTLED_TOPIC = "soak-throttled"
THROTTLED_CLIENT = "soak-throttled"
THROTTLED_RECORD_BYTES = 500


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class ConfiguredProxy(ProxyProcess):
    """`kqp serve` with a config file on top of the harness's command-line flags."""

    def __init__(self, upstream: str, log_path: Path, config: Path, workers: int = 1) -> None:
        super().__init__(upstream, log_path, config=config, workers=workers)


@dataclass
class Counters:
    steady_acked: int = 0
    throttled_acked: int = 0
    consumed: int = 0
    admin_calls: int = 0
    churn_connections: int = 0
    throttled_expired: int = 0
    errors: int = 0


@dataclass
class Sample:
    elapsed_s: float
    rss_kb: int
    fds: int
    cpu_s: float
    connections_open: int
    steady_acked: int
    throttled_acked: int
    consumed: int
    admin_calls: int
    churn_connections: int
    throttle_time_s: float
    throttled_expired: int
    errors: int


class Workload:
    def __init__(self, bootstrap: str, counters: Counters, rate: int, throttled_quota: int,
                 stop: threading.Event) -> None:
        self.bootstrap = bootstrap
        self.counters = counters
        self.rate = rate
        self.throttled_quota = throttled_quota
        self.stop = stop
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._guard(target), name=target.__name__, daemon=True)
            for target in (self.steady, self.throttled, self.consume, self.admin, self.churn)
        ]

    def _guard(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except Exception as exc:  # one crashed client must show, not end the soak silently
                progress(f"{target.__name__} crashed: {exc!r}")
                self.count("errors")
                raise

        return run

    def count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            setattr(self.counters, name, getattr(self.counters, name) + amount)

    def _acked(self, name: str, failed: str = "errors") -> Callable[[object, object], None]:
        def delivered(error: object, _message: object) -> None:
            if error is None:
                self.count(name)
            elif not self.stop.is_set():  # records purged at the end are not failures
                self.count(failed)

        return delivered

    def steady(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "client.id": "soak-steady", "acks": "all",
                             "linger.ms": 5})
        payload = b"s" * 200
        delivered = self._acked("steady_acked")
        started, sent = time.monotonic(), 0
        while not self.stop.is_set():
            due = int((time.monotonic() - started) * self.rate)
            for _ in range(due - sent):
                try:
                    producer.produce(STEADY_TOPIC, payload, on_delivery=delivered)
                except BufferError:
                    break
                sent += 1
            producer.poll(0.01)
        producer.flush(30)

    def throttled(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "client.id": THROTTLED_CLIENT, "acks": 1,
                             "linger.ms": 20})
        payload = b"t" * THROTTLED_RECORD_BYTES
        # Offered more than it may send, its queue grows until records reach message.timeout.ms.
        delivered = self._acked("throttled_acked", failed="throttled_expired")
        # Offered at twice its quota: throttled all the time, yet making progress, rather than
        # one unpaced burst followed by minutes of paying it back.
        rate = 2 * self.throttled_quota / THROTTLED_RECORD_BYTES
        started, sent = time.monotonic(), 0
        while not self.stop.is_set():
            due = int((time.monotonic() - started) * rate)
            for _ in range(due - sent):
                try:
                    producer.produce(THROTTLED_TOPIC, payload, on_delivery=delivered)
                except BufferError:
                    break
                sent += 1
            producer.poll(0.02)
        producer.purge()
        producer.flush(5)

    def consume(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "soak-group",
                             "client.id": "soak-consumer", "auto.offset.reset": "earliest"})
        consumer.subscribe([STEADY_TOPIC, THROTTLED_TOPIC])
        while not self.stop.is_set():
            messages = consumer.consume(1000, timeout=0.5)
            self.count("consumed", sum(1 for m in messages if m.error() is None))
        consumer.close()

    def admin(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "client.id": "soak-admin"})
        round_index = 0
        while not self.stop.wait(2.0):
            round_index += 1
            try:
                admin.list_topics(timeout=10)
                resource = ConfigResource(ConfigResource.Type.TOPIC, STEADY_TOPIC)
                admin.describe_configs([resource])[resource].result(timeout=10)
                admin.describe_consumer_groups(["soak-group"])["soak-group"].result(timeout=10)
                admin.describe_user_scram_credentials(["nobody"])  # an API the proxy only forwards
                topic = f"soak-admin-{round_index}"
                admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=20)
                admin.delete_topics([topic])[topic].result(timeout=20)
                self.count("admin_calls", 6)
            except KafkaException:
                self.count("errors")

    def churn(self) -> None:
        index = 0
        while not self.stop.wait(3.0):
            index += 1
            producer = Producer({"bootstrap.servers": self.bootstrap, "client.id": f"soak-churn-{index % 50}"})
            producer.produce(STEADY_TOPIC, b"churn")
            if producer.flush(10) != 0:
                self.count("errors")
            del producer
            self.count("churn_connections")

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(60)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def proxy_metric_sum(text: str, family_name: str, sample_name: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == family_name:
            total += sum(s.value for s in family.samples if s.name == sample_name)
    return total


def take_sample(proxy: ProxyProcess, counters: Counters, started: float) -> Sample:
    text = proxy.metrics_text()
    return Sample(
        elapsed_s=round(time.monotonic() - started, 1),
        rss_kb=rss_kb(proxy.pid),
        fds=len(os.listdir(f"/proc/{proxy.pid}/fd")),
        cpu_s=round(proxy.cpu_seconds(), 2),
        connections_open=int(proxy_metric_sum(text, "kqp_connections_open", "kqp_connections_open")),
        steady_acked=counters.steady_acked,
        throttled_acked=counters.throttled_acked,
        consumed=counters.consumed,
        admin_calls=counters.admin_calls,
        churn_connections=counters.churn_connections,
        throttle_time_s=round(
            proxy_metric_sum(text, "kqp_throttle_time_seconds", "kqp_throttle_time_seconds_total"), 1),
        throttled_expired=counters.throttled_expired,
        errors=counters.errors,
    )


def slope_per_minute(samples: list[Sample], value: Callable[[Sample], float]) -> float:
    xs = [s.elapsed_s / 60 for s in samples]
    ys = [value(s) for s in samples]
    if len(xs) < 2:
        return float("nan")
    return statistics.linear_regression(xs, ys).slope


def fifth_means(samples: list[Sample], value: Callable[[Sample], float]) -> tuple[float, float]:
    fifth = max(1, len(samples) // 5)
    return (statistics.fmean(value(s) for s in samples[:fifth]),
            statistics.fmean(value(s) for s in samples[-fifth:]))


def fifth_floors(samples: list[Sample], value: Callable[[Sample], float]) -> tuple[float, float]:
    fifth = max(1, len(samples) // 5)
    return min(value(s) for s in samples[:fifth]), min(value(s) for s in samples[-fifth:])


def write_csv(samples: list[Sample], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([f.name for f in fields(Sample)])
        for sample in samples:
            writer.writerow([getattr(sample, f.name) for f in fields(Sample)])


def plot(samples: list[Sample], warmup_s: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s.elapsed_s / 60 for s in samples]
    figure, (memory, descriptors) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    memory.plot(minutes, [s.rss_kb / 1024 for s in samples], color="tab:blue")
    memory.set_ylabel("proxy RSS (MB)")
    descriptors.plot(minutes, [s.fds for s in samples], color="tab:orange", label="open descriptors")
    descriptors.plot(minutes, [s.connections_open for s in samples], color="tab:green", label="client connections")
    descriptors.set_ylabel("count")
    descriptors.set_xlabel("minutes")
    descriptors.legend(loc="upper left")
    for axes in (memory, descriptors):
        axes.axvspan(0, warmup_s / 60, color="0.9", label="warm-up")
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
    memory.set_title("kqp serve under mixed traffic with one client throttled")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def report(samples: list[Sample], warmup_s: float, args: argparse.Namespace) -> str:
    steady = [s for s in samples if s.elapsed_s >= warmup_s]
    last = samples[-1]
    rss_first, rss_last = fifth_means(steady, lambda s: s.rss_kb / 1024)
    fds_first, fds_last = fifth_means(steady, lambda s: s.fds)
    # The floor (lowest sample) separates retained memory from transient fetch buffers.
    rss_floor = fifth_floors(steady, lambda s: s.rss_kb / 1024)
    fds_floor = fifth_floors(steady, lambda s: s.fds)
    lines = [
        f"Duration {last.elapsed_s / 60:.1f} min, {len(samples)} samples every {args.interval_s:g} s, "
        f"warm-up {warmup_s:g} s excluded from the growth figures.",
        "",
        f"Traffic: {last.steady_acked:,} steady records acked, {last.throttled_acked:,} throttled-client records "
        f"acked ({last.throttled_acked * THROTTLED_RECORD_BYTES / last.elapsed_s / 1024:.1f} KiB/s of payload "
        f"against a quota of "
        f"{args.throttled_rate / 1024:g} KiB/s), {last.consumed:,} consumed, {last.admin_calls:,} admin calls, "
        f"{last.churn_connections:,} short-lived producers, {last.throttle_time_s:,.0f} s of throttle time given, "
        f"{last.throttled_expired:,} throttled-client records expired in its own queue, "
        f"{last.errors} other client errors; proxy CPU {last.cpu_s:.0f} s.",
        "",
        "| after warm-up | first fifth (mean) | last fifth (mean) | least-squares slope | min | max | "
        "floor, first fifth | floor, last fifth |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| RSS (MB) | {rss_first:.1f} | {rss_last:.1f} | "
        f"{slope_per_minute(steady, lambda s: s.rss_kb / 1024):+.3f} MB/min | "
        f"{min(s.rss_kb for s in steady) / 1024:.1f} | {max(s.rss_kb for s in steady) / 1024:.1f} | "
        f"{rss_floor[0]:.1f} | {rss_floor[1]:.1f} |",
        f"| open descriptors | {fds_first:.1f} | {fds_last:.1f} | "
        f"{slope_per_minute(steady, lambda s: s.fds):+.3f} /min | "
        f"{min(s.fds for s in steady)} | {max(s.fds for s in steady)} | {fds_floor[0]:g} | {fds_floor[1]:g} |",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration-s", type=float, default=1800.0)
    parser.add_argument("--interval-s", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=None, help="default: 10 %% of the duration, at least 60 s")
    parser.add_argument("--rate", type=int, default=1000, help="steady producer, records/s")
    parser.add_argument("--throttled-rate", type=int, default=32 * 1024, help="the throttled client's bytes/s quota")
    parser.add_argument("--output-dir", type=Path, default=REPO / "out" / "soak")
    parser.add_argument("--png", type=Path, default=None, help="default: <output-dir>/soak.png")
    args = parser.parse_args(argv)
    warmup_s = args.warmup_s if args.warmup_s is not None else max(60.0, args.duration_s / 10)
    out: Path = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    png = args.png or out / "soak.png"
    config = out / "quotas.yaml"
    config.write_text(f"quotas:\n  entries:\n    - entity: {{client-id: {THROTTLED_CLIENT}}}\n"
                      f"      producer_byte_rate: {args.throttled_rate}\n")
    log = out / "proxy.log"
    log.unlink(missing_ok=True)
    samples: list[Sample] = []
    with KafkaCluster(nodes=1, heap="768m") as cluster:
        for topic in (STEADY_TOPIC, THROTTLED_TOPIC):
            cluster.create_topic(topic, partitions=3)
        with ConfiguredProxy(cluster.bootstrap, log, config) as proxy:
            counters = Counters()
            stop = threading.Event()
            workload = Workload(proxy.bootstrap, counters, args.rate, args.throttled_rate, stop)
            started = time.monotonic()
            workload.start()
            try:
                while (elapsed := time.monotonic() - started) < args.duration_s:
                    time.sleep(max(0.0, args.interval_s * (len(samples) + 1) - elapsed))
                    sample = take_sample(proxy, counters, started)
                    samples.append(sample)
                    progress(f"{sample.elapsed_s:7.0f} s  RSS {sample.rss_kb / 1024:6.1f} MB  fds {sample.fds:4d}  "
                             f"conns {sample.connections_open:3d}  acked {sample.steady_acked:,}/"
                             f"{sample.throttled_acked:,}  consumed {sample.consumed:,}  admin {sample.admin_calls:,}"
                             f"  throttle {sample.throttle_time_s:,.0f} s  expired {sample.throttled_expired:,}"
                             f"  errors {sample.errors}")
            finally:
                stop.set()
                workload.join()
            exit_code = proxy.stop()
            progress(f"proxy exited with {exit_code}")
    write_csv(samples, out / "soak.csv")
    plot(samples, warmup_s, png)
    text = report(samples, warmup_s, args) + f"\nCSV: {out / 'soak.csv'}; plot: {png}\n"
    (out / "soak.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
