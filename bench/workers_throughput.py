"""`kqp serve --workers N` against `--workers 1` and the direct path: throughput and CPU per worker.

Several clients at once (one worker serves a connection for its life, so one client would only
ever use one worker): P ProducerPerformance processes write 1 KB records in batches to one
topic, then P ConsumerPerformance processes read them back (a topic per client), through each path in alternating
rounds. The aggregate MB/s is the payload over the wall time of the slowest client; the CPU
of each proxy process comes from /proc.

    .venv/bin/python -m bench.workers_throughput --workers 2 --clients 4 --rounds 3

Prints a Markdown table; docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from harness import perf_tools
from harness.local_kafka import REPO, KafkaCluster
from harness.proxy_process import ProxyProcess, process_cpu_seconds

RECORD_SIZE = 1024
PRODUCER_PROPS = {"acks": "all", "batch.size": "65536", "linger.ms": "5"}


@dataclass(frozen=True)
class Run:
    path: str
    round_index: int
    produce_mb_per_s: float
    consume_mb_per_s: float
    # CPU seconds per proxy process over the run (the supervisor first), per GB moved.
    cpu_s_per_gb: tuple[float, ...]


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_all(commands: list[list[str]]) -> float:
    """Start every command at once; wall seconds until the last one exits."""
    started = time.monotonic()
    processes = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]
    for process in processes:
        out, err = process.communicate(timeout=900)
        if process.returncode != 0:
            raise RuntimeError(f"a client failed ({process.returncode}):\n{out[-2000:]}\n{err[-2000:]}")
    return time.monotonic() - started


def one_round(cluster: KafkaCluster, path: str, bootstrap: str, proxy: ProxyProcess | None, clients: int,
              records: int, round_index: int) -> Run:
    # A topic per client: each producer writes its own, each consumer reads one back.
    topics = [f"workers-{path}-{round_index}-{i}-{os.getpid()}" for i in range(clients)]
    for topic in topics:
        cluster.create_topic(topic, partitions=3, replication=1)
    pids = proxy.pids() if proxy is not None else []
    cpu_before = [process_cpu_seconds(pid) for pid in pids]
    produce_s = run_all([perf_tools.producer_perf_command(cluster, bootstrap, topic, records, RECORD_SIZE,
                                                          PRODUCER_PROPS) for topic in topics])
    consume_s = run_all([perf_tools.consumer_perf_command(cluster, bootstrap, topic, records, group=f"{topic}-g")
                         for topic in topics])
    gb = 2 * clients * records * RECORD_SIZE / 1e9  # written once, read once
    cpu = tuple((process_cpu_seconds(pid) - before) / gb for pid, before in zip(pids, cpu_before, strict=True))
    mb = clients * records * RECORD_SIZE / 1e6
    return Run(path, round_index, mb / produce_s, mb / consume_s, cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clients", type=int, default=4, help="producers at once")
    parser.add_argument("--records", type=int, default=100_000, help="1 KB records per producer")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    runs: list[Run] = []
    out = REPO / "out"
    out.mkdir(exist_ok=True)
    load_before = os.getloadavg()
    with KafkaCluster(nodes=1) as cluster:
        one = ProxyProcess(cluster.bootstrap, out / "workers-1.log").start()
        many = ProxyProcess(cluster.bootstrap, out / f"workers-{args.workers}.log", workers=args.workers).start()
        paths: list[tuple[str, str, ProxyProcess | None]] = [
            ("direct", cluster.bootstrap, None), ("workers-1", one.bootstrap, one),
            (f"workers-{args.workers}", many.bootstrap, many),
        ]
        try:
            for round_index in range(args.rounds):
                order = paths[round_index % 3:] + paths[:round_index % 3]
                for name, bootstrap, proxy in order:
                    progress(f"round {round_index + 1}/{args.rounds}: {name}")
                    run = one_round(cluster, name, bootstrap, proxy, args.clients, args.records, round_index)
                    progress(f"  produce {run.produce_mb_per_s:.1f} MB/s, consume {run.consume_mb_per_s:.1f} MB/s, "
                             f"CPU s/GB per process {[round(c, 2) for c in run.cpu_s_per_gb]}")
                    runs.append(run)
        finally:
            one.stop()
            many.stop()
    print(f"{args.clients} producers x {args.records:,} records of {RECORD_SIZE} B, then {args.clients} consumers; "
          f"medians of {args.rounds} rounds; {os.cpu_count()} cores, load {load_before[0]:.2f} before\n")
    print("| path | produce MB/s | x direct | consume MB/s | x direct | proxy CPU s/GB, per process |")
    print("|---|---:|---:|---:|---:|---|")
    direct = [r for r in runs if r.path == "direct"]
    direct_p = statistics.median(r.produce_mb_per_s for r in direct)
    direct_c = statistics.median(r.consume_mb_per_s for r in direct)
    for name, _bootstrap, _proxy in paths:
        mine = [r for r in runs if r.path == name]
        produce = statistics.median(r.produce_mb_per_s for r in mine)
        consume = statistics.median(r.consume_mb_per_s for r in mine)
        cpu = [statistics.median(r.cpu_s_per_gb[i] for r in mine) for i in range(len(mine[0].cpu_s_per_gb))]
        print(f"| {name} | {produce:.1f} | {produce / direct_p:.2f} | {consume:.1f} | {consume / direct_c:.2f} "
              f"| {', '.join(f'{c:.2f}' for c in cpu) or '-'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
