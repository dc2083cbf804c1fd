"""Wire accuracy beside Kafka's broker: the system test of issue 39 (`make system-test`).

    .venv/bin/python bench/system_test.py [--rounds 3] [--shapes fleet,ten-fair,...] [--seconds 90] [--warmup 25]

Not part of `make test`. The suite's wire tests assert what the phase of large requests and
the host's load cannot move (a quota engages, ThrottleTimeMs and the mute, nothing lost); the
rates themselves move by several percent from run to run on the wire, with no change aimed at
them, on kqp and on Kafka's broker alike. This target measures them as Kafka's own quota
system tests do: several rounds, each shape through kqp and then the same clients straight to
one Kafka 4.3.1 broker enforcing the same quota, in the same run, and prints per shape both
figures per round, their medians and spreads, and issue 39's acceptance 3 bounds as PASS/FAIL
lines (a bound holds when it holds in every round).

Shapes (library-default clients; the producers are bench/quota_shapes.py's: librdkafka, 64 MB
queue, linger.ms 5, acks=all, 1 KB records, each pacing its offer; a 1 MiB/s quota):

* fleet: 3 producers of one client-id x 1.5x, one per instance of a fleet of 3, scope
  cluster, 3 brokers. Acceptance: kqp <= Kafka + 2%.
* fleet-count-other: the same with `fleet.count_other_instances`. Acceptance: 0.95-1.05x.
* ten: 10 producers of one client-id x 1x, one proxy, 1 broker. Acceptance: kqp <= Kafka + 2%.
* ten-fair: the same with `enforcement.fair_connection_turns`. Acceptance: 0.95-1.05x and no
  producer under half an equal share.
* consumer-3: 3 Java consumers of one client-id (one group, a partition each: 3 connections,
  1 MiB fetches), 2 MiB/s, one proxy, 1 broker. Acceptance: kqp <= Kafka + 5%.
* workers-busy: 3 producers x 0.5x through `--workers 2`, scope cluster, 3 brokers, two
  CPU-bound loops on the host (Kafka's side too). Acceptance: 0.95-1.05x.
* oauthbearer: librdkafka user alice (OAUTHBEARER), 256 KiB/s user quota, a queue of 4 s of
  it, 40 s: tests/integration/test_oauthbearer_through_proxy.py's client, whose rate left
  the suite. Bound: the suite's former one, within 20% of the quota.
* fleet-consumers: 3 Java consumers, each through its own instance of a fleet of 3, 2 MiB/s:
  test_fleet.py's shape, whose floor left the suite. Bound: the suite's former 10%, around
  Kafka's figure (Kafka answers a throttled fetch empty, so its own figure is under the quota).
* balancer: test_fleet_balancer's shape, whose rate left the suite: 3 librdkafka producers
  (librdkafka's default queue) of one client-id, 1x a 256 KiB/s quota each, through HAProxy in
  front of a fleet of 3; one instance is killed at 22 s; the rate over whole throttle cycles
  from one quota window after the kill for 40 s, beside the same producers straight to one
  Kafka broker over the same seconds. Bound: the suite's former 10%, around Kafka's figure.
* single: one librdkafka producer offering 3x through one proxy, 1 broker:
  test_quota_enforcement's muted client, whose rate left the suite. Bound: the suite's former
  one, within 10% of the quota.
* calibrate-librdkafka, calibrate-java-producer, calibrate-aiokafka, calibrate-consumer,
  calibrate-admin: no proxy; each real client with its library's defaults on the one broker
  under a quota on its client-id, beside the simulator's model of it in the same shape against
  the modelled Kafka (bench/calibration.py says how each is measured). Bound: the model's
  median within 5% of the real client's figure. `--calibration-out FILE` keeps the real
  figures, for `bench/calibration.py --real FILE` to run a changed model against them.

Kafka's figure for the fleet, --workers and cluster-scope shapes is one broker's for the same
clients (a broker quota on three brokers would be three quotas). Progress goes to stderr, the
report (markdown) to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer

from bench import calibration
from bench.quota_shapes import (
    QUOTA,
    busy_loops,
    fleet,
    kafka_side,
    producer_config,
    progress,
    proxies,
    run_producers,
    ten_producers,
    workers,
)
from harness import perf_tools
from harness.load_balancer import LoadBalancer
from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess, free_port_block
from tests.integration.helpers.fleet import CLIENT_ID as FLEET_CLIENT_ID
from tests.integration.helpers.fleet import QUOTA as FLEET_QUOTA
from tests.integration.helpers.fleet import fleet_config, produce_through, steady_rate, wait_for_fleet

CONSUME_RATE = Path(__file__).resolve().parent.parent / "tests" / "integration" / "java" / "ConsumeRate.java"
CONSUMER_QUOTA = 2 * 1024 * 1024  # bytes/s for the three consumers together: a 1 MiB fetch is half a second
CONSUMER_WARMUP_S = 24  # test_fleet.py's: the cold start of a fresh sensor is over by then
CONSUMER_SECONDS = CONSUMER_WARMUP_S + 60
OAUTH_QUOTA = 256 * 1024
OAUTH_SECONDS = 40
OAUTH_WARMUP_S = 10
RECORD_SIZE = 1024
SHAPE_NAMES = ("fleet", "fleet-count-other", "ten", "ten-fair", "consumer-3", "workers-busy", "oauthbearer",
               "fleet-consumers", "single", "balancer", *calibration.NAMES)


@dataclass
class Figure:
    """One shape in one round: totals as a fraction of the shape's quota."""

    kqp: float
    kafka: float
    kqp_shares: list[float]  # per client, x quota
    kafka_shares: list[float]
    # Producer shapes: the mean over windows shifted across one throttling cycle (bench/
    # quota_shapes.shifted_mean), which the burst's phase does not move. The bounds that set
    # kqp beside Kafka judge it (`against_kafka`); the plain figures are printed beside it.
    kqp_shifted: float | None = None
    kafka_shifted: float | None = None


