"""Proxy memory under large Fetch responses: does cut-through keep whole frames out of RAM?

    .venv/bin/python bench/fetch_memory.py [--consumers 20] [--response-mb 50]

Writes --response-mb of 1 MB records into one single-partition topic per consumer, then
starts --consumers confluent-kafka consumers at once through `kqp serve`, each allowed a
single Fetch response of that size (fetch.max.bytes and max.partition.fetch.bytes), and
samples the proxy's RSS every 50 ms while they read. A store-and-forward proxy holds each
response whole (consumers x response size); cut-through holds what is in flight in the
socket buffers. Prints a markdown report; progress on stderr.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bench.connections_load import rss_kb
from harness.local_kafka import REPO, KafkaCluster
from harness.proxy_process import ProxyProcess

RECORD = 1024 * 1024 - 512  # a 1 MB record, with room for its batch overhead


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def fill(bootstrap: str, topics: list[str], megabytes: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(t, 1, 1, config={"max.message.bytes": str(2 * RECORD)})
                                   for t in topics])
    for future in futures.values():
        future.result(timeout=60)
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 2 * RECORD,
                         "linger.ms": 0, "acks": "1"})
    payload = b"x" * RECORD
    for topic in topics:
        for _ in range(megabytes):
            producer.produce(topic, payload)
            producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError("records not acknowledged")


def consume(bootstrap: str, topic: str, megabytes: int) -> int:
    fetch_bytes = megabytes * 1024 * 1024
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-g", "auto.offset.reset": "earliest",
                         "fetch.max.bytes": fetch_bytes, "max.partition.fetch.bytes": fetch_bytes,
                         "receive.message.max.bytes": fetch_bytes + 1024 * 1024, "enable.auto.commit": False})
    consumer.subscribe([topic])
    read = 0
    deadline = time.monotonic() + 120
    while read < megabytes and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            read += 1
    consumer.close()
    return read


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--consumers", type=int, default=20)
    parser.add_argument("--response-mb", type=int, default=50)
    parser.add_argument("--output", type=Path, default=REPO / "out" / "fetch_memory.md")
    args = parser.parse_args(argv)
    topics = [f"memory-{i}" for i in range(args.consumers)]
    with KafkaCluster(nodes=1, extra_config={"message.max.bytes": str(2 * RECORD)}) as cluster:
        progress(f"writing {args.response_mb} MB into each of {len(topics)} topics")
        fill(cluster.bootstrap, topics, args.response_mb)
        with ProxyProcess(cluster.bootstrap, args.output.parent / "fetch_memory-proxy.log") as proxy:
            idle_kb = rss_kb(proxy.pid)
            samples: list[int] = []
            done = threading.Event()

            def sample() -> None:
                while not done.is_set():
                    samples.append(rss_kb(proxy.pid))
                    done.wait(0.05)

            sampler = threading.Thread(target=sample)
            sampler.start()
            progress(f"{args.consumers} consumers reading {args.response_mb} MB each through the proxy")
            started = time.monotonic()
            with ThreadPoolExecutor(args.consumers) as pool:
                counts = list(pool.map(lambda t: consume(proxy.bootstrap, t, args.response_mb), topics))
            elapsed = time.monotonic() - started
            done.set()
            sampler.join()
    peak_kb = max(samples)
    total_mb = sum(counts)
    text = "\n".join([
        "## Proxy memory under large Fetch responses", "",
        f"{args.consumers} consumers, each allowed one {args.response_mb} MB Fetch response, read "
        f"{total_mb} MB of {args.consumers * args.response_mb} MB through the proxy in {elapsed:.1f} s.", "",
        "| proxy RSS idle | peak while fetching | peak / idle | store-and-forward would hold |",
        "|---:|---:|---:|---:|",
        f"| {idle_kb / 1024:.0f} MB | {peak_kb / 1024:.0f} MB | {peak_kb / idle_kb:.2f}x | "
        f"{args.consumers * args.response_mb} MB of frames |", "",
    ])
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)
    return 0 if total_mb == args.consumers * args.response_mb else 1


if __name__ == "__main__":
    sys.exit(main())
