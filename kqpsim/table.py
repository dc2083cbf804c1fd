"""The scenario table (shape x settings) and what every scenario-seed must show.

`make test` runs each row for its seeds (tests/unit/simulator/test_scenarios.py);
`bench/simulator.py` runs the same rows for thousands of seeds. A row that shows a known
difference from Kafka carries a `Finding`: the seeds of `make test` that show it, and for each
kind of violation it shows, the band kqp's figure and Kafka's figure were measured in. On those
seeds the test asserts exactly that (the violations are of the finding's kinds, each figure in
its band); any other violation, a figure out of its band, a crash, or a finding that no longer
shows fails the suite. Every other seed must show no violation at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kqpsim.clients import CLIENT_SHAPES
from kqpsim.scenario import KIB, MIB, Outcome, Scenario

# What a violation is about; each kind has one figure, measured for kqp and for Kafka's model
# (`figures`): "over"/"under": a client-id's admitted rate as a multiple of its quota (kqp's
# highest or lowest client-id, Kafka's mean); "fairness": the poorest connection's share of an
# equal split; "timeouts": request time-outs; "request-rate": under a request quota, the
# highest client-id's admitted KiB/s.
Kind = Literal["over", "under", "fairness", "timeouts", "request-rate"]


@dataclass(frozen=True, slots=True)
class Violation:
    kind: Kind
    text: str

    def __str__(self) -> str:
        return self.text


def figures(kind: Kind, outcome: Outcome) -> tuple[float, float]:
    """kqp's figure and Kafka's for a kind of violation."""
    kqp, kafka, quota = outcome.kqp, outcome.kafka, outcome.scenario.quota
    if kind == "over":
        return max(kqp.client_rates) / quota, kafka.admitted
    if kind == "under":
        return min(kqp.client_rates) / quota, kafka.admitted
    if kind == "fairness":
        return kqp.fairness, kafka.fairness
    if kind == "timeouts":
        return kqp.timeouts, kafka.timeouts
    return max(kqp.client_rates) / KIB, max(kafka.client_rates) / KIB

# With fair_connection_turns the connections of one budget take turns: none may get less than
# this share of an equal split.
FAIR_TURNS_SHARE = 0.9
# Without it kqp is Kafka's (each connection throttled on its own): no connection may fare worse
# than Kafka's poorest one by more than this share of an equal split. Which connection loses
# a throttle race is phase, and Kafka's own poorest share moves by as much from seed to seed
# (0.31 to 0.64 for five Java producers, librdkafka's from 0.46 to 0.51 for ten).
FAIRNESS_SLACK = 0.25


def violations(outcome: Outcome) -> list[Violation]:
    """What an operator would object to in this scenario-seed; empty when kqp behaves."""
    scenario, kqp, kafka = outcome.scenario, outcome.kqp, outcome.kafka
    tolerance = scenario.tolerance
    found: list[Violation] = []
    if scenario.request_percentage:
        found.extend(_request_quota_violations(outcome))
    kafka_rate = kafka.admitted
    for index, rate in enumerate(kqp.client_rates if not scenario.request_percentage else ()):
        admitted = rate / scenario.quota
        # Over: beyond the quota only as far as Kafka itself goes beyond it.
        ceiling = max(1.0, kafka_rate) + tolerance
        if admitted > ceiling:
            found.append(Violation("over", f"client-{index} admitted {admitted:.3f}x the quota, over max(quota, "
                                   f"Kafka's {kafka_rate:.3f}x) + {tolerance:.3f}"))
        # Under: short of the quota only as far as Kafka itself falls short (demand saturates).
        floor = min(1.0, kafka_rate) - tolerance
        if admitted < floor:
            found.append(Violation("under", f"client-{index} admitted {admitted:.3f}x the quota, under min(quota, "
                                   f"Kafka's {kafka_rate:.3f}x) - {tolerance:.3f}"))
    if scenario.connections > 1:
        if scenario.fair_connection_turns:
            if kqp.fairness < FAIR_TURNS_SHARE:
                found.append(Violation("fairness", f"with fair_connection_turns the poorest connection got "
                                       f"{kqp.fairness:.2f} of an equal share (< {FAIR_TURNS_SHARE})"))
        elif kqp.fairness < kafka.fairness - FAIRNESS_SLACK:
            found.append(Violation("fairness", f"the poorest connection got {kqp.fairness:.2f} of an equal share, "
                                   f"Kafka's {kafka.fairness:.2f} (slack {FAIRNESS_SLACK})"))
    if kqp.timeouts > kafka.timeouts:
        found.append(Violation("timeouts", f"{kqp.timeouts} request time-outs through kqp, {kafka.timeouts} against "
                               f"Kafka (longest waits {kqp.max_wait_s:.1f} s and {kafka.max_wait_s:.1f} s)"))
    return found


def _request_quota_violations(outcome: Outcome) -> list[Violation]:
    """With a request quota (KIP-124) binding, the byte rate is what the request time allows:
    kqp's must be Kafka's, within 5 % and what one request per connection at each edge of the
    span is worth at Kafka's rate."""
    scenario, kqp, kafka = outcome.scenario, outcome.kqp, outcome.kafka
    found: list[Violation] = []
    for index, (rate, kafka_rate) in enumerate(zip(kqp.client_rates, kafka.client_rates, strict=True)):
        if kafka_rate <= 0:
            found.append(Violation("request-rate", f"client-{index}: Kafka's model admitted nothing"))
            continue
        edges = 2.0 * scenario.connections * scenario.request_bytes / (kafka_rate * scenario.measure)
        ratio = rate / kafka_rate
        if abs(ratio - 1.0) > 0.05 + edges:
            found.append(Violation("request-rate", f"client-{index} admitted {ratio:.3f}x Kafka's rate under the "
                                   f"request quota ({rate / 1024:.1f} KiB/s, Kafka {kafka_rate / 1024:.1f} KiB/s; "
                                   f"tolerance {0.05 + edges:.3f})"))
    return found