def against_kafka(figure: Figure, margin: float) -> bool:
    """kqp at or under Kafka's figure plus `margin`, over shifted windows where the shape has
    them. Both sides admit a window's worth at once every 11-12 s, and which side of the
    measured span's first second a burst lands on moved the plain means by up to 0.15x of the
    quota (the `ten` finding in docs/quotas.md: Kafka's third burst fell at 23 s in four runs
    of four, kqp's at 28-29 s; from second 20 instead of 25 the order flipped). A bound beside
    Kafka judges what the two admit, not where second 25 cuts their cycles."""
    if figure.kqp_shifted is not None and figure.kafka_shifted is not None:
        return figure.kqp_shifted <= figure.kafka_shifted + margin
    return figure.kqp <= figure.kafka + margin


@dataclass(frozen=True)
class Bound:
    """An acceptance bound over one round's figure; `text` says it in words."""

    text: str
    holds: Callable[[Figure], bool]


BOUNDS: dict[str, list[Bound]] = {
    "fleet": [Bound("kqp <= Kafka + 0.02 over shifted windows", lambda f: against_kafka(f, 0.02))],
    "fleet-count-other": [Bound("kqp 0.95-1.05x", lambda f: 0.95 <= f.kqp <= 1.05)],
    "ten": [Bound("kqp <= Kafka + 0.02 over shifted windows", lambda f: against_kafka(f, 0.02))],
    "ten-fair": [Bound("kqp 0.95-1.05x", lambda f: 0.95 <= f.kqp <= 1.05),
                 Bound("no producer under half an equal share",
                       lambda f: min(f.kqp_shares) >= 0.5 * f.kqp / len(f.kqp_shares))],
    "consumer-3": [Bound("kqp <= Kafka + 0.05", lambda f: f.kqp <= f.kafka + 0.05)],
    "workers-busy": [Bound("kqp 0.95-1.05x", lambda f: 0.95 <= f.kqp <= 1.05)],
    "oauthbearer": [Bound("kqp 0.80-1.20x (the suite's former bound)", lambda f: 0.80 <= f.kqp <= 1.20)],
    # test_fleet held it to the quota +-10%; Kafka's own figure for this shape is under the
    # quota (a throttled fetch is answered empty and unrecorded), so the 10% is around Kafka's.
    "fleet-consumers": [Bound("kqp within 10% of Kafka's figure (the suite's former tolerance)",
                              lambda f: abs(f.kqp - f.kafka) <= 0.10 * f.kafka)],
    # test_fleet_balancer held it to KAFKA_ADMITS (a figure of Kafka's measured apart) +-10%.
    "balancer": [Bound("kqp within 10% of Kafka's figure (the suite's former tolerance)",
                       lambda f: abs(f.kqp - f.kafka) <= 0.10 * f.kafka)],
    "single": [Bound("kqp 0.90-1.10x (the suite's former bound)", lambda f: 0.90 <= f.kqp <= 1.10)],
}


