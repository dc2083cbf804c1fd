"""One client-id scaled out to many producers: kqp beside Kafka's own broker (issue 25).

    .venv/bin/python bench/scaled_out_client.py [--seconds 90] [--warmup 25] [--producers 10]
                                                [--only kqp,kqp-fair,broker]

One broker; --producers librdkafka producers with one client.id (64 MB queue, acks=all,
linger.ms 5, 1 KB records; harness/paced_producers.py), each offering the whole quota
(1 MiB/s), three times: through `kqp serve` enforcing the quota as Kafka does (default),
through `kqp serve` with `enforcement.fair_connection_turns: true`, and straight to the
broker enforcing the same quota itself (kafka-configs, another client-id so the two never
meet). Each run takes --seconds; only what was acknowledged within seconds [--warmup,
--seconds) counts, the backlog left in the clients is purged. Prints a markdown table on
stdout (total as a plain mean and over whole throttling cycles, each producer's share of an
equal share, librdkafka request time-outs and connects), progress on stderr.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.local_kafka import KafkaCluster
from harness.paced_producers import ProducerTally, offer_from_many
from harness.proxy_process import ProxyProcess

QUOTA = 1024 * 1024  # bytes/s
TARGETS = ("kqp", "kqp-fair", "broker")


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def whole_cycles(total: list[int], first: int, last: int) -> tuple[int, int]:
    """From the first throttling burst that starts in [first, last) to the last one (a second
    above the quota after three below it); [first, last) when there are fewer than two."""
    starts = [s for s in range(max(first, 3), last) if total[s] > QUOTA and max(total[s - 3:s]) < QUOTA]
    return (starts[0], starts[-1]) if len(starts) >= 2 else (first, last)


def row(label: str, tallies: list[ProducerTally], warmup: int, seconds: int) -> str:
    total = [sum(t.per_second[s] for t in tallies) for s in range(seconds)]
    mean = sum(total[warmup:]) / (seconds - warmup) / QUOTA
    first, last = whole_cycles(total, warmup, seconds)
    cycles = sum(total[first:last]) / (last - first) / QUOTA
    shares = sorted(t.rate(first, last) * len(tallies) / QUOTA for t in tallies)
    timeouts = [t.request_timeouts for t in tallies]
    reconnects = sum(max(t.connects - 1, 0) for t in tallies)
    return (f"| {label} | {mean:.3f} | {cycles:.3f} (s {first}-{last}) | {shares[0]:.2f} - {shares[-1]:.2f} | "
            f"{sum(timeouts)} ({sum(1 for t in timeouts if t)} of {len(tallies)}) | {reconnects} |")


def config(path: Path, fair: bool) -> Path:
    path.write_text("quotas:\n  entries:\n    - entity: {client-id: limited}\n"
                    f"      producer_byte_rate: {QUOTA}\n"
                    + ("enforcement:\n  fair_connection_turns: true\n" if fair else ""))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=90)
    parser.add_argument("--warmup", type=int, default=25)
    parser.add_argument("--producers", type=int, default=10)
    parser.add_argument("--only", default=",".join(TARGETS), help="comma-separated subset of " + ", ".join(TARGETS))
    args = parser.parse_args()
    targets = [t for t in args.only.split(",") if t]
    rows = []
    with tempfile.TemporaryDirectory(prefix="kqp-scaled-out-") as tmp, \
            KafkaCluster(nodes=1, workdir=Path(tmp) / "kafka") as cluster:
        workdir = Path(tmp)
        cluster.run_tool("kafka.admin.ConfigCommand", "--bootstrap-server", cluster.bootstrap, "--alter",
                         "--add-config", f"producer_byte_rate={QUOTA}", "--entity-type", "clients",
                         "--entity-name", "broker-limited")
        for target in targets:
            topic = f"scaled-out-{target}"
            cluster.create_topic(topic, partitions=1, replication=1)
            progress(f"{target}: {args.producers} producers x 1 quota for {args.seconds} s")
            if target == "broker":
                tallies = offer_from_many(cluster.bootstrap, topic, "broker-limited", args.producers, QUOTA,
                                          args.seconds)
            else:
                proxy_config = config(workdir / f"{target}.yaml", fair=target == "kqp-fair")
                with ProxyProcess(cluster.bootstrap, workdir / f"{target}.log", config=proxy_config) as proxy:
                    tallies = offer_from_many(proxy.bootstrap, topic, "limited", args.producers, QUOTA,
                                              args.seconds)
            rows.append(row(target, tallies, args.warmup, args.seconds))
    print(f"{args.producers} librdkafka producers of one client-id, each offering the quota ({QUOTA} B/s), "
          f"1 broker, {args.seconds} s, seconds {args.warmup}-{args.seconds} counted.\n")
    print("| path | total, mean (x quota) | total, whole cycles | share of an equal share (min - max) "
          "| request time-outs (producers) | reconnects |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
