"""Kafka's own figure for tests/integration/test_fleet.py: three librdkafka producers with one
client-id, each offering the quota, straight to one Kafka 4.3.1 broker that enforces the quota
itself (one broker, one budget, as `scope: cluster` through a fleet). Measured with the test's
own producer and whole-cycle averaging, so the two figures compare directly.

    .venv/bin/python -m bench.fleet_reference --runs 2
"""

from __future__ import annotations

import argparse
import threading
import time

from harness.local_kafka import KafkaCluster
from tests.integration.helpers.fleet import CLIENT_ID, QUOTA, STEADY_S, WARMUP_S, produce_through, steady_rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv)
    with KafkaCluster(nodes=1) as cluster:
        cluster.run_tool("kafka.admin.ConfigCommand", "--bootstrap-server", cluster.bootstrap, "--alter",
                         "--add-config", f"producer_byte_rate={QUOTA}", "--entity-type", "clients",
                         "--entity-name", CLIENT_ID)
        for run in range(args.runs):
            topic = f"fleet-reference-{run}"
            cluster.create_topic(topic, partitions=3, replication=1)
            seconds = WARMUP_S + STEADY_S
            per_second = [0] * (seconds + 1)
            lock = threading.Lock()
            start = time.monotonic()
            threads = [threading.Thread(target=produce_through,
                                        args=(cluster.bootstrap, topic, seconds, per_second, lock, start))
                       for _ in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            rate = steady_rate(per_second, WARMUP_S, WARMUP_S + STEADY_S)
            print(f"run {run + 1}: broker-enforced, three producers: {rate / QUOTA:.3f} x quota", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