# ---- consumers ---------------------------------------------------------------------------

def preload(cluster: KafkaCluster, topic: str) -> None:
    """Twice what a held consumer shape reads in a run (one partition per consumer): a shape
    whose consumers read more than that shows it as a figure capped near 2x."""
    cluster.create_topic(topic, partitions=3, replication=1)
    records = 2 * CONSUMER_QUOTA * CONSUMER_SECONDS // RECORD_SIZE
    progress(f"preloading {records * RECORD_SIZE // 2**20} MiB into {topic}")
    perf_tools.producer_perf(cluster, cluster.bootstrap, topic, records, RECORD_SIZE,
                             props={"acks": "1", "linger.ms": "5", "batch.size": "262144"})


def consume(cluster: KafkaCluster, bootstraps: Sequence[str], topic: str, group: str, client_id: str,
            workdir: Path) -> list[float]:
    """Kafka's Java consumer (it honours ThrottleTimeMs), one per bootstrap, all in `group` with
    `client_id`, from the topic's start; each one's value bytes/s over the measured seconds, as a
    fraction of CONSUMER_QUOTA."""
    start_epoch_ms = int(time.time() * 1000) + 5000  # after the JVMs start and the group forms
    with contextlib.ExitStack() as logs:
        consumers = [subprocess.Popen(
            ["java", "-cp", f"{cluster.kafka_dir / 'libs'}/*", f"-Dlog4j2.configurationFile={cluster.tools_log4j}",
             str(CONSUME_RATE), bootstrap, topic, group, client_id, str(start_epoch_ms), str(CONSUMER_SECONDS)],
            stdout=subprocess.PIPE, stderr=logs.enter_context((workdir / f"{group}-{i}.log").open("w")), text=True)
            for i, bootstrap in enumerate(bootstraps)]
        shares = []
        for index, consumer in enumerate(consumers):
            out, _ = consumer.communicate(timeout=CONSUMER_SECONDS + 120)
            if consumer.returncode != 0:
                raise RuntimeError((workdir / f"{group}-{index}.log").read_text()[-3000:])
            per_second = [int(line.split()[2]) for line in out.splitlines()]
            shares.append(sum(per_second[CONSUMER_WARMUP_S:]) / (CONSUMER_SECONDS - CONSUMER_WARMUP_S)
                          / CONSUMER_QUOTA)
    return shares


def consumer_quota_config(path: Path, client_id: str) -> Path:
    path.write_text(f"quotas:\n  entries:\n    - entity: {{client-id: {client_id}}}\n"
                    f"      consumer_byte_rate: {CONSUMER_QUOTA}\n")
    return path


def kafka_consumers(one_broker: KafkaCluster, workdir: Path, round_index: int, shape: str) -> list[float]:
    progress(f"{shape}: 3 Java consumers straight to one Kafka broker, {CONSUMER_SECONDS} s")
    return consume(one_broker, [one_broker.bootstrap] * 3, "consumed", f"kafka-{shape}-{round_index}",
                   "broker-limited-consumer", workdir)


