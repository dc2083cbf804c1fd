"""The client shapes of issue 25, each through kqp and beside Kafka's own broker enforcing the
same quota for the same clients: `bench/quota_accuracy.py --scenario shapes` runs them.

Every producer is librdkafka (confluent-kafka) as an application configures it: a 64 MB queue
(`queue.buffering.max.kbytes`, its default is larger), linger.ms 5, acks=all (the default),
1 KB records, its offer paced second by second; what does not fit the queue waits, as an
application's would. What counts is what was acknowledged in the measured seconds (from
--warmup to --seconds); the backlog left in the clients at the end is purged, not counted.
Request time-outs are librdkafka's own count (`req_timeouts` in its statistics, summed over
its brokers).

Kafka's figure comes from a one-broker cluster enforcing `producer_byte_rate` (kafka-configs)
for client-id `broker-limited`, the proxy out of the path: for the fleet, --workers and
scope-cluster shapes that is what one broker does with the same producers (a broker quota on
three brokers would give three quotas). KIP-599 seed example A sends CreateTopics v7, 7 topics
x 80 partitions, with `controller_mutation_rate: 5`, in KIP599_PAIRS pairs (kqp, the broker).

`--kqp-set key=value` (repeatable) sets a dotted key in every kqp config file this bench writes
(e.g. `--kqp-set enforcement.some_setting=true`), the value read as YAML, so a setting added
later can be measured without editing the bench.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Producer

from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess
from tests.integration.helpers.fleet import CLIENT_ID as FLEET_CLIENT_ID
from tests.integration.helpers.fleet import fleet_config, wait_for_fleet
from tests.integration.helpers.mutations import THROTTLING_QUOTA_EXCEEDED, create_topics_raw

QUOTA = 1024 * 1024  # bytes/s
RECORD_SIZE = 1024
QUEUE_KBYTES = 64 * 1024
BROKER_CLIENT_ID = "broker-limited"
SHAPES = ("ten-producers", "fleet", "workers", "cluster-one", "kip599", "workers-n")
# What `--scenario shapes` runs unless --shapes names others (`workers-n` takes four runs: opt-in).
DEFAULT_SHAPES = ("ten-producers", "fleet", "workers", "cluster-one", "kip599")
# `workers-n`: the `workers` shape through --workers 1, then each of these (issue 33).
WORKER_COUNTS = (2, 4)


@dataclass
class ProducerTally:
    per_second: list[int]
    request_timeouts: int = 0


@dataclass
class ShapeResult:
    shape: str
    side: str  # "kqp" or "Kafka"
    shares: list[float] = field(default_factory=list)  # per producer, x quota, measured seconds
    request_timeouts: int = 0
    note: str = ""
    # The total over whole throttling cycles (x quota), when the traffic came in cycles.
    cycles: float | None = None
    cycle_span: tuple[int, int] | None = None
    # The mean over shifted windows (x quota, `shifted_mean`): what the phase of the cycles
    # does not move. Printed beside the plain figure, never a bound of its own.
    shifted: float | None = None

    @property
    def total(self) -> float:
        return sum(self.shares)


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# Window starts the shifted mean averages over: one throttling cycle of ten producers under a
# 1 MiB/s quota (a window's worth admitted at once about every 11-12 s, Kafka's and kqp's alike).
SHIFTS = 12


def shifted_mean(per_second: Sequence[int], warmup_s: int, seconds: int, shifts: int = SHIFTS) -> float | None:
    """The mean of the acknowledged rate over `shifts` windows of one length, their starts one
    second apart and centred on `warmup_s`, the last one ending at `seconds` (bytes/s, as a
    fraction of QUOTA). A throttled shape admits a window's worth at once once a cycle; whether
    that burst falls just inside or just outside the measured seconds moves the plain mean by up
    to a burst over the span (10 MB over 65 s: 0.15x). Over starts spread across a whole cycle
    every burst counts at its share, whatever its phase. None when the run is too short."""
    first = warmup_s - shifts // 2
    length = seconds - (first + shifts - 1)
    if first < 0 or length <= 0:
        return None
    return sum(sum(per_second[w:w + length]) / length for w in range(first, first + shifts)) / shifts / QUOTA


# ---- kqp configs -------------------------------------------------------------------------

def set_dotted(config: dict[str, Any], key: str, value: Any) -> None:
    node = config
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def parse_overrides(pairs: Sequence[str]) -> list[tuple[str, Any]]:
    overrides = []
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--kqp-set wants key=value, got {pair!r}")
        overrides.append((key, yaml.safe_load(raw)))
    return overrides


def with_overrides(path: Path, overrides: Sequence[tuple[str, Any]]) -> Path:
    """The config file at `path` with every --kqp-set applied (rewritten in place)."""
    if overrides:
        config = yaml.safe_load(path.read_text()) or {}
        for key, value in overrides:
            set_dotted(config, key, value)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def producer_config(path: Path, client_id: str, scope: str) -> Path:
    path.write_text(
        "quotas:\n"
        f"  scope: {scope}\n"
        "  entries:\n"
        f"    - entity: {{client-id: {client_id}}}\n"
        f"      producer_byte_rate: {QUOTA}\n"
    )
    return path


# ---- producers ---------------------------------------------------------------------------

def paced_producer(bootstrap: str, topic: str, client_id: str, offered: float, seconds: float, start: float,
                   tally: ProducerTally, stop: threading.Event) -> None:
    """Offer `offered` bytes/s from `start` for `seconds`; tally acknowledgements per second."""
    def on_stats(raw: str) -> None:
        brokers = json.loads(raw).get("brokers", {})
        tally.request_timeouts = sum(int(b.get("req_timeouts", 0)) for b in brokers.values())

    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "linger.ms": 5,
                         "queue.buffering.max.kbytes": QUEUE_KBYTES, "statistics.interval.ms": 1000,
                         "stats_cb": on_stats})
    payload = b"x" * RECORD_SIZE

    def on_delivery(error: object, _message: object) -> None:
        second = int(time.monotonic() - start)
        if error is None and 0 <= second < len(tally.per_second):
            tally.per_second[second] += RECORD_SIZE

    sent = 0
    while not stop.is_set() and (now := time.monotonic()) < start + seconds:
        due = int(offered * (now - start)) - sent
        while due >= RECORD_SIZE:
            try:
                producer.produce(topic, payload, on_delivery=on_delivery)
            except BufferError:
                break  # the 64 MB queue is full: the offer waits, as an application's would
            sent += RECORD_SIZE
            due -= RECORD_SIZE
        producer.poll(0.005)
    producer.poll(1.2)  # one more statistics report
    producer.purge()  # the backlog is not part of the measurement
    producer.flush(10)


def run_producers(bootstraps: Sequence[str], topic: str, client_id: str, offered: float, seconds: float,
                  warmup_s: int, shape: str, side: str) -> ShapeResult:
    """One producer per bootstrap, all at once; their shares over the measured seconds."""
    progress(f"{shape}: {len(bootstraps)} producer(s) x {offered / QUOTA:.1f}x quota through {side}, {seconds:.0f} s")
    start = time.monotonic() + 1.0
    stop = threading.Event()
    tallies = [ProducerTally([0] * int(seconds)) for _ in bootstraps]
    threads = [threading.Thread(target=paced_producer, daemon=True,
                                args=(b, topic, client_id, offered, seconds, start, t, stop))
               for b, t in zip(bootstraps, tallies, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 60)
    stop.set()
    measured = int(seconds) - warmup_s
    shares = [sum(t.per_second[warmup_s:]) / measured / QUOTA for t in tallies]
    result = ShapeResult(shape, side, shares, sum(t.request_timeouts for t in tallies))
    # Throttled clients come back in cycles of about a quota window: a plain mean moves by
    # several percent with where its edges cut a cycle, the mean over whole cycles does not.
    total = [sum(t.per_second[s] for t in tallies) for s in range(int(seconds))]
    starts = [s for s in range(max(warmup_s, 3), int(seconds))
              if total[s] > QUOTA and max(total[s - 3:s]) < QUOTA]
    result.shifted = shifted_mean(total, warmup_s, int(seconds))
    if len(starts) >= 2:
        result.cycles = sum(total[starts[0]:starts[-1]]) / (starts[-1] - starts[0]) / QUOTA
        result.cycle_span = (starts[0], starts[-1])
    cycles = f" ({result.cycles:.3f}x over whole cycles)" if result.cycles is not None else ""
    if result.shifted is not None:
        cycles += f" ({result.shifted:.3f}x over shifted windows)"
    progress(f"  {side}: {result.total:.3f}x in total{cycles}, shares {[round(s, 2) for s in shares]}, "
             f"{result.request_timeouts} request time-outs")
    return result


# ---- the shapes --------------------------------------------------------------------------

@contextmanager
def proxies(*processes: ProxyProcess) -> Iterator[list[ProxyProcess]]:
    with ExitStack() as stack:
        started = []
        for process in processes:
            started.append(process.start())
            stack.callback(process.stop)
        yield started


def kafka_side(one_broker: KafkaCluster, topic: str, producers: int, offered: float, seconds: float,
               warmup_s: int, shape: str) -> ShapeResult:
    return run_producers([one_broker.bootstrap] * producers, topic, BROKER_CLIENT_ID, offered, seconds, warmup_s,
                         shape, "Kafka")


def ten_producers(one_broker: KafkaCluster, workdir: Path, overrides: Sequence[tuple[str, Any]], seconds: float,
                  warmup_s: int) -> list[ShapeResult]:
    shape = "10 producers x 1x, one client-id, one proxy, 1 broker"
    config = with_overrides(producer_config(workdir / "ten.yaml", "limited", "broker"), overrides)
    with proxies(ProxyProcess(one_broker.bootstrap, workdir / "ten.log", config=config)) as (proxy,):
        kqp = run_producers([proxy.bootstrap] * 10, "shapes", "limited", QUOTA, seconds, warmup_s, shape, "kqp")
    return [kqp, kafka_side(one_broker, "shapes", 10, QUOTA, seconds, warmup_s, shape)]


def fleet(one_broker: KafkaCluster, three_brokers: KafkaCluster, workdir: Path,
          overrides: Sequence[tuple[str, Any]], seconds: float, warmup_s: int) -> list[ShapeResult]:
    shape = "3 producers x 1.5x, 3 fleet instances, scope cluster, 3 brokers"
    configs = [with_overrides(fleet_config(workdir / f"fleet-{i}.yaml", "kqp-shapes-usage", quota=QUOTA), overrides)
               for i in range(3)]
    instances = [ProxyProcess(three_brokers.bootstrap, workdir / f"fleet-{i}.log", config=c)
                 for i, c in enumerate(configs)]
    with proxies(*instances) as started:
        wait_for_fleet(started)
        kqp = run_producers([p.bootstrap for p in started], "shapes-6", FLEET_CLIENT_ID, 1.5 * QUOTA, seconds,
                            warmup_s, shape, "kqp")
    return [kqp, kafka_side(one_broker, "shapes", 3, 1.5 * QUOTA, seconds, warmup_s, shape)]


def workers(one_broker: KafkaCluster, three_brokers: KafkaCluster, workdir: Path,
            overrides: Sequence[tuple[str, Any]], seconds: float, warmup_s: int) -> list[ShapeResult]:
    shape = "3 producers x 0.5x, --workers 2, scope cluster, 3 brokers"
    config = with_overrides(fleet_config(workdir / "workers.yaml", "kqp-shapes-usage", enabled=False, quota=QUOTA),
                            overrides)
    with proxies(ProxyProcess(three_brokers.bootstrap, workdir / "workers.log", config=config, workers=2)) as (p,):
        kqp = run_producers([p.bootstrap] * 3, "shapes-6", FLEET_CLIENT_ID, 0.5 * QUOTA, seconds, warmup_s, shape,
                            "kqp")
    return [kqp, kafka_side(one_broker, "shapes", 3, 0.5 * QUOTA, seconds, warmup_s, shape)]


def workers_n(one_broker: KafkaCluster, three_brokers: KafkaCluster, workdir: Path,
              overrides: Sequence[tuple[str, Any]], seconds: float, warmup_s: int,
              counts: Sequence[int] = WORKER_COUNTS) -> list[ShapeResult]:
    """The `workers` shape through `--workers 1` (one process: the figure to match), then through
    each of `counts`, then Kafka's broker. With `--busy N`, N CPU loops compete for the cores
    during every run, Kafka's included."""
    results = []
    for count in (1, *counts):
        shape = f"3 producers x 0.5x, --workers {count}, scope cluster, 3 brokers"
        config = with_overrides(fleet_config(workdir / f"workers-{count}.yaml", "kqp-shapes-usage", enabled=False,
                                             quota=QUOTA), overrides)
        with proxies(ProxyProcess(three_brokers.bootstrap, workdir / f"workers-{count}.log", config=config,
                                  workers=count)) as (p,):
            results.append(run_producers([p.bootstrap] * 3, "shapes-6", FLEET_CLIENT_ID, 0.5 * QUOTA, seconds,
                                         warmup_s, shape, "kqp"))
    results.append(kafka_side(one_broker, "shapes", 3, 0.5 * QUOTA, seconds, warmup_s,
                              "3 producers x 0.5x, one Kafka broker"))
    return results


