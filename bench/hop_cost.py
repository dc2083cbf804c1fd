"""What one producer request costs the hop in a running proxy: CPU, reads and writes per request.

    .venv/bin/python bench/hop_cost.py [--rounds 3] [--records 200000] [--record-size 1024]

Starts a one-node Kafka cluster, the bare relay (bench/bare_relay.py) and `kqp serve` with
its defaults, then runs Kafka's ProducerPerformance through the relay and through kqp in
turn (batch.size 64 KB, linger.ms 5, acks=all). For each run it reads the hop's CPU time from
/proc/<pid>/stat and its read and write system calls from /proc/<pid>/io, and kqp's request
count from its kqp_requests_total metric; the relay forwards the same requests, so its cost
per request is divided by kqp's count of the run beside it.

Where bench/request_cpu.py measures kqp's Python work alone (warm, and with caches evicted
between calls), this is the same work in place: if the reads per request match the relay's
and the CPU per request exceeds the relay's by the cold figure, the difference is the
interpreter starting each request with cold caches, not extra system calls or partial reads.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.proxy_throughput import PROXY, RELAY, BareRelay, Bench, proxy_requests
from harness import perf_tools
from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess


def syscalls(pid: int) -> tuple[int, int]:
    """(read, write) system calls of a process so far."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["syscr"]), int(fields["syscw"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--record-size", type=int, default=1024)
    args = parser.parse_args()
    props = {"acks": "all", "batch.size": "65536", "linger.ms": "5"}
    print("| round | path | records/s | MB/s | reads | writes | CPU s | requests | reads/request | CPU µs/request |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    with KafkaCluster(nodes=1, relay_listener=True) as cluster:
        relay = BareRelay(cluster)
        with ProxyProcess(cluster.bootstrap, Path("out") / "hop_cost-proxy.log") as proxy:
            bench = Bench(cluster, proxy, relay, partitions=3)
            for round_index in range(1, args.rounds + 1):
                runs = []
                hops = ((RELAY, relay.process.pid, relay.cpu_seconds), (PROXY, proxy.pid, proxy.cpu_seconds))
                for path, pid, cpu_seconds in hops:
                    topic = f"hop-cost-{path}-{round_index}-{os.getpid()}"
                    bench.create_topic(topic)
                    print(f"[{time.strftime('%H:%M:%S')}] round {round_index}: {path}", file=sys.stderr, flush=True)
                    before, cpu, counted = syscalls(pid), cpu_seconds(), proxy_requests(proxy)
                    result = perf_tools.producer_perf(cluster, bench.bootstrap(path), topic, args.records,
                                                      args.record_size, props)
                    reads, writes = (end - start for end, start in zip(syscalls(pid), before, strict=True))
                    runs.append((path, result, reads, writes, cpu_seconds() - cpu, proxy_requests(proxy) - counted))
                requests = runs[-1][-1]  # kqp's count; the relay forwarded as many of the same records
                for path, result, reads, writes, cpu, _ in runs:
                    print(f"| {round_index} | {path} | {result.records_per_s:,.0f} | {result.mb_per_s:.1f} | "
                          f"{reads:,} | {writes:,} | {cpu:.2f} | {requests:,} | {reads / requests:.2f} | "
                          f"{cpu / requests * 1e6:.0f} |", flush=True)
            del bench  # its admin client would keep reconnecting to the stopped broker
            proxy.stop()
        relay.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
