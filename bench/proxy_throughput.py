"""Proxy overhead benchmark: Kafka's ProducerPerformance and ConsumerPerformance run directly
against the broker, through a bare relay, through `kqp serve` and through Kroxylicious,
alternating, in one run on one cluster.

    .venv/bin/python bench/proxy_throughput.py [--rounds 5] [--output out/proxy_throughput.md]
        [--kroxylicious-warmup-seconds 180] [--no-kroxylicious]

The bare relay (bench/bare_relay.py) moves bytes and parses nothing: it is the floor of any
Python hop on the machine at hand, so "kqp / relay" is what kqp's own work costs and
"relay / direct" what the hop itself costs. The broker gets an extra listener that
advertises the relay's port, so clients that bootstrap through the relay stay on it.

Kroxylicious 0.12.0 (harness/kroxylicious.py) is the leading open-source Kafka proxy, on the
JVM and Netty: its runtime, fetched from Maven Central into .cache the first time this bench
runs with it, started by our own small launcher from its YAML configuration with no filters
and a `portIdentifiesNode` gateway, so every broker address is rewritten to one of its ports.
A JIT-compiled JVM is slow for its first minutes, and a proxy that a broker's clients use has
long been running, so before the measured rounds the bench warms it the way traffic would:
it runs every workload's producer and consumer through Kroxylicious, pass after pass, until
--kroxylicious-warmup-seconds have gone by (at least one pass). Those passes are not measured
rounds; the report lists them, so whether Kroxylicious had reached its plateau can be seen.
kqp and the relay are CPython and have no JIT to warm.

Two workloads: 1 KB records batched (batch.size 64 KB, linger.ms 5) and 100-byte records
unbatched (linger.ms 0), both acks=all. Each round runs the three paths back to back,
rotating which goes first so warm-up and page-cache effects do not favour one. After the
max-throughput rounds, the producer runs again at half the direct maximum (--throughput) on
every path, while a probe measures raw ApiVersions round trips on one socket through the same
path (the latency a hop adds when nothing is saturated).

CPU time of each hop (kqp, the relay, Kroxylicious' JVM) comes from /proc/<pid>/stat, read
before and after each tool run. CPU per request divides it by the requests the client itself
reports having sent (the tool's request-total metric, --print-metrics), the same count for
every path; kqp's kqp_requests_total and Kroxylicious' inbound message count are listed beside
it as a check that the traffic went through the hop. Writes a markdown report; prints
progress on stderr as it goes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from prometheus_client.parser import text_string_to_metric_families

from bench.connections_load import run_probe
from bench.soak import ConfiguredProxy
from harness import perf_tools
from harness.kroxylicious import KROXYLICIOUS_VERSION, KroxyliciousProcess
from harness.local_kafka import REPO, KafkaCluster
from harness.proxy_process import ProxyProcess

T = TypeVar("T")

DIRECT = "direct"
RELAY = "relay"
PROXY = "proxy"
# `kqp serve` from another source tree (--baseline-tree), beside this tree's, in the same rounds.
BASELINE = "proxy-baseline"
KROXYLICIOUS = "kroxylicious"
PATHS = (DIRECT, RELAY, PROXY, BASELINE, KROXYLICIOUS)
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Workload:
    name: str
    record_size: int
    records: int
    producer_props: dict[str, str]


@dataclass(frozen=True)
class ProxyCost:
    """What one tool run cost a hop: its CPU, the requests the client sent through it, and the
    requests the hop itself counted (None for the relay, which counts nothing)."""

    cpu_s: float
    requests: int
    hop_requests: int | None

    def per_gb(self, payload_bytes: int) -> float:
        return self.cpu_s / (payload_bytes / 1e9)

    def per_request_us(self) -> float:
        return self.cpu_s / self.requests * 1e6 if self.requests else float("nan")


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
    # Raw ApiVersions round trips through the same path while the producer runs (ms).
    probe_p50_ms: float
    probe_p99_ms: float


class BareRelay:
    """bench/bare_relay.py in its own process, relaying each node's advertised relay port."""

    def __init__(self, cluster: KafkaCluster) -> None:
        pairs = [f"{n.relay_advertised_port}:{n.relay_port}" for n in cluster.nodes.values()]
        self.bootstrap = ",".join(f"127.0.0.1:{n.relay_advertised_port}" for n in cluster.nodes.values())
        self.process = subprocess.Popen([sys.executable, str(Path(__file__).with_name("bare_relay.py")), *pairs],
                                        stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        if not self.process.stdout.readline().startswith("relaying"):
            raise RuntimeError("the bare relay did not start")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


class Watched:
    """What a path's hop costs: CPU from /proc, and the hop's own request count where it keeps
    one (kqp's and Kroxylicious' metrics; the relay counts none)."""

    def __init__(self, cpu: Callable[[], float], requests: Callable[[], int] | None) -> None:
        self.cpu = cpu
        self.requests = requests


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def proxy_requests(proxy: ProxyProcess) -> int:
    total = 0.0
    for family in text_string_to_metric_families(proxy.metrics_text()):
        if family.name == "kqp_requests":
            total += sum(sample.value for sample in family.samples if sample.name == "kqp_requests_total")
    return int(total)


def measured(hop: Watched | None, run: Callable[[], T], output: Callable[[T], str]) -> tuple[T, ProxyCost | None]:
    """Run one tool (with --print-metrics) and what it cost the hop, if the path has one."""
    if hop is None:
        return run(), None
    count = hop.requests
    cpu_before, requests_before = hop.cpu(), count() if count is not None else 0
    result = run()
    cpu = hop.cpu() - cpu_before
    hop_requests = count() - requests_before if count is not None else None
    return result, ProxyCost(cpu, perf_tools.client_requests(output(result)), hop_requests)


class Bench:
    def __init__(self, cluster: KafkaCluster, proxy: ProxyProcess, relay: BareRelay, partitions: int,
                 kroxylicious: KroxyliciousProcess | None = None, baseline: ProxyProcess | None = None,
                 only_paths: tuple[str, ...] = PATHS) -> None:
        self.cluster = cluster
        self.proxy = proxy
        self.relay = relay
        self.kroxylicious = kroxylicious
        self.partitions = partitions
        self.admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        self.hops = {PROXY: Watched(proxy.cpu_seconds, lambda: proxy_requests(proxy)),
                     RELAY: Watched(relay.cpu_seconds, None)}
        self.bootstraps = {DIRECT: cluster.bootstrap, RELAY: relay.bootstrap, PROXY: proxy.bootstrap}
        if kroxylicious is not None:
            self.hops[KROXYLICIOUS] = Watched(kroxylicious.cpu_seconds, kroxylicious.requests)
            self.bootstraps[KROXYLICIOUS] = kroxylicious.bootstrap
        if baseline is not None:
            self.hops[BASELINE] = Watched(baseline.cpu_seconds, lambda: proxy_requests(baseline))
            self.bootstraps[BASELINE] = baseline.bootstrap
        self.only_paths = only_paths

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(path for path in PATHS if path in self.bootstraps and path in self.only_paths)

    def bootstrap(self, path: str) -> str:
        return self.bootstraps[path]

    def create_topic(self, topic: str) -> None:
        replication = min(3, len(self.cluster.nodes))
        futures = self.admin.create_topics([NewTopic(topic, self.partitions, replication)], operation_timeout=30)
        futures[topic].result(timeout=60)

    def max_throughput(self, workload: Workload, path: str, round_index: int) -> Measurement:
        topic = f"bench-{workload.name}-{path}-{round_index}-{os.getpid()}"
        self.create_topic(topic)
        watched = self.hops.get(path)
        bootstrap = self.bootstrap(path)
        producer, producer_cost = measured(watched, lambda: perf_tools.producer_perf(
            self.cluster, bootstrap, topic, workload.records, workload.record_size, workload.producer_props,
            print_metrics=True), lambda result: result.output)
        consumer, consumer_cost = measured(watched, lambda: perf_tools.consumer_perf(
            self.cluster, bootstrap, topic, workload.records, group=f"{topic}-group", print_metrics=True),
            lambda result: result.output)
        return Measurement(workload.name, path, round_index, producer, consumer, producer_cost, consumer_cost)

    def warm_kroxylicious(self, workloads: list[Workload], seconds: float) -> list[Measurement]:
        """Every workload through Kroxylicious, pass after pass, until `seconds` have gone by (at
        least one pass): its JIT compiles the paths the measured rounds then take."""
        passes: list[Measurement] = []
        started = time.monotonic()
        while not passes or time.monotonic() - started < seconds:
            pass_index = len(passes) // len(workloads) + 1
            for workload in workloads:
                m = self.max_throughput(workload, KROXYLICIOUS, -pass_index)
                passes.append(m)
                progress(f"  warm-up pass {pass_index} ({time.monotonic() - started:.0f} s), {workload.name}: "
                         f"produce {m.producer.mb_per_s:.1f} MB/s, consume {m.consumer.mb_per_s:.1f} MB/s")
        return passes

    def at_rate(self, workload: Workload, path: str, records_per_s: int, seconds: float) -> LatencyMeasurement:
        topic = f"bench-{workload.name}-{path}-half-{os.getpid()}"
        self.create_topic(topic)
        records = max(1000, int(records_per_s * seconds))
        bootstrap = self.bootstrap(path)
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(perf_tools.producer_perf, self.cluster, bootstrap, topic, records,
                                  workload.record_size, workload.producer_props, throughput=records_per_s)
            # Round trips on one raw socket to the first node, through the path, under that load.
            probe = run_probe(bootstrap.split(",")[0], topic, api_rounds=probe_rounds(seconds), produce_rounds=0)
            producer = running.result()
        api = probe["api_versions"]
        return LatencyMeasurement(workload.name, path, records_per_s, producer, api["p50"], api["p99"])


def probe_rounds(seconds: float) -> int:
    # About half the half-rate run, at roughly 0.2 ms per round trip, so the probe ends first.
    return max(1000, int(seconds * 2500))


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


def _cost_cells(cost: ProxyCost | None, payload_bytes: int) -> str:
    if cost is None:
        return "- | - | -"
    hop_counted = "-" if cost.hop_requests is None else f"{cost.hop_requests:,}"
    counted = f"{cost.requests:,} / {hop_counted}"
    return f"{cost.per_gb(payload_bytes):.2f} | {cost.per_request_us():.0f} | {counted}"


def _side_medians(results: list[Measurement], workload: Workload, path: str,
                  side: str) -> dict[str, float]:
    """Medians over one path's rounds of one side (producer or consumer) of one workload."""
    runs = [m for m in results if m.workload == workload.name and m.path == path]
    payload = workload.record_size * workload.records
    results_of = [m.producer if side == "producer" else m.consumer for m in runs]
    costs = [c for c in (m.producer_cost if side == "producer" else m.consumer_cost for m in runs) if c is not None]
    return {
        "mb_per_s": _median([r.mb_per_s for r in results_of]),
        "records_per_s": _median([r.records_per_s for r in results_of]),
        "cpu_per_gb": _median([c.per_gb(payload) for c in costs]),
        "cpu_per_request_us": _median([c.per_request_us() for c in costs]),
        "requests": _median([float(c.requests) for c in costs]),
    }


def _four_paths(workloads: list[Workload], results: list[Measurement], paths: tuple[str, ...]) -> list[str]:
    lines = ["", "### The paths side by side (medians over rounds)", "",
             "CPU is the hop's own (kqp, the relay or Kroxylicious' JVM; direct has no hop), per GB of "
             "records and per request the client sent.", "",
             "| workload | side | path | records/s | MB/s | CPU s/GB | CPU µs/request | requests |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    medians: dict[tuple[str, str, str], dict[str, float]] = {}
    for w in workloads:
        for side in ("producer", "consumer"):
            for path in paths:
                med = medians[w.name, side, path] = _side_medians(results, w, path, side)
                hop = "- | - | -" if path == DIRECT else (
                    f"{med['cpu_per_gb']:.2f} | {med['cpu_per_request_us']:.0f} | {med['requests']:,.0f}")
                lines.append(f"| {w.name} | {side} | {path} | {med['records_per_s']:,.0f} | {med['mb_per_s']:.1f} | "
                             f"{hop} |")
    if KROXYLICIOUS not in paths:
        return lines
    lines += ["", "### kqp against direct, the relay and Kroxylicious (issue 26)", "",
              "Ratios of the medians above. Targets: kqp's throughput >= 0.95x the relay's and >= "
              "Kroxylicious' on every workload; kqp's CPU per GB and per request below Kroxylicious'; "
              "on the unbatched producer, kqp's CPU per request <= 1.5x the relay's.", "",
              "| workload | side | kqp / direct | kqp / relay | kqp / Kroxylicious | CPU/GB kqp / relay | "
              "CPU/GB kqp / Kroxylicious | CPU/request kqp / relay | CPU/request kqp / Kroxylicious | met? |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for w in workloads:
        for side in ("producer", "consumer"):
            kqp, relay = medians[w.name, side, PROXY], medians[w.name, side, RELAY]
            direct, krox = medians[w.name, side, DIRECT], medians[w.name, side, KROXYLICIOUS]
            rate = "records_per_s"
            met = (kqp[rate] >= 0.95 * relay[rate] and kqp[rate] >= krox[rate]
                   and kqp["cpu_per_gb"] < krox["cpu_per_gb"]
                   and kqp["cpu_per_request_us"] < krox["cpu_per_request_us"])
            if w.name.startswith("unbatched") and side == "producer":
                met = met and kqp["cpu_per_request_us"] <= 1.5 * relay["cpu_per_request_us"]
            cells = [_ratio(kqp[rate], direct[rate]), _ratio(kqp[rate], relay[rate]), _ratio(kqp[rate], krox[rate]),
                     _ratio(kqp["cpu_per_gb"], relay["cpu_per_gb"]), _ratio(kqp["cpu_per_gb"], krox["cpu_per_gb"]),
                     _ratio(kqp["cpu_per_request_us"], relay["cpu_per_request_us"]),
                     _ratio(kqp["cpu_per_request_us"], krox["cpu_per_request_us"])]
            lines.append(f"| {w.name} | {side} | {' | '.join(cells)} | {'yes' if met else 'no'} |")
    return lines


def _ratio(ours: float, theirs: float) -> str:
    # A short run can measure no CPU at all on a hop (CPU time moves in 10 ms ticks).
    return f"{ours / theirs:.2f}" if theirs else "-"


def _warm_up(workloads: list[Workload], warm_up: list[Measurement], seconds: float) -> list[str]:
    if not warm_up:
        return []
    lines = ["", f"### Kroxylicious warm-up (not measured rounds; at least {seconds:.0f} s)", "",
             "| pass | workload | produce MB/s | consume MB/s | produce CPU s/GB | consume CPU s/GB |",
             "|---:|---|---:|---:|---:|---:|"]
    sizes = {w.name: w.record_size * w.records for w in workloads}
    for m in warm_up:
        produce = f"{m.producer_cost.per_gb(sizes[m.workload]):.2f}" if m.producer_cost else "-"
        consume = f"{m.consumer_cost.per_gb(sizes[m.workload]):.2f}" if m.consumer_cost else "-"
        lines.append(f"| {-m.round} | {m.workload} | {m.producer.mb_per_s:.1f} | {m.consumer.mb_per_s:.1f} | "
                     f"{produce} | {consume} |")
    return lines


def report(workloads: list[Workload], results: list[Measurement], latency: list[LatencyMeasurement],
           nodes: int, partitions: int, load_before: tuple[float, ...], load_after: tuple[float, ...],
           proxy_config: Path | None = None, warm_up: list[Measurement] | None = None,
           warm_up_seconds: float = 0.0) -> str:
    config = "defaults" if proxy_config is None else f"`{proxy_config}`: {proxy_config.read_text().strip()!r}"
    paths = tuple(path for path in PATHS if any(m.path == path for m in results))
    lines = [
        "## Proxy throughput and latency", "",
        f"Machine: {_machine()}. Load average before/after: "
        f"{'/'.join(f'{x:.1f}' for x in load_before)} and {'/'.join(f'{x:.1f}' for x in load_after)}.",
        f"Cluster: {nodes} Kafka 4.3.1 node(s) on loopback, topics with {partitions} partitions, acks=all.",
        f"Proxy configuration: {config}.",
        f"Paths: {', '.join(paths)}"
        + (f" (Kroxylicious {KROXYLICIOUS_VERSION}, no filters, portIdentifiesNode)." if KROXYLICIOUS in paths
           else "."), "",
        "### Producer (ProducerPerformance, max throughput)", "",
        "Requests: what the client reports having sent / what the hop counted (kqp's kqp_requests_total, "
        "Kroxylicious' inbound messages; the relay counts none).", "",
        "| workload | path | round | records/s | MB/s | avg ms | p99 ms | hop CPU s/GB | hop CPU µs/request | "
        "requests |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    sizes = {w.name: w.record_size * w.records for w in workloads}
    for m in results:
        p = m.producer
        lines.append(f"| {m.workload} | {m.path} | {m.round} | {p.records_per_s:,.0f} | {p.mb_per_s:.1f} | "
                     f"{p.avg_latency_ms:.1f} | {p.p99_ms:.0f} | {_cost_cells(m.producer_cost, sizes[m.workload])} |")
    lines += ["", "### Consumer (ConsumerPerformance, same records)", "",
              "| workload | path | round | records/s | MB/s | hop CPU s/GB | hop CPU µs/request | requests |",
              "|---|---|---|---:|---:|---:|---:|---:|"]
    for m in results:
        c = m.consumer
        lines.append(f"| {m.workload} | {m.path} | {m.round} | {c.records_per_s:,.0f} | {c.mb_per_s:.1f} | "
                     f"{_cost_cells(m.consumer_cost, sizes[m.workload])} |")
    lines += _four_paths(workloads, results, paths)
    lines += ["", "### Against the issue 12 targets (medians over rounds)", "",
              "Targets (issue 12): kqp >= 95% of the bare relay on every workload, and >= 90% of direct "
              "wherever the relay itself reaches 90%.", "",
              "| workload | side | relay / direct | kqp / relay | kqp / direct | met? |",
              "|---|---|---:|---:|---:|---|"]
    for w in workloads:
        sides: list[tuple[str, Callable[[Measurement], float]]] = [
            ("producer", lambda m: m.producer.records_per_s), ("consumer", lambda m: m.consumer.records_per_s)]
        for side, pick in sides:
            medians = {path: _median([pick(m) for m in results if m.workload == w.name and m.path == path])
                       for path in (DIRECT, RELAY, PROXY)}
            relay_ratio = medians[RELAY] / medians[DIRECT]
            kqp_relay, kqp_direct = medians[PROXY] / medians[RELAY], medians[PROXY] / medians[DIRECT]
            met = kqp_relay >= 0.95 and (kqp_direct >= 0.90 or relay_ratio < 0.90)
            lines.append(f"| {w.name} | {side} | {relay_ratio:.0%} | {kqp_relay:.0%} | {kqp_direct:.0%} | "
                         f"{'yes' if met else 'no'} |")
    lines += _warm_up(workloads, warm_up or [], warm_up_seconds)
    lines += ["", "### At half the direct maximum: producer latency and raw round trips", "",
              "ApiVersions round trips on one socket through the path while the producer runs at half rate. "
              "Target: kqp adds <= 0.2 ms at p50 over direct.", "",
              "| workload | path | target records/s | achieved records/s | producer avg ms | producer p99 ms | "
              "round trip p50 ms | round trip p99 ms | added p50 ms |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for lm in latency:
        p = lm.producer
        direct = next(d for d in latency if d.workload == lm.workload and d.path == DIRECT)
        lines.append(f"| {lm.workload} | {lm.path} | {lm.target_records_per_s:,} | {p.records_per_s:,.0f} | "
                     f"{p.avg_latency_ms:.2f} | {p.p99_ms:.0f} | {lm.probe_p50_ms:.3f} | {lm.probe_p99_ms:.3f} | "
                     f"{lm.probe_p50_ms - direct.probe_p50_ms:+.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=1, help="Kafka nodes in the cluster")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5, help="runs of every path per workload")
    parser.add_argument("--batched-records", type=int, default=200_000, help="1 KB records per run")
    parser.add_argument("--unbatched-records", type=int, default=300_000, help="100-byte records per run")
    parser.add_argument("--half-rate-seconds", type=float, default=10.0, help="length of the half-rate runs (0: none)")
    parser.add_argument("--output", type=Path, default=REPO / "out" / "proxy_throughput.md")
    parser.add_argument("--proxy-config", type=Path, default=None,
                        help="a kqp config file for the proxy (e.g. to try proxy.socket_receive_buffer_bytes: -1)")
    parser.add_argument("--no-kroxylicious", dest="kroxylicious", action="store_false",
                        help=f"leave out the Kroxylicious {KROXYLICIOUS_VERSION} path (and its download)")
    parser.add_argument("--kroxylicious-warmup-seconds", type=float, default=180.0,
                        help="how long to push the workloads through Kroxylicious before the measured rounds")
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="a second `kqp serve` run from this source tree (e.g. an older commit, built), "
                             f"as the path {BASELINE!r}: two versions of kqp in the same rounds")
    parser.add_argument("--workloads", default="batched-1KB,unbatched-100B",
                        help="which workloads to run, comma-separated")
    parser.add_argument("--paths", default=",".join(PATHS),
                        help="which of the started paths to measure, comma-separated (a shorter run)")
    args = parser.parse_args(argv)

    every_workload = [
        Workload("batched-1KB", 1024, args.batched_records,
                 {"acks": "all", "batch.size": "65536", "linger.ms": "5"}),
        Workload("unbatched-100B", 100, args.unbatched_records, {"acks": "all", "linger.ms": "0"}),
    ]
    chosen = args.workloads.split(",")
    workloads = [w for w in every_workload if w.name in chosen]
    load_before = os.getloadavg()
    progress(f"starting a {args.nodes}-node Kafka cluster")
    results: list[Measurement] = []
    latency: list[LatencyMeasurement] = []
    warm_up: list[Measurement] = []
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(KafkaCluster(nodes=args.nodes, relay_listener=True))
        proxy_log = args.output.parent / "proxy_throughput-proxy.log"
        relay = BareRelay(cluster)
        stack.callback(relay.stop)
        kroxylicious = None
        if args.kroxylicious:
            progress(f"starting Kroxylicious {KROXYLICIOUS_VERSION} (its jars are fetched once into .cache)")
            kroxylicious = stack.enter_context(KroxyliciousProcess(
                cluster.bootstrap, list(cluster.nodes), args.output.parent / "proxy_throughput-kroxylicious"))
        proxy = stack.enter_context(ProxyProcess(cluster.bootstrap, proxy_log) if args.proxy_config is None
                                    else ConfiguredProxy(cluster.bootstrap, proxy_log, args.proxy_config))
        baseline = None
        if args.baseline_tree is not None:
            # The child imports kqp from the first entry of its PYTHONPATH, inherited at start.
            here = os.environ.get("PYTHONPATH")
            os.environ["PYTHONPATH"] = str(args.baseline_tree.resolve())
            try:
                baseline = stack.enter_context(ProxyProcess(
                    cluster.bootstrap, args.output.parent / "proxy_throughput-baseline.log"))
            finally:
                if here is None:
                    del os.environ["PYTHONPATH"]
                else:
                    os.environ["PYTHONPATH"] = here
            progress(f"baseline kqp from {args.baseline_tree} on {baseline.bootstrap} (pid {baseline.pid})")
        progress(f"proxy on {proxy.bootstrap} (pid {proxy.pid}), relay on {relay.bootstrap}, "
                 + (f"Kroxylicious on {kroxylicious.bootstrap} (pid {kroxylicious.pid}), " if kroxylicious else "")
                 + f"broker on {cluster.bootstrap}")
        for name, process in (("kqp", proxy), ("baseline kqp", baseline)):
            if process is not None:
                # Which build each `kqp serve` runs: the compiled one maps mypyc's shared library.
                compiled = "__mypyc" in Path(f"/proc/{process.pid}/maps").read_text()
                progress(f"{name} (pid {process.pid}) runs the {'compiled' if compiled else 'pure'} build")
        bench = Bench(cluster, proxy, relay, args.partitions, kroxylicious, baseline,
                      tuple(args.paths.split(",")))
        if kroxylicious is not None:
            progress(f"warming Kroxylicious for at least {args.kroxylicious_warmup_seconds:.0f} s")
            warm_up = bench.warm_kroxylicious(workloads, args.kroxylicious_warmup_seconds)
        paths = bench.paths
        for workload in workloads:
            for round_index in range(args.rounds):
                first = round_index % len(paths)
                order = [*paths[first:], *paths[:first]]
                for path in order:
                    progress(f"{workload.name} round {round_index + 1}/{args.rounds}: {path}, "
                             f"{workload.records:,} records")
                    m = bench.max_throughput(workload, path, round_index + 1)
                    results.append(m)
                    progress(f"  produce {m.producer.records_per_s:,.0f} rec/s {m.producer.mb_per_s:.1f} MB/s "
                             f"p99 {m.producer.p99_ms:.0f} ms; consume {m.consumer.records_per_s:,.0f} rec/s")
            if args.half_rate_seconds <= 0 or DIRECT not in paths:
                continue
            direct_max = _median([m.producer.records_per_s for m in results
                                  if m.workload == workload.name and m.path == DIRECT])
            half_rate = int(direct_max / 2)
            for path in paths:
                progress(f"{workload.name} at half rate ({half_rate:,} rec/s): {path}")
                lm = bench.at_rate(workload, path, half_rate, args.half_rate_seconds)
                latency.append(lm)
                progress(f"  avg {lm.producer.avg_latency_ms:.2f} ms, p99 {lm.producer.p99_ms:.0f} ms, "
                         f"round trip p50 {lm.probe_p50_ms:.3f} ms")
        del bench  # its admin client would keep reconnecting to the stopped broker
        exit_code = proxy.stop()
        progress(f"proxy exited with {exit_code}")
    text = report(workloads, results, latency, args.nodes, args.partitions, load_before, os.getloadavg(),
                  args.proxy_config, warm_up, args.kroxylicious_warmup_seconds)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)
    progress(f"report written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