def consumer_3(one_broker: KafkaCluster, workdir: Path, round_index: int) -> Figure:
    config = consumer_quota_config(workdir / "consumer-3.yaml", "limited-consumer")
    progress(f"consumer-3: 3 Java consumers through one kqp, {CONSUMER_SECONDS} s")
    with proxies(ProxyProcess(one_broker.bootstrap, workdir / "consumer-3.log", config=config)) as (proxy,):
        kqp = consume(one_broker, [proxy.bootstrap] * 3, "consumed", f"kqp-consumer-3-{round_index}",
                      "limited-consumer", workdir)
    return _with_kafka(kqp, kafka_consumers(one_broker, workdir, round_index, "consumer-3"))


def fleet_consumers(one_broker: KafkaCluster, three_brokers: KafkaCluster, workdir: Path, round_index: int) -> Figure:
    configs = [fleet_config(workdir / f"fleet-consumers-{i}.yaml", "kqp-system-usage", quota_type="consumer_byte_rate",
                            quota=CONSUMER_QUOTA) for i in range(3)]
    progress(f"fleet-consumers: 3 Java consumers through 3 fleet instances, {CONSUMER_SECONDS} s")
    with proxies(*(ProxyProcess(three_brokers.bootstrap, workdir / f"fleet-consumers-{i}.log", config=c)
                   for i, c in enumerate(configs))) as started:
        wait_for_fleet(started)
        kqp = consume(three_brokers, [p.bootstrap for p in started], "consumed", f"kqp-fleet-{round_index}",
                      FLEET_CLIENT_ID, workdir)
    return _with_kafka(kqp, kafka_consumers(one_broker, workdir, round_index, "fleet-consumers"))


def _with_kafka(kqp: list[float], kafka: list[float]) -> Figure:
    figure = Figure(sum(kqp), sum(kafka), kqp, kafka)
    progress(f"  kqp {figure.kqp:.3f}x {[round(s, 2) for s in kqp]}, Kafka {figure.kafka:.3f}x "
             f"{[round(s, 2) for s in kafka]}")
    return figure


# ---- OAUTHBEARER (librdkafka, held by the mute alone) -------------------------------------

def oauth_user_rate(bootstrap: str, user: str, topic: str) -> float:
    """test_oauthbearer_through_proxy's librdkafka client: a queue of 4 s of the quota kept
    full for OAUTH_SECONDS; bytes/s acknowledged after the warm-up, as a fraction of the quota."""
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": f"rdkafka-{user}", "linger.ms": 5,
                         "queue.buffering.max.kbytes": 4 * OAUTH_QUOTA // 1024,
                         "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
                         "sasl.oauthbearer.method": "default", "enable.sasl.oauthbearer.unsecure.jwt": True,
                         "sasl.oauthbearer.config": f"principal={user}"})
    acked = [0]
    start = time.monotonic()

    def delivered(error: object, _message: object) -> None:
        if error is None and OAUTH_WARMUP_S <= time.monotonic() - start < OAUTH_SECONDS:
            acked[0] += RECORD_SIZE

    payload = b"x" * RECORD_SIZE
    while time.monotonic() < start + OAUTH_SECONDS:
        try:
            producer.produce(topic, payload, on_delivery=delivered)
        except BufferError:
            producer.poll(0.02)
        producer.poll(0)
    producer.purge()
    producer.flush(10)
    return acked[0] / (OAUTH_SECONDS - OAUTH_WARMUP_S) / OAUTH_QUOTA


def oauthbearer(one_broker: KafkaCluster, workdir: Path) -> Figure:
    config = workdir / "oauth.yaml"
    config.write_text("proxy:\n  sasl:\n    mechanisms: [PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER]\n"
                      "quotas:\n  window_num: 5\n  entries:\n"
                      f"    - entity: {{user: alice}}\n      producer_byte_rate: {OAUTH_QUOTA}\n")
    progress(f"oauthbearer: librdkafka user alice through kqp, {OAUTH_SECONDS} s")
    with proxies(ProxyProcess(one_broker.sasl_bootstrap, workdir / "oauth.log", config=config)) as (proxy,):
        kqp = oauth_user_rate(proxy.bootstrap, "alice", "oauth")
    progress(f"oauthbearer: librdkafka user alice-at-broker straight to Kafka, {OAUTH_SECONDS} s")
    kafka = oauth_user_rate(one_broker.sasl_bootstrap, "alice-at-broker", "oauth")
    return _with_kafka([kqp], [kafka])