@dataclass(frozen=True, slots=True)
class Band:
    """A figure of a finding (see `figures`) as measured on its seeds: kqp's within `kqp`,
    Kafka's model's within `kafka` (inclusive bounds, the measured extremes rounded outwards)."""

    kind: Kind
    kqp: tuple[float, float]
    kafka: tuple[float, float]

    def misses(self, outcome: Outcome) -> str | None:
        kqp, kafka = figures(self.kind, outcome)
        if self.kqp[0] <= kqp <= self.kqp[1] and self.kafka[0] <= kafka <= self.kafka[1]:
            return None
        return (f"{self.kind}: kqp {kqp:.3f} (band {self.kqp[0]}-{self.kqp[1]}), Kafka {kafka:.3f} "
                f"(band {self.kafka[0]}-{self.kafka[1]})")


@dataclass(frozen=True, slots=True)
class Finding:
    """A known difference from Kafka: what it is, the seeds of `make test` that show it (the
    simulation is deterministic, so exactly these), and the band of each figure it shows."""

    text: str
    seeds: frozenset[int]
    bands: tuple[Band, ...]

    @property
    def kinds(self) -> frozenset[Kind]:
        return frozenset(band.kind for band in self.bands)


@dataclass(frozen=True, slots=True)
class Row:
    scenario: Scenario
    seeds: int  # how many seeds `make test` runs (0 .. seeds-1); the bench runs more
    finding: Finding | None = None  # None: every seed must show no violation


def unexplained(row: Row, seed: int, outcome: Outcome) -> list[str]:
    """What this scenario-seed shows that its row does not expect; empty when it is as expected.

    Outside the finding's seeds: every violation. On them: a violation of another kind, a
    figure out of its band, or no violation at all (the finding is gone: take it off the row)."""
    found = violations(outcome)
    finding = row.finding
    if finding is None or seed not in finding.seeds:
        return [str(v) for v in found]
    problems = [f"not the finding's kind: {v}" for v in found if v.kind not in finding.kinds]
    problems.extend(f"out of the finding's band: {miss}" for band in finding.bands
                    if (miss := band.misses(outcome)) is not None)
    if not found:
        problems.append(f"the finding no longer shows on seed {seed}: take it off the row ({finding.text})")
    return problems


