"""Many idle client connections through one proxy: memory per connection, and what they do to the
latency of the clients that are active.

    .venv/bin/python bench/connections_load.py [--connections 10000] [--rounds 3]

Starts a 1-node Kafka cluster and one `kqp serve` in front of it (file-descriptor limits raised
first: each proxied connection holds two descriptors in the proxy, its client's and its
upstream's). Each round:

1. baseline: a probe process measures active-client latency with no idle connections —
   raw ApiVersions round trips on one socket, and confluent-kafka produce-and-wait-for-ack
   (acks=1) round trips — both through the proxy;
2. opens the idle connections (each does one ApiVersions round trip through the proxy, so
   its upstream connection is up, then stays open, silent) and samples the proxy's RSS and
   open descriptors;
3. runs the same probe again with the idle connections open;
4. closes them and waits for the proxy to release their descriptors.

Memory per connection is the proxy's RSS growth over the idle connections divided by their
number (round 1 is the honest figure: later rounds reuse memory the allocator kept). Prints
progress on stderr and a markdown report on stdout (also written to --output).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.local_kafka import REPO, KafkaCluster, recv_exact
from harness.proxy_process import ProxyProcess

_API_VERSIONS_V0 = 18, 0


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's RLIMIT_NOFILE (children inherit it); root may raise the hard limit too."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = max(soft, wanted)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, max(hard, target)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_soft_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise RuntimeError(f"no open-files limit for {pid}")


def api_versions_frame(correlation_id: int) -> bytes:
    client_id = b"kqp-load"
    body = struct.pack(">hhih", *_API_VERSIONS_V0, correlation_id, len(client_id)) + client_id
    return struct.pack(">i", len(body)) + body


# ---- idle connections (this process) ------------------------------------------------------


async def _open_one(port: int, index: int, limit: asyncio.Semaphore) -> asyncio.StreamWriter:
    async with limit:
        for attempt in range(5):
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(api_versions_frame(index))
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                answer = await reader.readexactly(size)
                if struct.unpack(">i", answer[:4])[0] != index:
                    raise RuntimeError(f"connection {index}: wrong correlation id")
                return writer
            except (OSError, asyncio.IncompleteReadError):
                if attempt == 4:
                    raise
                await asyncio.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


async def open_idle(port: int, count: int, concurrency: int) -> list[asyncio.StreamWriter]:
    limit = asyncio.Semaphore(concurrency)
    return list(await asyncio.gather(*(_open_one(port, i, limit) for i in range(count))))


async def close_idle(writers: list[asyncio.StreamWriter]) -> None:
    for writer in writers:
        writer.close()
    await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)


# ---- the probe (a separate process, so the idle sockets' owner does not share its CPU) -------


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def summary(samples_ms: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(samples_ms), "p99": percentile(samples_ms, 0.99),
            "mean": statistics.fmean(samples_ms), "n": len(samples_ms)}


def probe(bootstrap: str, topic: str, api_rounds: int, produce_rounds: int) -> dict[str, dict[str, float]]:
    from confluent_kafka import Producer

    host, port = bootstrap.rsplit(":", 1)
    api_ms: list[float] = []
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(api_rounds):
            started = time.perf_counter()
            sock.sendall(api_versions_frame(i))
            size = struct.unpack(">i", recv_exact(sock, 4))[0]
            recv_exact(sock, size)
            api_ms.append((time.perf_counter() - started) * 1000)
    if not produce_rounds:
        return {"api_versions": summary(api_ms[50:])}
    producer = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 0})
    produce_ms: list[float] = []
    payload = b"x" * 100
    for i in range(produce_rounds + 50):
        started = time.perf_counter()
        producer.produce(topic, payload)
        if producer.flush(10) != 0:
            raise RuntimeError("probe record not acknowledged within 10 s")
        if i >= 50:  # the first ones include metadata and connection set-up
            produce_ms.append((time.perf_counter() - started) * 1000)
    return {"api_versions": summary(api_ms[50:]), "produce": summary(produce_ms)}


def run_probe(bootstrap: str, topic: str, api_rounds: int, produce_rounds: int) -> dict[str, dict[str, float]]:
    command = [sys.executable, __file__, "--probe", bootstrap, "--topic", topic,
               "--api-rounds", str(api_rounds), "--produce-rounds", str(produce_rounds)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
    figures: dict[str, dict[str, float]] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


# ---- the benchmark ------------------------------------------------------------------------


@dataclass
class Round:
    index: int
    rss_before_kb: int
    rss_idle_kb: int
    fds_before: int
    fds_idle: int
    open_seconds: float
    baseline: dict[str, dict[str, float]]
    loaded: dict[str, dict[str, float]]


def wait_for(condition: object, timeout_s: float, what: str) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


def one_round(index: int, proxy: ProxyProcess, topic: str, args: argparse.Namespace) -> Round:
    progress(f"round {index}: baseline probe, no idle connections")
    baseline = run_probe(proxy.bootstrap, topic, args.api_rounds, args.produce_rounds)
    rss_before, fds_before = rss_kb(proxy.pid), open_fds(proxy.pid)
    progress(f"round {index}: opening {args.connections} idle connections")
    loop = asyncio.new_event_loop()
    started = time.monotonic()
    writers = loop.run_until_complete(open_idle(proxy.bootstrap_port, args.connections, args.concurrency))
    open_seconds = time.monotonic() - started
    time.sleep(2)  # let the proxy finish any bookkeeping of the last ones
    rss_idle, fds_idle = rss_kb(proxy.pid), open_fds(proxy.pid)
    progress(f"round {index}: {len(writers)} open in {open_seconds:.1f} s; proxy RSS {rss_before} -> {rss_idle} KB, "
             f"fds {fds_before} -> {fds_idle}; probing with them open")
    loaded = run_probe(proxy.bootstrap, topic, args.api_rounds, args.produce_rounds)
    loop.run_until_complete(close_idle(writers))
    loop.close()
    wait_for(lambda: open_fds(proxy.pid) < fds_before + 50, 120, "the proxy to release the idle connections")
    progress(f"round {index}: closed; proxy RSS now {rss_kb(proxy.pid)} KB")
    return Round(index, rss_before, rss_idle, fds_before, fds_idle, open_seconds, baseline, loaded)


def report(rounds: list[Round], connections: int, proxy_fd_limit: int) -> str:
    lines = [
        f"Idle connections per round: {connections:,}; proxy open-files limit {proxy_fd_limit:,}.",
        "",
        "| round | proxy RSS before (MB) | with idle (MB) | KB per connection | proxy fds before | with idle | "
        "seconds to open |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rounds:
        per_connection = (r.rss_idle_kb - r.rss_before_kb) / connections
        lines.append(f"| {r.index} | {r.rss_before_kb / 1024:.1f} | {r.rss_idle_kb / 1024:.1f} "
                     f"| {per_connection:.1f} | "
                     f"{r.fds_before} | {r.fds_idle} | {r.open_seconds:.1f} |")
    lines += [
        "",
        "| round | probe | p50 ms no idle | p50 ms with idle | change | p99 ms no idle | p99 ms with idle | change |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rounds:
        for name in ("api_versions", "produce"):
            base, loaded = r.baseline[name], r.loaded[name]
            lines.append(
                f"| {r.index} | {name} | {base['p50']:.3f} | {loaded['p50']:.3f} | "
                f"{(loaded['p50'] / base['p50'] - 1) * 100:+.1f} % | {base['p99']:.3f} | {loaded['p99']:.3f} | "
                f"{(loaded['p99'] / base['p99'] - 1) * 100:+.1f} % |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=200, help="idle connections being opened at once")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--api-rounds", type=int, default=20_000, help="ApiVersions round trips per probe")
    parser.add_argument("--produce-rounds", type=int, default=5000, help="produce-and-ack round trips per probe")
    parser.add_argument("--output", type=Path, default=REPO / "out" / "connections_load.md")
    parser.add_argument("--probe", metavar="BOOTSTRAP", help=argparse.SUPPRESS)
    parser.add_argument("--topic", default="load-probe", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(args.probe, args.topic, args.api_rounds, args.produce_rounds)))
        return 0

    # Two descriptors per connection in the proxy, one per connection here and in the broker.
    limit = raise_fd_limit(2 * args.connections + 4096)
    progress(f"open-files limit raised to {limit}")
    with KafkaCluster(nodes=1, heap="1g") as cluster:
        cluster.create_topic("load-probe")
        log = REPO / "out" / "connections_load-proxy.log"
        log.unlink(missing_ok=True)
        with ProxyProcess(cluster.bootstrap, log) as proxy:
            proxy_limit = fd_soft_limit(proxy.pid)
            if proxy_limit < 2 * args.connections + 200:
                # A hard limit this process may not raise (a container without CAP_SYS_RESOURCE).
                fitting = (proxy_limit - 200) // 2
                progress(f"proxy may open only {proxy_limit} files: {fitting} connections instead of "
                         f"{args.connections}")
                args.connections = fitting
            rounds = [one_round(i + 1, proxy, "load-probe", args) for i in range(args.rounds)]
    text = report(rounds, args.connections, proxy_limit)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