def single(one_broker: KafkaCluster, workdir: Path, seconds: float, warmup_s: int) -> Figure:
    shape = "1 producer x 3x, one proxy, 1 broker"
    config = producer_config(workdir / "single.yaml", "limited", "broker")
    with proxies(ProxyProcess(one_broker.bootstrap, workdir / "single.log", config=config)) as (proxy,):
        kqp = run_producers([proxy.bootstrap], "shapes", "limited", 3 * QUOTA, seconds, warmup_s, shape, "kqp")
    return from_shapes([kqp, kafka_side(one_broker, "shapes", 1, 3 * QUOTA, seconds, warmup_s, shape)],
                       whole_cycles=True)


BALANCER_HOST = "127.0.0.10"
INSTANCE_HOSTS = ("127.0.0.11", "127.0.0.12", "127.0.0.13")
KILL_AT_S = 22
AFTER_KILL_S = 11  # one quota window: the killed instance's usage has left every window
BALANCER_STEADY_S = 40


def balanced_rate(bootstrap: str, topic: str, kill: Callable[[], None] | None) -> float:
    """Three of tests/integration/helpers/fleet's producers offering its QUOTA each; `kill` at
    KILL_AT_S; bytes/s over whole cycles from a window after it, as a fraction of the quota."""
    seconds = KILL_AT_S + AFTER_KILL_S + BALANCER_STEADY_S
    per_second = [0] * (seconds + 1)
    lock = threading.Lock()
    start = time.monotonic()
    threads = [threading.Thread(target=produce_through, args=(bootstrap, topic, seconds, per_second, lock, start))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    if kill is not None:
        time.sleep(max(0.0, start + KILL_AT_S - time.monotonic()))
        kill()
    for thread in threads:
        thread.join(seconds + 60)
    return steady_rate(per_second, KILL_AT_S + AFTER_KILL_S, seconds) / FLEET_QUOTA


def balancer(one_broker: KafkaCluster, three_brokers: KafkaCluster, workdir: Path) -> Figure:
    highest_node = max(three_brokers.nodes)
    base = free_port_block(highest_node + 2, hosts=[BALANCER_HOST, *INSTANCE_HOSTS])
    node_port_base, bootstrap_port = base + 1, base + highest_node + 2
    instances = [ProxyProcess(three_brokers.bootstrap, workdir / f"balanced-{i}.log",
                              config=fleet_config(workdir / f"balanced-{i}.yaml", "kqp-system-balanced"),
                              bind_host=host, advertised_host=BALANCER_HOST, ports=(bootstrap_port, node_port_base))
                 for i, host in enumerate(INSTANCE_HOSTS)]
    lb = LoadBalancer(BALANCER_HOST, [bootstrap_port, *(node_port_base + n for n in three_brokers.nodes)],
                      INSTANCE_HOSTS, workdir)
    progress(f"balancer: 3 producers through HAProxy and 3 instances, one killed at {KILL_AT_S} s")
    started = [instance.start() for instance in instances]
    try:
        lb.start()
        wait_for_fleet(started)

        def kill_one() -> None:
            victim = started[-1].process
            if victim is not None:
                victim.kill()
                victim.wait(10)
        kqp = balanced_rate(f"{BALANCER_HOST}:{bootstrap_port}", "shapes-6", kill_one)
    finally:
        lb.stop()
        for instance in started[:-1]:
            instance.stop()
    progress("balancer: the same producers straight to one Kafka broker")
    kafka = balanced_rate(one_broker.bootstrap, "shapes", None)
    return _with_kafka([kqp], [kafka])


# ---- a round -----------------------------------------------------------------------------

def from_shapes(results: list[Any], whole_cycles: bool = False) -> Figure:
    """bench/quota_shapes' two results as one figure: the totals over the measured seconds, or
    with `whole_cycles` over whole throttle cycles when the traffic came in cycles (as the
    suite's test of a muted client measured it)."""
    kqp, kafka = results
    if whole_cycles:
        return Figure(kqp.cycles or kqp.total, kafka.cycles or kafka.total, kqp.shares, kafka.shares,
                      kqp.shifted, kafka.shifted)
    return Figure(kqp.total, kafka.total, kqp.shares, kafka.shares, kqp.shifted, kafka.shifted)


@contextlib.contextmanager
def clusters(workdir: Path, shapes: Sequence[str]) -> Iterator[tuple[KafkaCluster, KafkaCluster | None]]:
    """One broker (Kafka's side of every shape, and the one-broker shapes' upstream), and three
    brokers when a shape needs them; quotas set and topics preloaded once for every round."""
    with contextlib.ExitStack() as stack:
        one = stack.enter_context(KafkaCluster(nodes=1, workdir=workdir / "kafka-1"))
        one.create_topic("shapes", partitions=3, replication=1)
        one.create_topic("oauth", partitions=1, replication=1)
        for entity_type, name, setting in (("clients", "broker-limited", f"producer_byte_rate={QUOTA}"),
                                           ("clients", "broker-limited-consumer",
                                            f"consumer_byte_rate={CONSUMER_QUOTA}"),
                                           ("users", "alice-at-broker", f"producer_byte_rate={OAUTH_QUOTA}"),
                                           ("clients", FLEET_CLIENT_ID, f"producer_byte_rate={FLEET_QUOTA}")):
            one.run_tool("kafka.admin.ConfigCommand", "--bootstrap-server", one.bootstrap, "--alter",
                         "--add-config", setting, "--entity-type", entity_type, "--entity-name", name)
        if {"consumer-3", "fleet-consumers"} & set(shapes):
            preload(one, "consumed")
        calibrations = [s for s in shapes if s in calibration.CALIBRATIONS]
        if calibrations:
            calibration.prepare(one, calibrations)
        three = None
        if {"fleet", "fleet-count-other", "workers-busy", "fleet-consumers", "balancer"} & set(shapes):
            three = stack.enter_context(KafkaCluster(nodes=3, workdir=workdir / "kafka-3"))
            three.create_topic("shapes-6", partitions=6, replication=1)
            if "fleet-consumers" in shapes:
                preload(three, "consumed")
        yield one, three


def run_round(one: KafkaCluster, three: KafkaCluster | None, workdir: Path, shapes: Sequence[str], round_index: int,
              seconds: float, warmup_s: int) -> dict[str, Figure]:
    count_other = [("fleet.count_other_instances", True)]
    fair = [("enforcement.fair_connection_turns", True)]
    runners: dict[str, Callable[[], Figure]] = {
        "ten": lambda: from_shapes(ten_producers(one, workdir, [], seconds, warmup_s)),
        "ten-fair": lambda: from_shapes(ten_producers(one, workdir, fair, seconds, warmup_s)),
        "consumer-3": lambda: consumer_3(one, workdir, round_index),
        "oauthbearer": lambda: oauthbearer(one, workdir),
        "single": lambda: single(one, workdir, seconds, warmup_s),
    }
    if three is not None:
        tb = three
        runners["fleet"] = lambda: from_shapes(fleet(one, tb, workdir, [], seconds, warmup_s))
        runners["fleet-count-other"] = lambda: from_shapes(fleet(one, tb, workdir, count_other, seconds, warmup_s))
        runners["fleet-consumers"] = lambda: fleet_consumers(one, tb, workdir, round_index)
        runners["balancer"] = lambda: balancer(one, tb, workdir)

        def busy_workers() -> Figure:
            with busy_loops(2):
                return from_shapes(workers(one, tb, workdir, [], seconds, warmup_s))
        runners["workers-busy"] = busy_workers
    figures = {}
    for name in shapes:
        progress(f"round {round_index + 1}, shape {name}")
        figures[name] = runners[name]()
        verdicts = ", ".join(f"{b.text}: {'PASS' if b.holds(figures[name]) else 'FAIL'}" for b in BOUNDS[name])
        progress(f"round {round_index + 1}, {name}: kqp {figures[name].kqp:.3f}x, Kafka {figures[name].kafka:.3f}x; "
                 f"{verdicts}")
    return figures


def shifted_pair(figure: Figure) -> str:
    if figure.kqp_shifted is None or figure.kafka_shifted is None:
        return "-"
    return f"{figure.kqp_shifted:.3f} / {figure.kafka_shifted:.3f}"


def spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def report(rounds: list[dict[str, Figure]], shapes: Sequence[str], load: tuple[str, str]) -> tuple[str, bool]:
    lines = [f"{len(rounds)} round(s); load average {load[0]} before, {load[1]} after; "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
             "| shape | kqp per round (x quota) | Kafka per round | kqp median (min-max) | Kafka median (min-max) "
             "| kqp poorest share of an equal share | kqp / Kafka over shifted windows per round |",
             "|---|---|---|---|---|---|---|"]
    verdicts = []
    passed = True
    for name in shapes:
        figures = [r[name] for r in rounds]
        poorest = [min(f.kqp_shares) * len(f.kqp_shares) / f.kqp for f in figures if f.kqp > 0]
        lines.append(f"| {name} | {' / '.join(f'{f.kqp:.3f}' for f in figures)} "
                     f"| {' / '.join(f'{f.kafka:.3f}' for f in figures)} | {spread([f.kqp for f in figures])} "
                     f"| {spread([f.kafka for f in figures])} | {' / '.join(f'{p:.2f}' for p in poorest)} "
                     f"| {' / '.join(shifted_pair(f) for f in figures)} |")
        for bound in BOUNDS[name]:
            held = [bound.holds(f) for f in figures]
            passed = passed and all(held)
            verdicts.append(f"{'PASS' if all(held) else 'FAIL'}  {name}: {bound.text} "
                            f"(held in {sum(held)} of {len(held)} rounds)")
    return "\n".join([*lines, "", *verdicts]), passed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", default=",".join(SHAPE_NAMES), help="comma-separated subset of "
                        + ", ".join(SHAPE_NAMES))
    parser.add_argument("--seconds", type=float, default=90, help="producer shapes: seconds per run")
    parser.add_argument("--warmup", type=int, default=25, help="producer shapes: seconds not counted")
    parser.add_argument("--calibration-out", type=Path, help="calibration shapes: keep the real figures here")
    args = parser.parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = set(shapes) - set(SHAPE_NAMES)
    if unknown:
        raise SystemExit(f"unknown shape(s) {sorted(unknown)}; known: {', '.join(SHAPE_NAMES)}")
    calibrations = [s for s in shapes if s in calibration.CALIBRATIONS]
    shapes = [s for s in shapes if s not in calibration.CALIBRATIONS]
    before = Path("/proc/loadavg").read_text().split()[0]
    rounds = []
    real: dict[str, list[calibration.Side]] = {name: [] for name in calibrations}
    with (tempfile.TemporaryDirectory(prefix="kqp-system-test-") as tmp,
          clusters(Path(tmp), shapes + calibrations) as (one, three)):
        for index in range(args.rounds):
            workdir = Path(tmp) / f"round-{index}"
            workdir.mkdir()
            rounds.append(run_round(one, three, workdir, shapes, index, args.seconds, args.warmup))
            for name in calibrations:
                progress(f"round {index + 1}, {name}: the real client straight to Kafka")
                real[name].append(calibration.run_real(one, workdir, name))
                progress(f"round {index + 1}, {name}: {real[name][-1]}")
            if shapes:
                text, _ = report(rounds, shapes, (before, Path("/proc/loadavg").read_text().split()[0]))
                progress(f"after round {index + 1}:\n{text}")
    load = (before, Path("/proc/loadavg").read_text().split()[0])
    passed = True
    if shapes:
        text, passed = report(rounds, shapes, load)
        print(text, flush=True)
    if calibrations:
        if args.calibration_out is not None:
            calibration.save(real, args.calibration_out, load)
        text, calibrated = calibration.report(real, calibrations)
        print(f"calibration: {len(rounds)} round(s) of the real clients, load average {load[0]} before, "
              f"{load[1]} after; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; models over seeds "
              f"{calibration.SEEDS[0]}-{calibration.SEEDS[-1]}.\n\n{text}", flush=True)
        passed = passed and calibrated
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
