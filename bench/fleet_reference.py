"""The fleet shape of issue 25, beside Kafka's own figure: three librdkafka producers with one
client-id, each offering 1.5x a 1 MiB/s quota (librdkafka's default queue, linger.ms 5, 1 KB
records, acks=all), either each through its own `kqp serve` instance of a fleet in front of
three brokers (`scope: cluster`), or straight to one Kafka 4.3.1 broker that enforces the quota
itself (one broker, one budget, as `scope: cluster` through a fleet). Only what was
acknowledged in the measured seconds counts, as the slope of the cumulative bytes that
tests/integration/test_fleet.py checks, and as a plain average; per producer shares, librdkafka's
request time-outs and the longest throttle it reported.

    .venv/bin/python -m bench.fleet_reference kafka
    .venv/bin/python -m bench.fleet_reference kqp [--count-other-instances]

One run takes about two minutes (90 s of producing); run it several times, the figures move
by several percent from run to run (each request is a second of the quota).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess
from tests.integration.helpers.fleet import (
    CLIENT_ID,
    ProducerTally,
    acknowledged_slope,
    fleet_config,
    produce_through,
    wait_for_fleet,
)

QUOTA = 1024 * 1024
OFFER = 1.5 * QUOTA


def measure(bootstraps: list[str], topic: str, warmup_s: int, seconds: int) -> str:
    per_second = [0] * (seconds + 1)
    tallies = [ProducerTally([0] * (seconds + 1)) for _ in bootstraps]
    lock = threading.Lock()
    start = time.monotonic()
    threads = [threading.Thread(target=produce_through, args=(bootstrap, topic, seconds, per_second, lock, start),
                                kwargs={"offer": OFFER, "tally": tally})
               for bootstrap, tally in zip(bootstraps, tallies, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rate = acknowledged_slope(per_second, warmup_s, seconds)
    plain = sum(per_second[warmup_s:seconds]) / (seconds - warmup_s)
    shares = [round(acknowledged_slope(t.per_second, warmup_s, seconds) / QUOTA, 2) for t in tallies]
    return (f"{rate / QUOTA:.3f}x (slope), {plain / QUOTA:.3f}x (plain average), seconds {warmup_s}-{seconds}; "
            f"per producer {shares}; request time-outs "
            f"{[t.request_timeouts for t in tallies]}; longest throttle ms {[t.longest_throttle_ms for t in tallies]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("through", choices=["kafka", "kqp"])
    parser.add_argument("--count-other-instances", action="store_true")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--seconds", type=int, default=90)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work, KafkaCluster(nodes=3 if args.through == "kqp" else 1) as cluster:
        proxies: list[ProxyProcess] = []
        try:
            if args.through == "kqp":
                for index in range(3):
                    config = fleet_config(Path(work) / f"fleet-{index}.yaml", "_kqp_fleet_reference", quota=QUOTA,
                                          count_other_instances=args.count_other_instances)
                    proxies.append(ProxyProcess(cluster.bootstrap, Path(work) / f"fleet-{index}.log",
                                                config=config).start())
                wait_for_fleet(proxies)
                bootstraps = [proxy.bootstrap for proxy in proxies]
            else:
                cluster.run_tool("kafka.admin.ConfigCommand", "--bootstrap-server", cluster.bootstrap, "--alter",
                                 "--add-config", f"producer_byte_rate={QUOTA}", "--entity-type", "clients",
                                 "--entity-name", CLIENT_ID)
                bootstraps = [cluster.bootstrap] * 3
            cluster.create_topic("fleet-reference", partitions=3)
            label = args.through + (" count_other_instances" if args.count_other_instances else "")
            print(f"{label}: {measure(bootstraps, 'fleet-reference', args.warmup, args.seconds)}", flush=True)
        finally:
            for proxy in proxies:
                proxy.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
