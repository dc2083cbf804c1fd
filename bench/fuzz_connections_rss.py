"""A serving proxy's memory after thousands of connections of valid and mutated frames.

    .venv/bin/python bench/fuzz_connections_rss.py [--connections 3000] [--concurrency 50] [--seed 1]

Starts a 1-node Kafka cluster and one `kqp serve` in front of it, then opens `--connections`
connections through the proxy, `--concurrency` at a time. Each sends an ApiVersions request,
one valid request of an API the proxy decodes (kqp.protocol.apis.DECODED_APIS, a random version
of the bundled range) and one mutated frame (a valid request of any API with a few body bytes
replaced), reads what comes back for up to a second, and closes. The proxy's RSS (`VmRSS`) is
read once it serves (before the first connection) and after the last one has closed; the report
also gives how long the proxy took from its start to serving. Prints progress on stderr and a
markdown line on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import contextlib

from bench.connections_load import progress, raise_fd_limit, rss_kb
from harness.local_kafka import REPO, KafkaCluster
from harness.proxy_process import ProxyProcess
from kqp.protocol.apis import API_SPECS, API_VERSIONS_KEY, DECODED_APIS


def request_frame(api_key: int, version: int, correlation_id: int) -> bytes:
    """A request of this API and version with every field at its default, framed."""
    spec = API_SPECS[api_key]
    header = struct.pack(">hhih", api_key, version, correlation_id, 4) + b"fuzz"
    if spec.is_flexible(version):
        header += b"\x00"  # request header v2: no tagged fields
    body = spec.request_class().encode(version)
    return struct.pack(">i", len(header) + len(body)) + header + body


def mutated(frame: bytes, rng: random.Random) -> bytes:
    out = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        position = rng.randrange(4, len(out))  # the size prefix stays: the frame is read whole
        out[position] = rng.randrange(256)
    return bytes(out)


async def one_connection(port: int, index: int, rng: random.Random, limit: asyncio.Semaphore) -> None:
    decoded = sorted(DECODED_APIS - {API_VERSIONS_KEY})
    every = sorted(API_SPECS)
    key = rng.choice(decoded)
    other = rng.choice(every)
    frames = [request_frame(API_VERSIONS_KEY, 3, 1)]
    for api_key, mutate in ((key, False), (other, True)):
        spec = API_SPECS[api_key]
        version = rng.randint(spec.min_version, spec.max_version)
        frame = request_frame(api_key, version, len(frames) + 1)
        frames.append(mutated(frame, rng) if mutate else frame)
    async with limit:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return
        try:
            writer.write(b"".join(frames))
            await writer.drain()
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                data = await asyncio.wait_for(reader.read(65536), max(0.01, deadline - time.monotonic()))
                if not data:
                    break
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def drive(port: int, connections: int, concurrency: int, seed: int) -> None:
    rng = random.Random(seed)
    limit = asyncio.Semaphore(concurrency)
    await asyncio.gather(*(one_connection(port, i, random.Random(rng.random()), limit) for i in range(connections)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--connections", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    raise_fd_limit(4 * args.concurrency + 4096)
    with KafkaCluster(nodes=1, heap="512m") as cluster:
        log = REPO / "out" / "fuzz_connections_rss-proxy.log"
        log.unlink(missing_ok=True)
        started = time.monotonic()
        with ProxyProcess(cluster.bootstrap, log) as proxy:
            serving_s = time.monotonic() - started
            before = rss_kb(proxy.pid)
            progress(f"proxy serving after {serving_s:.2f} s, RSS {before / 1024:.1f} MB")
            began = time.monotonic()
            asyncio.run(drive(proxy.bootstrap_port, args.connections, args.concurrency, args.seed))
            time.sleep(1.0)
            after = rss_kb(proxy.pid)
            progress(f"{args.connections} connections in {time.monotonic() - began:.1f} s; RSS {after / 1024:.1f} MB")
    print(f"| {args.connections} | {serving_s:.2f} | {before / 1024:.1f} | {after / 1024:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