@contextmanager
def busy_loops(count: int) -> Iterator[None]:
    """`count` processes that spin on a core each until the block ends (a host doing other work)."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    if loops:
        progress(f"{count} busy CPU loops running (pids {[p.pid for p in loops]})")
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def cluster_one(one_broker: KafkaCluster, three_brokers: KafkaCluster, workdir: Path,
                overrides: Sequence[tuple[str, Any]], seconds: float, warmup_s: int) -> list[ShapeResult]:
    shape = "1 producer x 1.5x, scope cluster, 3 brokers, one instance"
    config = with_overrides(producer_config(workdir / "cluster-one.yaml", "limited", "cluster"), overrides)
    with proxies(ProxyProcess(three_brokers.bootstrap, workdir / "cluster-one.log", config=config)) as (proxy,):
        kqp = run_producers([proxy.bootstrap], "shapes-6", "limited", 1.5 * QUOTA, seconds, warmup_s, shape, "kqp")
    return [kqp, kafka_side(one_broker, "shapes", 1, 1.5 * QUOTA, seconds, warmup_s, shape)]


KIP599_PAIRS = 5


def kip599(one_broker: KafkaCluster, workdir: Path, overrides: Sequence[tuple[str, Any]]) -> list[ShapeResult]:
    """Seed example A, KIP599_PAIRS times on each side, each time a fresh client-id (a full
    bucket) under the client-id default quota, kqp and Kafka alternating which goes first: one
    request's throttle moves with the controller's commit time, by tens of ms on a loaded
    machine, so one pair says little."""
    shape = "KIP-599 seed example A: rate 5, 11 x 1 s, CreateTopics 7 x 80"
    config = workdir / "kip599.yaml"
    config.write_text("quotas:\n  entries:\n    - entity: {client-id: <default>}\n      controller_mutation_rate: 5\n")
    with_overrides(config, overrides)
    broker_port = int(one_broker.bootstrap.rsplit(":", 1)[1])
    throttles: dict[str, list[int]] = {"kqp": [], "Kafka": []}
    outcomes: dict[str, set[tuple[int, int]]] = {"kqp": set(), "Kafka": set()}
    with proxies(ProxyProcess(one_broker.bootstrap, workdir / "kip599.log", config=config)) as (proxy,):
        # The cluster's first CreateTopics is slower (a cold controller path): one per path
        # before the quota is set, so that no measured request is that one.
        for port in (broker_port, proxy.bootstrap_port):
            create_topics_raw(port, "warm-up", [f"kip599-warm-up-{port}"], 1)
        one_broker.run_tool("kafka.admin.ConfigCommand", "--bootstrap-server", one_broker.bootstrap, "--alter",
                            "--add-config", "controller_mutation_rate=5", "--entity-type", "clients",
                            "--entity-default")
        time.sleep(1)  # the broker applies the quota from the metadata log
        sides = [("kqp", proxy.bootstrap_port), ("Kafka", broker_port)]
        for pair in range(KIP599_PAIRS):
            for side, port in sides if pair % 2 == 0 else sides[::-1]:
                client_id = f"creator-{side}-{pair}"
                response: Any = create_topics_raw(port, client_id, [f"{client_id}-{i}" for i in range(7)], 80)
                errors = [t.error_code for t in response.topics]
                throttles[side].append(response.throttle_time_ms)
                outcomes[side].add((errors.count(0), errors.count(THROTTLING_QUOTA_EXCEEDED)))
    differences = [k - b for k, b in zip(throttles["kqp"], throttles["Kafka"], strict=True)]
    results = []
    for side in ("kqp", "Kafka"):
        values = throttles[side]
        topics = "; ".join(f"{created} created, {refused} x error 89" for created, refused in sorted(outcomes[side]))
        note = f"throttle median {statistics.median(values):.0f} ms ({min(values)}-{max(values)}); {topics}"
        if side == "kqp":
            note += f"; kqp - Kafka per pair {differences}, median {statistics.median(differences):.0f} ms"
        progress(f"{shape}: {side} {note}")
        results.append(ShapeResult(shape, side, note=note))
    return results


def run_shapes(workdir: Path, selected: Sequence[str], overrides: Sequence[tuple[str, Any]], seconds: float,
               warmup_s: int, busy: int = 0) -> list[ShapeResult]:
    """The selected shapes; with `busy`, that many CPU loops run through every measurement (not
    through the clusters' start)."""
    if seconds <= warmup_s:
        raise SystemExit(f"--seconds ({seconds}) must be longer than --warmup ({warmup_s})")
    results: list[ShapeResult] = []
    with ExitStack() as stack:
        one_broker = stack.enter_context(KafkaCluster(nodes=1, workdir=workdir / "kafka-1"))
        one_broker.create_topic("shapes", partitions=3, replication=1)
        one_broker.run_tool("kafka.admin.ConfigCommand", "--bootstrap-server", one_broker.bootstrap, "--alter",
                            "--add-config", f"producer_byte_rate={QUOTA}", "--entity-type", "clients",
                            "--entity-name", BROKER_CLIENT_ID)
        three_brokers: KafkaCluster | None = None
        if set(selected) & {"fleet", "workers", "cluster-one", "workers-n"}:
            three_brokers = stack.enter_context(KafkaCluster(nodes=3, workdir=workdir / "kafka-3"))
            three_brokers.create_topic("shapes-6", partitions=6, replication=1)
        runners: dict[str, Callable[[], list[ShapeResult]]] = {
            "ten-producers": lambda: ten_producers(one_broker, workdir, overrides, seconds, warmup_s),
            "kip599": lambda: kip599(one_broker, workdir, overrides),
        }
        if three_brokers is not None:
            three = three_brokers
            runners["fleet"] = lambda: fleet(one_broker, three, workdir, overrides, seconds, warmup_s)
            runners["workers"] = lambda: workers(one_broker, three, workdir, overrides, seconds, warmup_s)
            runners["workers-n"] = lambda: workers_n(one_broker, three, workdir, overrides, seconds, warmup_s)
            runners["cluster-one"] = lambda: cluster_one(one_broker, three, workdir, overrides, seconds, warmup_s)
        with busy_loops(busy):
            for name in SHAPES:
                if name in selected:
                    results += runners[name]()
    return results


def shapes_report(results: Sequence[ShapeResult], seconds: float, warmup_s: int,
                  overrides: Sequence[tuple[str, Any]]) -> str:
    settings = ", ".join(f"{k}={v}" for k, v in overrides) or "none"
    lines = [
        f"Quota {QUOTA} B/s; {seconds:.0f} s per run, acknowledged bytes counted in seconds {warmup_s}-{seconds:.0f}; "
        f"librdkafka, 64 MB queue, linger.ms 5, acks=all, 1 KB records; kqp settings: {settings}.",
        "",
        "| shape | kqp total (x quota) | kqp per producer | kqp request time-outs "
        "| Kafka total | Kafka per producer | Kafka request time-outs |",
        "|---|---|---|---|---|---|---|",
    ]
    by_shape: dict[str, dict[str, ShapeResult]] = {}
    for result in results:
        by_shape.setdefault(result.shape, {})[result.side] = result
    for shape, sides in by_shape.items():
        cells = []
        for side in ("kqp", "Kafka"):
            r = sides.get(side)
            if r is None:
                cells += ["-", "-", "-"]
            elif r.note:
                cells += [r.note, "", ""]
            else:
                shares = " / ".join(f"{s:.2f}" for s in r.shares)
                total = f"{r.total:.3f}"
                if r.cycles is not None and r.cycle_span is not None:
                    total += f" ({r.cycles:.3f} over whole cycles, s {r.cycle_span[0]}-{r.cycle_span[1]})"
                cells += [total, shares, str(r.request_timeouts)]
        lines.append(f"| {shape} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
