"""What one producer request costs the hop in a running proxy: CPU, reads and writes per request.

    .venv/bin/python bench/hop_cost.py [--rounds 3] [--records 200000] [--record-size 1024]
        [--linger-ms 5] [--batch-size 65536] [--perf-record DIR]

Starts a one-node Kafka cluster, the bare relay (bench/bare_relay.py) and `kqp serve` with
its defaults, then runs Kafka's ProducerPerformance through the relay and through kqp in
turn (batch.size 64 KB, linger.ms 5, acks=all). For each run it reads the hop's CPU time from
/proc/<pid>/stat and its read and write system calls from /proc/<pid>/io, and kqp's request
count from its kqp_requests_total metric (a check that the traffic went through it: 0 in the
relay's rows). Costs per request divide by the requests the producer itself reports having
sent (its request-total metric), as bench/proxy_throughput.py does: with linger.ms 0 a slower
hop gets fewer, fuller requests for the same records.

Where bench/request_cpu.py measures kqp's Python work alone (warm, and with caches evicted
between calls), this is the same work in place: if the reads per request match the relay's
and the CPU per request exceeds the relay's by the cold figure, the difference is the
interpreter starting each request with cold caches, not extra system calls or partial reads.

Each row also splits the hop's CPU into user and system time and counts its context switches
per request (voluntary: it slept in epoll waiting for bytes, i.e. wake-ups; involuntary: it was
preempted). `--perf-record DIR` attaches `perf record -g -e cpu-clock` to the hop for each of
its runs (the kernel's side too, where perf_event_paranoid lets the user sample it) and writes
DIR/<path>-<round>.data and a flat report beside it (.txt, by shared object, then by symbol):
the compiled modules' functions have C symbols (CPyDef_...), interpreted Python shows as
libpython's evaluator. The unbatched workload of bench/proxy_throughput.py is
`--record-size 100 --linger-ms 0 --batch-size 16384`.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
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


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def context_switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of a process so far, over its threads."""
    voluntary = involuntary = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
        voluntary += int(status["voluntary_ctxt_switches"])
        involuntary += int(status["nonvoluntary_ctxt_switches"])
    return voluntary, involuntary


def start_perf(pid: int, output: Path) -> subprocess.Popen[bytes]:
    output.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(["perf", "record", "-q", "-g", "-F", "997", "-e", "cpu-clock", "-p", str(pid),
                             "-o", str(output)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_perf(recorder: subprocess.Popen[bytes], output: Path) -> None:
    recorder.send_signal(signal.SIGINT)
    recorder.wait(60)
    with output.with_suffix(".txt").open("w") as report:
        for sort in ("dso", "dso,sym"):
            report.flush()
            subprocess.run(["perf", "report", "-i", str(output), "--no-children", "--stdio", "--sort", sort,
                            "-g", "none", "--percent-limit", "0.3"], stdout=report, stderr=subprocess.DEVNULL,
                           check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=65536)
    parser.add_argument("--perf-record", type=Path, default=None, metavar="DIR",
                        help="perf record -g each hop's runs into DIR")
    args = parser.parse_args()
    props = {"acks": "all", "batch.size": str(args.batch_size), "linger.ms": str(args.linger_ms)}
    print("| round | path | records/s | MB/s | reads | writes | CPU s | user s | system s | requests "
          "| kqp counted | reads/request | wake-ups/request | preempted/request | CPU µs/request |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
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
                    recording = args.perf_record / f"{path}-{round_index}.data" if args.perf_record else None
                    recorder = start_perf(pid, recording) if recording is not None else None
                    before, cpu, counted = syscalls(pid), cpu_seconds(), proxy_requests(proxy)
                    split, switches = cpu_split(pid), context_switches(pid)
                    result = perf_tools.producer_perf(cluster, bench.bootstrap(path), topic, args.records,
                                                      args.record_size, props, print_metrics=True)
                    reads, writes = (end - start for end, start in zip(syscalls(pid), before, strict=True))
                    user, system = (end - start for end, start in zip(cpu_split(pid), split, strict=True))
                    woken, preempted = (end - start for end, start in zip(context_switches(pid), switches,
                                                                          strict=True))
                    runs.append((path, result, reads, writes, cpu_seconds() - cpu, user, system, woken, preempted,
                                 perf_tools.client_requests(result.output), proxy_requests(proxy) - counted))
                    if recorder is not None and recording is not None:
                        stop_perf(recorder, recording)
                for path, result, reads, writes, cpu, user, system, woken, preempted, requests, kqp_counted in runs:
                    print(f"| {round_index} | {path} | {result.records_per_s:,.0f} | {result.mb_per_s:.1f} | "
                          f"{reads:,} | {writes:,} | {cpu:.2f} | {user:.2f} | {system:.2f} | {requests:,} | "
                          f"{kqp_counted:,} | "
                          f"{reads / requests:.2f} | {woken / requests:.2f} | {preempted / requests:.2f} | "
                          f"{cpu / requests * 1e6:.0f} |", flush=True)
            del bench  # its admin client would keep reconnecting to the stopped broker
            proxy.stop()
        relay.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
