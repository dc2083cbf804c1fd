"""Quota accuracy: how closely kqp holds producers to `producer_byte_rate`, beside the broker.

    .venv/bin/python bench/quota_accuracy.py [--seconds 120] [--runs 3] [--scenario single|cluster|all]
    .venv/bin/python bench/quota_accuracy.py --scenario shapes [--seconds 90] [--warmup 25] \
        [--shapes ten-producers,fleet,workers,cluster-one,kip599] [--kqp-set key=value ...] [--busy N]
    .venv/bin/python bench/quota_accuracy.py --scenario shapes --shapes workers-n [--busy 2]

`shapes` (issue 25, acceptance 4): every client shape of the issue through kqp, beside Kafka's
own broker enforcing the same quota for the same clients, with each producer's share and the
clients' request time-outs; see bench/quota_shapes.py. `--kqp-set` applies a setting to every
kqp config it writes, to measure a setting without editing the bench. `workers-n` (opt-in,
issue 33) runs the `workers` shape through --workers 1, 2 and 4 and Kafka's broker; `--busy N`
keeps N processes spinning on the CPU through every measurement, a host doing other work.

`single` (issue 11, acceptance 5): one broker; a confluent-kafka (librdkafka) producer offers
3x the quota for --seconds, once through `kqp serve` holding client-id `limited` to the quota,
then straight to the broker holding client-id `broker-limited` to the same quota (set with
kafka-configs), --runs times. librdkafka ignores ThrottleTimeMs, so only the mute holds it.

`cluster` (acceptance 4): three brokers, one proxy with `scope: cluster` (one budget across
the brokers), a 6-partition topic; a confluent-kafka producer and then Kafka's Java producer
(ProducerPerformance --throughput) each offer 1.5x the quota. A broker quota cannot do this
(each broker sees a third of the traffic), so there is no broker figure beside it.

The acknowledged rate is measured from delivery reports (librdkafka) and from
ProducerPerformance's 5 s reports (Java) after --warmup seconds. A client held by muting
alone moves in cycles (a burst when the mute ends, then nothing), so the librdkafka figure is
also given over whole cycles: from the first burst after the warm-up to the start of the last
burst. Prints a markdown report on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import itertools
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer

from bench.quota_shapes import DEFAULT_SHAPES, SHAPES, parse_overrides, run_shapes, shapes_report
from bench.soak import ConfiguredProxy
from harness import perf_tools
from harness.local_kafka import KafkaCluster

QUOTA = 1024 * 1024  # bytes/s
RECORD_SIZE = 1024
_JAVA_WINDOW = re.compile(r"^(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\)", re.M)


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def quota_config(path: Path, scope: str) -> Path:
    path.write_text(
        "quotas:\n"
        f"  scope: {scope}\n"
        "  entries:\n"
        "    - entity: {client-id: limited}\n"
        f"      producer_byte_rate: {QUOTA}\n"
    )
    return path


@dataclass(frozen=True)
class Measurement:
    label: str
    per_second: list[int]  # bytes acknowledged in each second of the run
    warmup_s: int
    cycles: float | None  # bytes/s over whole throttling cycles (librdkafka only)

    @property
    def steady(self) -> float:
        """Bytes/s acknowledged from the warm-up to the end."""
        steady_part = self.per_second[self.warmup_s:]
        return sum(steady_part) / len(steady_part)

    @property
    def slope(self) -> float:
        """Least-squares slope of the cumulative bytes acknowledged after the warm-up.

        A client held by muting alone moves in cycles of about the quota window, so a plain
        average over the steady state is off by up to one burst depending on where the run
        ends; the slope of the cumulative curve is not."""
        steady_part = self.per_second[self.warmup_s:]
        cumulative = list(itertools.accumulate(steady_part))
        return statistics.linear_regression(range(len(cumulative)), cumulative).slope


def cycle_rate(per_second: list[int], warmup_s: int) -> float | None:
    """Bytes/s from the first burst after the warm-up to the start of the last burst."""
    bursts = [i for i, size in enumerate(per_second) if i >= warmup_s and size > 2 * QUOTA]
    if len(bursts) < 2:
        return None
    first, last = bursts[0], bursts[-1]
    return sum(per_second[first:last]) / (last - first)


def librdkafka_offer(bootstrap: str, topic: str, client_id: str, offered: float, seconds: float,
                     warmup_s: int, label: str) -> Measurement:
    """Offer `offered` bytes/s for `seconds`; count what is acknowledged, second by second."""
    per_second = [0] * (int(seconds) + 1)
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 5,
                         "message.timeout.ms": int(seconds * 1000) + 60_000})
    payload = b"x" * RECORD_SIZE
    start = time.monotonic()

    def on_delivery(error: object, _message: object) -> None:
        second = int(time.monotonic() - start)
        if error is None and second < len(per_second):
            per_second[second] += RECORD_SIZE

    sent = 0
    next_report = start + 10
    while (now := time.monotonic()) < start + seconds:
        due = int(offered * (now - start)) - sent
        while due >= RECORD_SIZE:
            try:
                producer.produce(topic, payload, on_delivery=on_delivery)
            except BufferError:
                break  # librdkafka's queue is full: the offer waits, as an application's would
            sent += RECORD_SIZE
            due -= RECORD_SIZE
        producer.poll(0.005)
        if now >= next_report:
            done = int(now - start)
            progress(f"  {label}: {done} s, {sum(per_second[:done]) / max(done, 1) / QUOTA:.2f} x quota so far")
            next_report += 10
    producer.purge()  # the backlog left at the end is not part of the measurement
    producer.flush(30)
    per_second = per_second[:int(seconds)]
    return Measurement(label, per_second, warmup_s, cycle_rate(per_second, warmup_s))


def java_offer(cluster: KafkaCluster, bootstrap: str, topic: str, client_id: str, offered: float,
               seconds: float, warmup_s: int, label: str) -> Measurement:
    records = int(offered * seconds / RECORD_SIZE)
    props = {"client.id": client_id, "acks": "all", "linger.ms": "5", "batch.size": "65536"}
    command = perf_tools.producer_perf_command(cluster, bootstrap, topic, records, RECORD_SIZE, props=props,
                                               throughput=int(offered / RECORD_SIZE))
    progress(f"  {label}: ProducerPerformance, {records} records at {offered / QUOTA:.1f} x quota")
    result = subprocess.run(command, capture_output=True, text=True, timeout=seconds * 3 + 120, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"ProducerPerformance failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    windows = [float(m[2]) * RECORD_SIZE for m in _JAVA_WINDOW.finditer(result.stdout) if "th," not in m.group(0)]
    if len(windows) * 5 <= warmup_s + 10:
        raise RuntimeError(f"too few 5 s reports after the warm-up in:\n{result.stdout[-2000:]}")
    per_second = [int(w) for w in windows for _ in range(5)]
    return Measurement(label, per_second, warmup_s, None)


def broker_quota(cluster: KafkaCluster, client_id: str, rate: int | None) -> None:
    change = ["--add-config", f"producer_byte_rate={rate}"] if rate else ["--delete-config", "producer_byte_rate"]
    cluster.run_tool("kafka.admin.ConfigCommand", "--bootstrap-server", cluster.bootstrap, "--alter", *change,
                     "--entity-type", "clients", "--entity-name", client_id)


def single(workdir: Path, seconds: float, runs: int, warmup_s: int) -> list[Measurement]:
    results: list[Measurement] = []
    with KafkaCluster(nodes=1, workdir=workdir / "kafka-1") as cluster:
        cluster.create_topic("accuracy", partitions=1, replication=1)
        config = quota_config(workdir / "single.yaml", "broker")
        broker_quota(cluster, "broker-limited", QUOTA)
        with ConfiguredProxy(cluster.bootstrap, workdir / "proxy-single.log", config) as proxy:
            for run in range(1, runs + 1):
                for label, bootstrap, client_id in (("kqp", proxy.bootstrap, "limited"),
                                                    ("broker", cluster.bootstrap, "broker-limited")):
                    progress(f"single, run {run}/{runs}: librdkafka offering 3x quota through {label}")
                    results.append(librdkafka_offer(bootstrap, "accuracy", client_id, 3 * QUOTA, seconds, warmup_s,
                                                    f"run {run}, {label}"))
    return results


def cluster_scope(workdir: Path, seconds: float, warmup_s: int) -> list[Measurement]:
    results: list[Measurement] = []
    with KafkaCluster(nodes=3, workdir=workdir / "kafka-3") as cluster:
        cluster.create_topic("accuracy-6", partitions=6, replication=1)
        config = quota_config(workdir / "cluster.yaml", "cluster")
        with ConfiguredProxy(cluster.bootstrap, workdir / "proxy-cluster.log", config) as proxy:
            progress("cluster scope: librdkafka offering 1.5x quota over 3 brokers")
            results.append(librdkafka_offer(proxy.bootstrap, "accuracy-6", "limited", 1.5 * QUOTA, seconds, warmup_s,
                                            "librdkafka, scope: cluster"))
            progress("cluster scope: Java producer offering 1.5x quota over 3 brokers")
            results.append(java_offer(cluster, proxy.bootstrap, "accuracy-6", "limited", 1.5 * QUOTA, seconds,
                                      warmup_s, "Java producer, scope: cluster"))
    return results


def report(results: list[Measurement], seconds: float, warmup_s: int) -> str:
    lines = [
        f"Machine: {platform.node()}, {platform.processor() or platform.machine()}; "
        f"{seconds:.0f} s per measurement, steady state after {warmup_s} s; quota {QUOTA} B/s.",
        "",
        "| measurement | slope after warm-up (x quota) | mean after warm-up | over whole cycles |",
        "|---|---|---|---|",
    ]
    for m in results:
        cycles = f"{m.cycles / QUOTA:.3f}" if m.cycles is not None else "-"
        lines.append(f"| {m.label} | {m.slope / QUOTA:.3f} | {m.steady / QUOTA:.3f} | {cycles} |")
    lines += ["", "Per-second acknowledged bytes (x quota):", ""]
    for m in results:
        lines.append(f"- {m.label}: {[round(b / QUOTA, 1) for b in m.per_second]}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=None,
                        help="seconds per measurement (default 120; 90 for --scenario shapes)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=25, help="seconds left out at the start (default 25)")
    parser.add_argument("--scenario", choices=("single", "cluster", "all", "shapes"), default="all")
    parser.add_argument("--shapes", default=",".join(DEFAULT_SHAPES),
                        help=f"with --scenario shapes: which, comma-separated, of {','.join(SHAPES)} "
                             f"(default {','.join(DEFAULT_SHAPES)})")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="with --scenario shapes: N processes spinning on the CPU through every measurement")
    parser.add_argument("--kqp-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a dotted kqp config key set in every kqp config the shapes write (repeatable)")
    args = parser.parse_args()
    if args.scenario == "shapes":
        selected = [name for name in args.shapes.split(",") if name]
        unknown = set(selected) - set(SHAPES)
        if unknown:
            parser.error(f"unknown shapes {sorted(unknown)}; known: {', '.join(SHAPES)}")
        seconds = args.seconds if args.seconds is not None else 90.0
        overrides = parse_overrides(args.kqp_set)
        with tempfile.TemporaryDirectory(prefix="kqp-shapes-") as tmp:
            shape_results = run_shapes(Path(tmp), selected, overrides, seconds, args.warmup, args.busy)
        print(shapes_report(shape_results, seconds, args.warmup, overrides))
        if args.busy:
            print(f"\n{args.busy} busy CPU loops ran through every measurement.")
        return
    seconds = args.seconds if args.seconds is not None else 120.0
    results: list[Measurement] = []
    with tempfile.TemporaryDirectory(prefix="kqp-accuracy-") as tmp:
        workdir = Path(tmp)
        if args.scenario in ("single", "all"):
            results += single(workdir, seconds, args.runs, args.warmup)
        if args.scenario in ("cluster", "all"):
            results += cluster_scope(workdir, seconds, args.warmup)
    print(report(results, seconds, args.warmup))


if __name__ == "__main__":
    main()
