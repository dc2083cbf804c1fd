"""Proxy overhead benchmark: Kafka's ProducerPerformance and ConsumerPerformance run directly
against the broker and through `kqp serve`, alternating, in one run on one cluster.

    .venv/bin/python bench/proxy_throughput.py [--rounds 2] [--output out/proxy_throughput.md]

Two workloads: 1 KB records batched (batch.size 64 KB, linger.ms 5) and 100-byte records
unbatched (linger.ms 0), both acks=all. Each round runs the direct path and the proxy path
back to back, swapping which goes first every round so warm-up and page-cache effects do not
favour one side. After the max-throughput rounds, the producer runs again at half the direct
maximum (--throughput) on both paths to compare latency when nothing is saturated.

The proxy's CPU time comes from /proc/<pid>/stat and its request count from its own
kqp_requests_total metric, both read before and after each tool run. Writes a markdown
report; prints progress on stderr as it goes.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from prometheus_client.parser import text_string_to_metric_families

from harness import perf_tools
from harness.local_kafka import REPO, KafkaCluster
from harness.proxy_process import ProxyProcess

T = TypeVar("T")

DIRECT = "direct"
PROXY = "proxy"


@dataclass(frozen=True)
class Workload:
    name: str
    record_size: int
    records: int
    producer_props: dict[str, str]


@dataclass(frozen=True)
class ProxyCost:
    cpu_s: float
    requests: int

    def per_gb(self, payload_bytes: int) -> float:
        return self.cpu_s / (payload_bytes / 1e9)

    def per_100k_requests(self) -> float:
        return self.cpu_s / (self.requests / 1e5) if self.requests else float("nan")


@dataclass(frozen=True)
class Measurement:
    workload: str
    path: str
    round: int
    producer: perf_tools.ProducerResult
    consumer: perf_tools.ConsumerResult
    producer_cost: ProxyCost | None
    consumer_cost: ProxyCost | None


@dataclass(frozen=True)
class LatencyMeasurement:
    workload: str
    path: str
    target_records_per_s: int
    producer: perf_tools.ProducerResult


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def proxy_requests(proxy: ProxyProcess) -> int:
    total = 0.0
    for family in text_string_to_metric_families(proxy.metrics_text()):
        if family.name == "kqp_requests":
            total += sum(sample.value for sample in family.samples if sample.name == "kqp_requests_total")
    return int(total)


def measured(proxy: ProxyProcess | None, run: Callable[[], T]) -> tuple[T, ProxyCost | None]:
    if proxy is None:
        return run(), None
    cpu_before, requests_before = proxy.cpu_seconds(), proxy_requests(proxy)
    result = run()
    return result, ProxyCost(proxy.cpu_seconds() - cpu_before, proxy_requests(proxy) - requests_before)


class Bench:
    def __init__(self, cluster: KafkaCluster, proxy: ProxyProcess, partitions: int) -> None:
        self.cluster = cluster
        self.proxy = proxy
        self.partitions = partitions
        self.admin = AdminClient({"bootstrap.servers": cluster.bootstrap})

    def bootstrap(self, path: str) -> str:
        return self.proxy.bootstrap if path == PROXY else self.cluster.bootstrap

    def create_topic(self, topic: str) -> None:
        replication = min(3, len(self.cluster.nodes))
        futures = self.admin.create_topics([NewTopic(topic, self.partitions, replication)], operation_timeout=30)
        futures[topic].result(timeout=60)

    def max_throughput(self, workload: Workload, path: str, round_index: int) -> Measurement:
        topic = f"bench-{workload.name}-{path}-{round_index}-{os.getpid()}"
        self.create_topic(topic)
        watched = self.proxy if path == PROXY else None
        bootstrap = self.bootstrap(path)
        producer, producer_cost = measured(watched, lambda: perf_tools.producer_perf(
            self.cluster, bootstrap, topic, workload.records, workload.record_size, workload.producer_props))
        consumer, consumer_cost = measured(watched, lambda: perf_tools.consumer_perf(
            self.cluster, bootstrap, topic, workload.records, group=f"{topic}-group"))
        return Measurement(workload.name, path, round_index, producer, consumer, producer_cost, consumer_cost)

    def at_rate(self, workload: Workload, path: str, records_per_s: int, seconds: float) -> LatencyMeasurement:
        topic = f"bench-{workload.name}-{path}-half-{os.getpid()}"
        self.create_topic(topic)
        records = max(1000, int(records_per_s * seconds))
        producer = perf_tools.producer_perf(self.cluster, self.bootstrap(path), topic, records, workload.record_size,
                                            workload.producer_props, throughput=records_per_s)
        return LatencyMeasurement(workload.name, path, records_per_s, producer)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _machine() -> str:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    java = os.popen("java -version 2>&1").read().splitlines()[0]
    return (f"{os.cpu_count()} cores ({cpu}), {mem_kb / 1e6:.0f} GB RAM, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, {java}")


def report(workloads: list[Workload], results: list[Measurement], latency: list[LatencyMeasurement],
           nodes: int, partitions: int, load_before: tuple[float, ...], load_after: tuple[float, ...]) -> str:
    lines = [
        "## Proxy throughput and latency", "",
        f"Machine: {_machine()}. Load average before/after: "
        f"{'/'.join(f'{x:.1f}' for x in load_before)} and {'/'.join(f'{x:.1f}' for x in load_after)}.",
        f"Cluster: {nodes} Kafka 4.3.1 node(s) on loopback, topics with {partitions} partitions, acks=all.", "",
        "### Producer (ProducerPerformance, max throughput)", "",
        "| workload | path | round | records/s | MB/s | avg ms | p99 ms | proxy CPU s/GB | proxy CPU s/100k req |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    sizes = {w.name: w.record_size * w.records for w in workloads}
    for m in results:
        p = m.producer
        cost = m.producer_cost
        lines.append(f"| {m.workload} | {m.path} | {m.round} | {p.records_per_s:,.0f} | {p.mb_per_s:.1f} | "
                     f"{p.avg_latency_ms:.1f} | {p.p99_ms:.0f} | "
                     f"{f'{cost.per_gb(sizes[m.workload]):.1f}' if cost else '-'} | "
                     f"{f'{cost.per_100k_requests():.1f}' if cost else '-'} |")
    lines += ["", "### Consumer (ConsumerPerformance, same records)", "",
              "| workload | path | round | records/s | MB/s | proxy CPU s/GB | proxy CPU s/100k req |",
              "|---|---|---|---:|---:|---:|---:|"]
    for m in results:
        c = m.consumer
        cost = m.consumer_cost
        lines.append(f"| {m.workload} | {m.path} | {m.round} | {c.records_per_s:,.0f} | {c.mb_per_s:.1f} | "
                     f"{f'{cost.per_gb(sizes[m.workload]):.1f}' if cost else '-'} | "
                     f"{f'{cost.per_100k_requests():.1f}' if cost else '-'} |")
    lines += ["", "### Against the targets (medians over rounds)", "",
              "| workload | producer proxy/direct | consumer proxy/direct | target | "
              "p99 at half rate direct / proxy (ms) | added p99 (target <= 1 ms) |",
              "|---|---:|---:|---:|---:|---:|"]
    targets = {"batched-1KB": 0.90, "unbatched-100B": 0.70}
    for w in workloads:
        def median_of(path: str, pick: Callable[[Measurement], float], name: str = w.name) -> float:
            return _median([pick(m) for m in results if m.workload == name and m.path == path])

        produce_ratio = (median_of(PROXY, lambda m: m.producer.records_per_s)
                         / median_of(DIRECT, lambda m: m.producer.records_per_s))
        consume_ratio = (median_of(PROXY, lambda m: m.consumer.records_per_s)
                         / median_of(DIRECT, lambda m: m.consumer.records_per_s))
        half = {lm.path: lm for lm in latency if lm.workload == w.name}
        direct_p99, proxy_p99 = half[DIRECT].producer.p99_ms, half[PROXY].producer.p99_ms
        lines.append(f"| {w.name} | {produce_ratio:.0%} | {consume_ratio:.0%} | >= {targets.get(w.name, 0):.0%} | "
                     f"{direct_p99:.0f} / {proxy_p99:.0f} at {half[DIRECT].target_records_per_s:,} rec/s | "
                     f"{proxy_p99 - direct_p99:+.0f} ms |")
    lines += ["", "### Producer latency at half the direct maximum", "",
              "| workload | path | target records/s | achieved records/s | avg ms | p50 ms | p99 ms | max ms |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for lm in latency:
        p = lm.producer
        lines.append(f"| {lm.workload} | {lm.path} | {lm.target_records_per_s:,} | {p.records_per_s:,.0f} | "
                     f"{p.avg_latency_ms:.2f} | {p.p50_ms:.0f} | {p.p99_ms:.0f} | {p.max_latency_ms:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=1, help="Kafka nodes in the cluster")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="direct/proxy pairs per workload")
    parser.add_argument("--batched-records", type=int, default=200_000, help="1 KB records per run")
    parser.add_argument("--unbatched-records", type=int, default=300_000, help="100-byte records per run")
    parser.add_argument("--half-rate-seconds", type=float, default=10.0, help="length of the half-rate runs")
    parser.add_argument("--output", type=Path, default=REPO / "out" / "proxy_throughput.md")
    args = parser.parse_args(argv)

    workloads = [
        Workload("batched-1KB", 1024, args.batched_records,
                 {"acks": "all", "batch.size": "65536", "linger.ms": "5"}),
        Workload("unbatched-100B", 100, args.unbatched_records, {"acks": "all", "linger.ms": "0"}),
    ]
    load_before = os.getloadavg()
    progress(f"starting a {args.nodes}-node Kafka cluster")
    results: list[Measurement] = []
    latency: list[LatencyMeasurement] = []
    with KafkaCluster(nodes=args.nodes) as cluster:
        proxy_log = args.output.parent / "proxy_throughput-proxy.log"
        with ProxyProcess(cluster.bootstrap, proxy_log) as proxy:
            progress(f"proxy on {proxy.bootstrap} (pid {proxy.pid}), broker on {cluster.bootstrap}")
            bench = Bench(cluster, proxy, args.partitions)
            for workload in workloads:
                for round_index in range(args.rounds):
                    order = [DIRECT, PROXY] if round_index % 2 == 0 else [PROXY, DIRECT]
                    for path in order:
                        progress(f"{workload.name} round {round_index + 1}/{args.rounds}: {path}, "
                                 f"{workload.records:,} records")
                        m = bench.max_throughput(workload, path, round_index + 1)
                        results.append(m)
                        progress(f"  produce {m.producer.records_per_s:,.0f} rec/s {m.producer.mb_per_s:.1f} MB/s "
                                 f"p99 {m.producer.p99_ms:.0f} ms; consume {m.consumer.records_per_s:,.0f} rec/s")
                direct_max = _median([m.producer.records_per_s for m in results
                                      if m.workload == workload.name and m.path == DIRECT])
                half_rate = int(direct_max / 2)
                for path in (DIRECT, PROXY):
                    progress(f"{workload.name} at half rate ({half_rate:,} rec/s): {path}")
                    lm = bench.at_rate(workload, path, half_rate, args.half_rate_seconds)
                    latency.append(lm)
                    progress(f"  avg {lm.producer.avg_latency_ms:.2f} ms, p99 {lm.producer.p99_ms:.0f} ms")
            del bench  # its admin client would keep reconnecting to the stopped broker
            exit_code = proxy.stop()
            progress(f"proxy exited with {exit_code}")
    text = report(workloads, results, latency, args.nodes, args.partitions, load_before, os.getloadavg())
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)
    progress(f"report written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