def _rows() -> list[Row]:
    rows: list[Row] = []
    add = rows.append
    # One client over 1-20 connections, each client model, fair turns off and on.
    for connections, seeds in ((1, 12), (2, 12), (5, 10), (10, 3), (20, 1)):
        for fair in (False, True):
            if connections == 1 and fair:
                continue
            add(Row(Scenario("librdkafka", connections, quota=1 * MIB, request_bytes=64 * KIB,
                             fair_connection_turns=fair), seeds))
    for connections, seeds in ((1, 8), (5, 8), (10, 2)):
        for fair in (False, True):
            if connections == 1 and fair:
                continue
            add(Row(Scenario("java-producer", connections, quota=1 * MIB, request_bytes=64 * KIB,
                             fair_connection_turns=fair), seeds))
    for connections in (1, 4):
        add(Row(Scenario("aiokafka", connections, quota=256 * KIB, request_bytes=16 * KIB), 12))
    add(Row(Scenario("aiokafka", 4, quota=256 * KIB, request_bytes=16 * KIB, fair_connection_turns=True), 8))
    # Fetching consumers.
    add(Row(Scenario("consumer", 1, quota=1 * MIB, request_bytes=1 * MIB), 20))
    add(Row(Scenario("consumer", 3, quota=1 * MIB, request_bytes=256 * KIB), 12, finding=Finding(
        "fetch over 3 connections of one client-id, 256 KiB fetches: the poorest connection gets 0.52 of an "
        "equal share through kqp, 0.82 against Kafka's model (seed 9; seeds 0 and 6 agree since a throttled "
        "fetch is answered empty)",
        seeds=frozenset({9}),
        bands=(
            Band("fairness", kqp=(0.49, 0.52), kafka=(0.78, 0.82)),
        ))))
    add(Row(Scenario("consumer", 3, quota=1 * MIB, request_bytes=1 * MIB), 12))
    add(Row(Scenario("consumer", 3, quota=1 * MIB, request_bytes=256 * KIB, fair_connection_turns=True), 12))
    add(Row(Scenario("consumer", 2, quota=10 * MIB, request_bytes=4 * MIB), 4))
    # Several client-ids on one broker, each with its own quota.
    add(Row(Scenario("librdkafka", 2, client_ids=3, quota=1 * MIB, request_bytes=128 * KIB), 8, finding=Finding(
        "3 client-ids x 2 librdkafka connections, 128 KiB requests: the poorest connection gets 0.58 of an "
        "equal share through kqp, 0.86 against Kafka's model",
        seeds=frozenset({0, 1, 3}),
        bands=(
            Band("fairness", kqp=(0.58, 0.59), kafka=(0.86, 0.87)),
        ))))
    add(Row(Scenario("java-producer", 1, client_ids=4, quota=512 * KIB, request_bytes=64 * KIB), 8))
    # Quotas from 64 KiB/s to 100 MiB/s, requests from 1 KB to several seconds of the quota.
    add(Row(Scenario("librdkafka", 1, quota=64 * KIB, request_bytes=1 * KIB), 2))
    add(Row(Scenario("librdkafka", 2, quota=64 * KIB, request_bytes=8 * KIB), 12))
    add(Row(Scenario("librdkafka", 2, quota=64 * KIB, request_bytes=128 * KIB), 12, finding=Finding(
        "librdkafka over 2 connections at 64 KiB/s, requests of 2 s of quota: 1-2 request time-outs through "
        "kqp (longest wait 27-30 s), none against Kafka's model (28 s)",
        seeds=frozenset({2, 7}),
        bands=(
            Band("timeouts", kqp=(1, 2), kafka=(0, 0)),
        ))))
    add(Row(Scenario("librdkafka", 1, quota=64 * KIB, request_bytes=192 * KIB), 12, finding=Finding(
        "librdkafka, one connection at 64 KiB/s, requests of 3 s of quota: kqp admits 1.140x the quota where "
        "Kafka's model admits 1.068x (tolerance 0.058)",
        seeds=frozenset({8}),
        bands=(
            Band("over", kqp=(1.139, 1.14), kafka=(1.067, 1.068)),
        ))))
    add(Row(Scenario("java-producer", 2, quota=64 * KIB, request_bytes=192 * KIB), 8, finding=Finding(
        "Java producer over 2 connections at 64 KiB/s, requests of 3 s of quota: 2-7 request time-outs "
        "through kqp, 1 against Kafka's model",
        seeds=frozenset({0, 3, 4, 5, 7}),
        bands=(
            Band("timeouts", kqp=(2, 7), kafka=(1, 1)),
        ))))
    add(Row(Scenario("librdkafka", 5, quota=10 * MIB, request_bytes=1 * MIB), 2))
    add(Row(Scenario("librdkafka", 4, quota=100 * MIB, request_bytes=1 * MIB, warmup_s=12, measure_s=20), 1))
    # Timing faults: network jitter, a busy host whose loop runs late.
    for connections in (1, 5):
        add(Row(Scenario("librdkafka", connections, quota=1 * MIB, request_bytes=64 * KIB, jitter_s=0.005), 8))
        add(Row(Scenario("librdkafka", connections, quota=1 * MIB, request_bytes=64 * KIB, loop_delay_s=0.02,
                         loop_delay_chance=0.05), 8))
        add(Row(Scenario("java-producer", connections, quota=1 * MIB, request_bytes=64 * KIB, loop_delay_s=0.1,
                         loop_delay_chance=0.01), 8))
    add(Row(Scenario("librdkafka", 5, quota=1 * MIB, request_bytes=64 * KIB, fair_connection_turns=True,
                     loop_delay_s=0.02, loop_delay_chance=0.05), 8))
    # KIP-124 request_percentage binding (the byte quota far away), a broker that takes 10-20 ms
    # per request: the proxy charges the round trip it measures, Kafka the handling time.
    add(Row(Scenario("librdkafka", 2, quota=100 * MIB, request_bytes=64 * KIB, request_percentage=2,
                     broker_latency_s=0.01), 8))
    add(Row(Scenario("java-producer", 2, quota=100 * MIB, request_bytes=64 * KIB, request_percentage=5,
                     broker_latency_s=0.02), 8))
    add(Row(Scenario("consumer", 2, quota=100 * MIB, request_bytes=256 * KIB, request_percentage=2,
                     broker_latency_s=0.01), 2))
    # KIP-599 controller_mutation_rate (partitions/s): Java Admin clients creating topics
    # (CreateTopics v7, strict), `request_bytes` being each topic's partitions.
    add(Row(Scenario("admin", 1, quota=5, request_bytes=10), 12))
    add(Row(Scenario("admin", 3, quota=5, request_bytes=10), 12))
    add(Row(Scenario("admin", 2, client_ids=2, quota=50, request_bytes=80), 8))
    # Fleets of 2-5 instances and --workers (instances a few ms apart) sharing one budget through
    # the usage exchange, a client's connections spread over them; Kafka's figure is one broker's.
    add(Row(Scenario("librdkafka", 10, quota=1 * MIB, request_bytes=64 * KIB, instances=2), 3))
    add(Row(Scenario("librdkafka", 10, quota=1 * MIB, request_bytes=64 * KIB, instances=5), 2))
    add(Row(Scenario("librdkafka", 10, quota=1 * MIB, request_bytes=64 * KIB, instances=5,
                     count_other_instances=True), 3))
    # An exchange slower than its report interval (100 ms) is where the fleet's estimate of what
    # the others admitted meanwhile stops covering the lag (kqp.quotas.fleet, docs/scaling.md).
    add(Row(Scenario("librdkafka", 4, quota=1 * MIB, request_bytes=64 * KIB, instances=2,
                     exchange_lag_s=0.5), 3, finding=Finding(
        "a fleet of 2 with a slow exchange (lag 500 ms, five report intervals), 4 librdkafka connections: kqp "
        "admits 1.095-1.188x the quota, one Kafka broker 0.935x; poorest connection 0.28-0.69 (Kafka 0.67-0.68)",
        seeds=frozenset({0, 1, 2}),
        bands=(
            Band("over", kqp=(1.094, 1.188), kafka=(0.934, 0.935)),
            Band("fairness", kqp=(0.28, 0.69), kafka=(0.67, 0.68)),
        ))))
    add(Row(Scenario("java-producer", 4, quota=1 * MIB, request_bytes=64 * KIB, instances=4), 3))
    add(Row(Scenario("java-producer", 4, quota=1 * MIB, request_bytes=64 * KIB, instances=4,
                     count_other_instances=True), 3))
    add(Row(Scenario("consumer", 4, quota=1 * MIB, request_bytes=256 * KIB, instances=2), 4))
    add(Row(Scenario("librdkafka", 6, quota=1 * MIB, request_bytes=64 * KIB, instances=3,
                     exchange_lag_s=0.002), 3))
    # An instance that dies 40 s in (its connections drop, its reports stop; clients reconnect to
    # the others).
    add(Row(Scenario("librdkafka", 4, quota=1 * MIB, request_bytes=64 * KIB, instances=2, count_other_instances=True,
                     instance_dies_at_s=40), 6))
    add(Row(Scenario("java-producer", 4, quota=1 * MIB, request_bytes=64 * KIB, instances=3,
                     count_other_instances=True, instance_dies_at_s=40), 3))
    # An instance that stalls 40 s in (reads and reports nothing) for 2 s or 5 s. A stall of 20 s
    # starves its own connections for a third of the span, which the fairness check would
    # (rightly) count against the fault, not the product: not a row.
    add(Row(Scenario("librdkafka", 4, quota=1 * MIB, request_bytes=64 * KIB, instances=2, count_other_instances=True,
                     instance_stalls_at_s=40, stall_s=2), 6))
    add(Row(Scenario("java-producer", 4, quota=1 * MIB, request_bytes=64 * KIB, instances=2,
                     count_other_instances=True, instance_stalls_at_s=40, stall_s=5), 6))
    assert all(row.scenario.client in CLIENT_SHAPES for row in rows)
    return rows


ROWS = _rows()
