"""Capture overhead benchmark: the batched produce workload through `kqp serve` with capture
off and with capture on, alternating, in one run on one cluster.

    .venv/bin/python bench/capture_overhead.py [--rounds 4] [--records 300000] [--output out/capture_overhead.md]

Two proxies run side by side in front of the same 1-node Kafka, identical but for
`--capture-dir` on one. Each round runs Kafka's ProducerPerformance (1 KB records,
batch.size 64 KB, linger.ms 5, acks=all, max throughput) through one proxy and then the
other, swapping the order every round so warm-up and page-cache effects do not favour one
side. The proxy's CPU time per run comes from /proc/<pid>/stat. After the runs both proxies
get SIGTERM; the capture's files, rows and dropped records are read back, so the report says
whether capture kept up (coverage) as well as what it cost.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow.parquet as pq

from harness import perf_tools
from harness.local_kafka import REPO, KafkaCluster, KafkaHarnessError
from harness.proxy_process import ProxyProcess
from kqp.capture.schema import META_RECORDS_DROPPED, META_RECORDS_WRITTEN

OFF = "capture off"
ON = "capture on"
RECORD_SIZE = 1024
PRODUCER_PROPS = {"acks": "all", "linger.ms": "5", "batch.size": "65536"}
TARGET_LOSS = 0.05


class CapturingProxy(ProxyProcess):
    def __init__(self, upstream: str, log_path: Path, capture_dir: Path) -> None:
        super().__init__(upstream, log_path)
        self.capture_dir = capture_dir

    def command(self) -> list[str]:
        return [*super().command(), "--capture-dir", str(self.capture_dir)]


@dataclass(frozen=True)
class Run:
    mode: str
    round: int
    producer: perf_tools.ProducerResult
    proxy_cpu_s: float


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def produce(cluster: KafkaCluster, proxy: ProxyProcess, mode: str, round_index: int, records: int) -> Run:
    topic = f"capture-bench-{mode.replace(' ', '-')}-{round_index}-{os.getpid()}"
    cluster.create_topic(topic, partitions=3, replication=1)
    cpu_before = proxy.cpu_seconds()
    result = perf_tools.producer_perf(cluster, proxy.bootstrap, topic, records, RECORD_SIZE, props=PRODUCER_PROPS)
    run = Run(mode, round_index, result, proxy.cpu_seconds() - cpu_before)
    progress(f"round {round_index} {mode}: {result.mb_per_s:.1f} MB/s, p99 {result.p99_ms:.0f} ms, "
             f"proxy CPU {run.proxy_cpu_s:.2f} s")
    return run


@dataclass(frozen=True)
class CaptureTotals:
    files: int
    rows: int
    dropped: int
    bytes_on_disk: int


def capture_totals(directory: Path) -> CaptureTotals:
    files = sorted(directory.rglob("*.parquet"))
    footers = [pq.read_metadata(path).metadata for path in files]
    return CaptureTotals(
        files=len(files),
        rows=sum(int(f[META_RECORDS_WRITTEN]) for f in footers),
        dropped=sum(int(f[META_RECORDS_DROPPED]) for f in footers),
        bytes_on_disk=sum(path.stat().st_size for path in files),
    )


def report(runs: list[Run], totals: CaptureTotals, records: int, command: str, load: tuple[str, str],
           wall_s: float) -> str:
    def median(mode: str, value: str) -> float:
        return statistics.median(getattr(r.producer, value) if value != "cpu" else r.proxy_cpu_s
                                 for r in runs if r.mode == mode)

    off_mb, on_mb = median(OFF, "mb_per_s"), median(ON, "mb_per_s")
    loss = 1 - on_mb / off_mb
    gb = records * RECORD_SIZE / 1e9
    lines = [
        "```bash", command, "```", "",
        f"Load average before/after: {load[0]} and {load[1]}. Wall time {wall_s / 60:.1f} min.", "",
        "| round | mode | MB/s | records/s | avg latency ms | p99 ms | proxy CPU s per GB |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        p = r.producer
        lines.append(f"| {r.round} | {r.mode} | {p.mb_per_s:.1f} | {p.records_per_s:.0f} | {p.avg_latency_ms:.1f} | "
                     f"{p.p99_ms:.0f} | {r.proxy_cpu_s / gb:.1f} |")
    verdict = "met" if loss < TARGET_LOSS else "not met"
    lines += [
        "",
        f"Median throughput: {off_mb:.1f} MB/s with capture off, {on_mb:.1f} MB/s with capture on: "
        f"**{loss * 100:+.1f} % throughput loss** (target < {TARGET_LOSS * 100:.0f} %: {verdict}).",
        f"Median proxy CPU per GB produced: {median(OFF, 'cpu') / gb:.1f} s off, {median(ON, 'cpu') / gb:.1f} s on.",
        f"Capture: {totals.rows} rows in {totals.files} files, {totals.bytes_on_disk / 1e6:.2f} MB on disk, "
        f"{totals.dropped} records dropped.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=4, help="off/on pairs")
    parser.add_argument("--records", type=int, default=300_000, help="1 KB records per run")
    parser.add_argument("--output", type=Path, default=REPO / "out" / "capture_overhead.md")
    parser.add_argument("--workdir", type=Path, default=REPO / "out" / "capture_overhead")
    args = parser.parse_args(argv)
    command = " ".join(["bench/capture_overhead.py", *(argv if argv is not None else sys.argv[1:])])
    started = time.monotonic()
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    capture_dir = args.workdir / f"capture-{os.getpid()}"
    runs: list[Run] = []
    with KafkaCluster(nodes=1) as cluster:
        plain = ProxyProcess(cluster.bootstrap, args.workdir / "proxy-off.log").start()
        capturing = CapturingProxy(cluster.bootstrap, args.workdir / "proxy-on.log", capture_dir).start()
        try:
            proxies = {OFF: plain, ON: capturing}
            for round_index in range(1, args.rounds + 1):
                order = [OFF, ON] if round_index % 2 else [ON, OFF]
                for mode in order:
                    runs.append(produce(cluster, proxies[mode], mode, round_index, args.records))
        finally:
            codes = [plain.stop(), capturing.stop()]
        if codes != [0, 0]:
            raise KafkaHarnessError(f"a proxy did not exit cleanly on SIGTERM: {codes}")
    totals = capture_totals(capture_dir)
    load_after = " ".join(f"{x:.1f}" for x in os.getloadavg())
    text = report(runs, totals, args.records, f".venv/bin/python {command}", (load_before, load_after),
                  time.monotonic() - started)
    text = f"Machine: {os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}\n\n" + text
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
