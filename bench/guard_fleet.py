"""The cluster guard across a fleet: three instances in front of three brokers (issue 41, acceptance 3).

    .venv/bin/python bench/guard_fleet.py [--seconds 75]

Three brokers, each the leader of its own topic (one partition, replication factor 1); on each
broker the wire test's shape (tests/integration/test_guard.py): three quiet librdkafka producers
at 100 kB/s and two noisy at 800 kB/s, at the harness's settings (harness/paced_producers.py:
library defaults but acks=all, linger.ms 5, 1 KB records, a 64 MB queue), each its own
client-id, against an NW_IN limit of 1.2 MB/s per broker (capacity x 0.8). Three `kqp serve`
instances with `guard.fleet_wide` and the fleet exchange: every broker's five producers are
spread over the three instances (the quiet one each, the noisy two through two different ones),
so that no instance forwards more than 0.75x of any broker's limit and only the exchange lets
each see a broker's whole load. A broker's load is what its producers had acknowledged, second
by second; judged from three quota windows on (the issue's convergence bound): over the span
(acceptance 3: within the limit +5 %), and over every 11 s window, printed beside. Prints a
markdown table on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.local_kafka import KafkaCluster
from harness.paced_producers import ProducerTally, offer_from_clients
from harness.proxy_process import ProxyProcess

LIMIT = 1_200_000  # NW_IN limit per broker, bytes/s
QUIET, NOISY = 100_000, 800_000
BROKERS = (1, 2, 3)
INSTANCES = 3
WINDOW_S = 11
CONVERGED_S = 3 * WINDOW_S


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def instance_config(workdir: Path) -> Path:
    capacity = workdir / "capacity.json"
    nw_in_kb = LIMIT / 0.8 / 1024  # Cruise Control's NW_IN is in KB/s; the guard's limit is capacity x 0.8
    capacity.write_text(json.dumps({"brokerCapacities": [
        {"brokerId": "-1", "capacity": {"DISK": "100000", "CPU": "100", "NW_IN": str(nw_in_kb), "NW_OUT": "100000"},
         "doc": "issue 41, acceptance 3"}]}))
    config = workdir / "guard.yaml"
    config.write_text(
        f"guard:\n  enabled: true\n  capacity_file: {capacity}\n  replication_factor: 1\n  interval_seconds: 1\n"
        "  fleet_wide: true\nfleet:\n  enabled: true\n  topic: _kqp_usage-guard-fleet\n"
        "  report_interval_seconds: 0.1\n")
    return config


def wait_for_fleet(proxies: list[ProxyProcess], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = [re.search(r"^kqp_fleet_instances(?:\{\})? (\S+)$", p.metrics_text(), re.M) for p in proxies]
        if all(match is not None and float(match[1]) == len(proxies) for match in seen):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the instances did not see each other within {timeout_s:.0f} s")


def placement() -> dict[tuple[int, int], dict[str, float]]:
    """(broker, instance) -> the offers of the client-ids producing to that broker through that instance."""
    groups: dict[tuple[int, int], dict[str, float]] = {}
    for broker in BROKERS:
        for index in range(INSTANCES):
            groups.setdefault((broker, index), {})[f"b{broker}-quiet-{index + 1}"] = QUIET
        for index, noisy in enumerate(("noisy-1", "noisy-2")):
            groups[(broker, (broker + index) % INSTANCES)][f"b{broker}-{noisy}"] = NOISY
    return groups


def windows(series: list[int], first: int, last: int) -> list[float]:
    return [sum(series[s - WINDOW_S:s]) / WINDOW_S for s in range(first + WINDOW_S, last + 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=75)
    args = parser.parse_args()
    seconds = args.seconds
    with tempfile.TemporaryDirectory() as tmp, KafkaCluster(nodes=len(BROKERS)) as cluster:
        workdir = Path(tmp)
        for broker in BROKERS:
            # The partition's only replica on this broker: its leader, the broker its producers load.
            cluster.run_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", cluster.bootstrap,
                             "--create", "--topic", f"guarded-{broker}", "--replica-assignment", str(broker))
        proxies: list[ProxyProcess] = []
        try:
            for index in range(INSTANCES):
                instance_dir = workdir / f"instance-{index}"
                instance_dir.mkdir()
                proxies.append(ProxyProcess(cluster.bootstrap, workdir / f"proxy-{index}.log",
                                            config=instance_config(instance_dir)).start())
            wait_for_fleet(proxies)
            progress(f"{INSTANCES} instances see each other; producing for {seconds} s")
            tallies: dict[str, ProducerTally] = {}
            lock = threading.Lock()

            def offer(broker: int, index: int, offers: dict[str, float]) -> None:
                got = offer_from_clients(proxies[index].bootstrap, f"guarded-{broker}", offers, seconds)
                with lock:
                    tallies.update(got)

            threads = [threading.Thread(target=offer, args=(broker, index, offers))
                       for (broker, index), offers in placement().items()]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(seconds + 120)
            guard_lines = [line for proxy in proxies for line in proxy.log_tail(200).splitlines() if "guard" in line]
        finally:
            for proxy in proxies:
                proxy.stop()
    print(f"| broker | load, seconds {CONVERGED_S}-{seconds} | 11 s windows | quiet (offer 100 kB/s) | "
          "noisy (equal share of what is left) |")
    print("|---|---:|---:|---|---|")
    worst = 0.0
    for broker in BROKERS:
        mine = {client: tally for client, tally in tallies.items() if client.startswith(f"b{broker}-")}
        load = [sum(t.per_second[s] for t in mine.values()) for s in range(seconds)]
        span = sum(load[CONVERGED_S:]) / (seconds - CONVERGED_S) / LIMIT
        means = windows(load, CONVERGED_S, seconds)
        rates = {client: tally.rate(CONVERGED_S, seconds) for client, tally in mine.items()}
        quiet = [rate for client, rate in rates.items() if "quiet" in client]
        noisy = [rate for client, rate in rates.items() if "noisy" in client]
        left = (LIMIT - sum(quiet)) / len(noisy)
        worst = max(worst, span)
        print(f"| {broker} | {span:.3f}x | {min(means) / LIMIT:.3f}-{max(means) / LIMIT:.3f}x | "
              f"{min(quiet) / 1000:.0f}-{max(quiet) / 1000:.0f} kB/s | "
              f"{', '.join(f'{rate / 1000:.0f}' for rate in sorted(noisy))} kB/s ({left / 1000:.0f}) |")
        print(f"<!-- broker {broker} load per second (kB): {[round(b / 1000) for b in load]} -->")
    print(f"\nEvery broker within its limit +5 % over the converged span: {'yes' if worst <= 1.05 else 'NO'} "
          f"(highest {worst:.3f}x)")
    progress("the guard's log:\n" + "\n".join(guard_lines[-30:]))


if __name__ == "__main__":
    main()
