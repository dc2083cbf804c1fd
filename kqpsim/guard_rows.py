"""The cluster guard's rows of the simulator (issue 41, acceptance 1): brokers held at their limit.

A guard row is a shape of traffic (clients, each with its offer per broker, produce or fetch,
and its request size) in front of brokers with NW_IN and NW_OUT limits, run in virtual time
through the engine and the guard's own control loop (kqp.proxy.guard.GuardLoop, stepping every
second as `kqp serve` steps it). Each scenario-seed runs three phases:

1. *over*: the offered load is above a broker resource's limit for OVER_S seconds;
2. *stop*: the clients marked `noisy` stop (their backlog dropped, as a stopped producer's);
3. *under*: one noisy client comes back, the load under every limit.

What each seed must show (`violations`), the issue's acceptance 1, judged from three quota
windows after the overload starts: the load over every 11 s window within 0.95-1.05x the limit
of each resource the offer overloads; no oscillation of those windows beyond 10 % of the limit;
no flow whose offer is above its max-min fair share of the limit (water_fill on the offers, as
`advise` computes it) given less than 0.9 of that share on any broker; nobody throttled from 15 s
after the noisy stop on, while the offer is under the limits. The same traffic under a static
quota of the fair shares (configured quotas, no guard) is run beside and its figures printed
next to the guard's.

A fleet row (`instances` > 1, guard.fleet_wide) runs one engine and one guard loop per instance,
each client's connections through the instances it names, the instances stepping out of phase;
every REPORT_MS each instance takes its usage report and its guard deltas, and every other
instance applies them EXCHANGE_LAG_MS later, as the fleet exchange does through its topic
(kqp.proxy.fleet). Judged as every row, on the fleet's whole load per broker, and, beside it,
the instances' limits must agree within LIMITS_AGREE. Its static run shares the static quotas
through the same exchange (a fleet's configured quotas). A row may have an instance die: its
reports stop and its clients reconnect through another.

The clients behave as librdkafka's do at their defaults, as the wire test's producers:
a backlogged producer queues its offer (up to 64 MB, what the wire harness's queue holds) and,
whenever its connection to a broker is not muted, sends what is queued in one request of at most
its `request_bytes` per TICK_MS (librdkafka's `batch.size` is 1,000,000 bytes: a producer held
back for two seconds sends 1 MB at once; one that keeps up sends small batches, as `linger.ms`
does); a paced client (no backlog) sends its offer as it comes and loses what comes while it is
muted. A backlogged consumer fetches what has accumulated, up to `request_bytes` per request
(`max.partition.fetch.bytes`, 1 MiB), and a throttled fetch is answered empty, as Kafka answers
it. Each throttle mutes that client's connection to that broker for the throttle time (the
broker's muted channel and the client's own back-off run together).

The load a broker carries is modelled as the guard models it (fair_share's replication model):
the simulator has no replication of its own, so what is judged is the bytes the clients put on
the wire (produce on the leader, delivered fetch bytes) plus that model's follower traffic.

Kept in this file alone, beside the scenario table (table.py), so that the simulator's other
modules stay as they are.
"""

from __future__ import annotations

import json
import math
import random
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from kqp.config.quota_sections import GuardSection
from kqp.proxy.guard import GuardLoop
from kqp.quotas import QuotaEngine, QuotaSettings
from kqp.quotas.fair_share import (
    FETCH,
    NW_IN,
    NW_OUT,
    PRODUCE,
    Flow,
    Problem,
    replication_shares,
    water_fill,
)
from kqp.quotas.fleet import GuardDelta, UsageDelta
from kqp.quotas.guard_inputs import FlowKey
from kqp.quotas.settings import QuotaEntity, QuotaEntry, QuotaType

TICK_MS = 20
PACED_MS = 100  # a paced client's requests: one every 100 ms, what it offered since the last
WINDOW_S = 11  # quota.window.num x quota.window.size.seconds (the engine's defaults)
CONVERGED_S = 3 * WINDOW_S  # the issue's bound: converged within three quota windows
OVER_S = 80
STOP_S = 30
UNDER_S = 30
QUIET_AFTER_S = 15  # nobody throttled from this long after the noisy stop
QUEUE_CAP = 64 * 1024 * 1024  # the wire harness's producer queue
LIBRDKAFKA_BATCH = 1_000_000  # librdkafka's batch.size default
FETCH_MAX = 1024 * 1024  # max.partition.fetch.bytes default
SMALL_REQUEST = 65_536  # at most this per request: small batches, as linger.ms sends when keeping up
# fleet.report_interval_seconds' default until 2026-11-28. The default is now 50 ms, paced to twice
# the reports' round trip (kqp.quotas.fleet.ReportPacer): these rows and their KNOWN bands were
# measured at 100 ms and are not yet re-run at the new default (a report every 50 ms only narrows
# what an instance has not heard of).
REPORT_MS = 100
EXCHANGE_LAG_MS = 20  # the usage topic's round trip, on a cluster at hand

# The issue's acceptance 1.
LOAD_BAND = (0.95, 1.05)
OSCILLATION = 0.10
FAIR_SHARE_MIN = 0.9
# A fleet's instances compute the same limits (issue 41), within this share of the limit once
# converged: each measures the others a report interval plus the exchange's lag late (about 1 %
# of a quota window's bytes) and steps up to a second apart, while the trim moves the limits by
# at most 1 % a second and the damping by what the last 4 s, seen that late, differ.
LIMITS_AGREE = 0.05

Kind = Literal["produce", "fetch"]


@dataclass(frozen=True)
class GuardClient:
    """One client-id: its offer per broker (bytes/s), produce or fetch, its largest request."""

    name: str
    offer: Mapping[int, float]
    kind: Kind = "produce"
    request_bytes: int = SMALL_REQUEST
    noisy: bool = False  # stops in the `stop` phase; the first noisy one comes back in `under`
    # The fleet's instances its connections go through (a fleet row): a client scaled out over
    # several has one connection per broker through each, its offer split evenly between them.
    via: tuple[int, ...] = (0,)
    # Queues what it cannot send while muted (librdkafka's queue) and sends it when unmuted; without
    # a backlog, what it would have sent while muted is lost (an offered rate: a sensor, a paced
    # application that drops or blocks upstream).
    backlog: bool = False


@dataclass(frozen=True)
class GuardRow:
    name: str
    limits: Mapping[tuple[int, str], float]  # (broker, NW_IN | NW_OUT) -> bytes/s
    clients: tuple[GuardClient, ...]
    replication_factor: int = 1
    weights: Mapping[str, float] = field(default_factory=dict)
    protected: frozenset[str] = frozenset()
    floor: float = 0.0
    seeds: int = 5
    # A fleet of instances (guard.fleet_wide), each with its own engine and guard loop, sharing
    # their usage and their guard's measurements through the exchange every REPORT_MS.
    instances: int = 1
    # (instance, second): that instance dies then (its loop stops, its reports stop, what it had
    # not reported yet is lost) and its clients reconnect through the first instance still alive.
    dies: tuple[int, int] | None = None
    # guard.fleet_wide: the instances share the guard's measurements (off: each guards what it forwards).
    fleet_wide: bool = True

    @property
    def brokers(self) -> tuple[int, ...]:
        return tuple(sorted({broker for broker, _ in self.limits}))


@dataclass
class Run:
    """What one phase sequence produced: per second, bytes per (client, broker) and throttles."""

    seconds: int = 0
    sent: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    throttles: list[int] = field(default_factory=list)  # throttle ms given, per second
    limits: list[dict[str, float]] = field(default_factory=list)  # the first instance's guard limits, each second
    # A fleet: per second, the largest spread of one entity's guard limit between the instances
    # (max - min) / max, 0 when they agree (or one instance alone).
    spread: list[float] = field(default_factory=list)


def _offers(row: GuardRow, phase: str, jitter: Mapping[str, float]) -> dict[str, dict[int, float]]:
    noisy = [client.name for client in row.clients if client.noisy]
    offers = {}
    for client in row.clients:
        on = phase == "over" or not client.noisy or (phase == "under" and client.name == noisy[0])
        offers[client.name] = {broker: rate * jitter[client.name] if on else 0.0
                               for broker, rate in client.offer.items()}
    return offers


class GuardSimulation:
    """One scenario-seed in virtual time: per instance its engine and (with `guard`) its loop, and the clients."""

    def __init__(self, row: GuardRow, seed: int, guard: bool, static: Mapping[str, Mapping[QuotaType, float]],
                 workdir: Path) -> None:
        self.row = row
        # Each seed: the clients' start within the first second (their offers: `simulate`).
        rng = random.Random(seed * 7919 + 1)
        self.phase_ms = {client.name: rng.randrange(0, 1000, TICK_MS) for client in row.clients}
        entries = tuple(
            QuotaEntry(QuotaEntity(client_id=name), dict(limits)) for name, limits in static.items() if limits
        )
        self.engines = [QuotaEngine(QuotaSettings(entries=entries)) for _ in range(row.instances)]
        self.now_ms = 0
        self.loops: list[GuardLoop] = []
        if guard:
            self.loops = [GuardLoop(engine, _section(row, workdir), lambda: list(row.brokers),
                                    lambda: float(self.now_ms)) for engine in self.engines]
        if row.instances > 1:
            for engine in self.engines:
                # As FleetExchange.start and guard.fleet_wide set them: the quotas' usage, and the guard's.
                engine.share_usage(True)
                engine.share_guard_usage(guard and row.fleet_wide)
        # Reports on their way through the exchange: (due ms, sender, quota usage, guard deltas).
        self.in_flight: list[tuple[int, int, list[UsageDelta], list[GuardDelta]]] = []
        self.queue: dict[tuple[str, int, int], float] = {}
        self.muted_until: dict[tuple[str, int, int], int] = {}
        self.dead: set[int] = set()
        self.run = Run()

    def play(self, seconds: int, offers: Mapping[str, Mapping[int, float]]) -> None:
        clients = {client.name: client for client in self.row.clients}
        run = self.run
        for name, offer in offers.items():
            for broker, rate in offer.items():
                if rate <= 0:
                    for via in clients[name].via:
                        self.queue[(name, broker, via)] = 0.0  # a stopped producer's backlog goes with it
        instances = self.row.instances
        for _ in range(seconds):
            second = run.seconds
            if self.row.dies is not None and second == self.row.dies[1]:
                self.dead.add(self.row.dies[0])
            run.throttles.append(0)
            for row in run.sent.values():
                row.append(0.0)
            for _ in range(1000 // TICK_MS):
                for name, offer in offers.items():
                    client = clients[name]
                    if self.now_ms < self.phase_ms[name]:
                        continue
                    for broker, rate in offer.items():
                        for via in client.via:
                            self._tick(client, broker, via, rate / len(client.via), second)
                self.now_ms += TICK_MS
                if instances > 1:
                    self._exchange()
                    # Each instance steps its guard every second, the instances out of phase.
                    for index, loop in enumerate(self.loops):
                        if index and index not in self.dead and \
                                (self.now_ms - index * 1000 // instances) % 1000 < TICK_MS:
                            loop.tick()
            run.seconds += 1
            if self.loops:
                decision = self.loops[0].tick()
                run.limits.append({key[0].client_id or "": limit for key, limit in decision.limits.items()})
                run.spread.append(_spread([loop.state.limits for index, loop in enumerate(self.loops)
                                           if index not in self.dead]))

    def _exchange(self) -> None:
        """Every REPORT_MS each instance takes its report (FleetExchange._publish's calls); every
        other instance applies it EXCHANGE_LAG_MS later (FleetExchange._apply's calls)."""
        now = self.now_ms
        if now % REPORT_MS < TICK_MS:
            for index, engine in enumerate(self.engines):
                if index not in self.dead:
                    self.in_flight.append((now + EXCHANGE_LAG_MS, index, engine.take_local_usage(now),
                                           engine.take_guard_usage()))
        due = [report for report in self.in_flight if report[0] <= now]
        if not due:
            return
        self.in_flight = [report for report in self.in_flight if report[0] > now]
        for _, sender, usage, guard in due:
            for index, engine in enumerate(self.engines):
                if index != sender and index not in self.dead:
                    # The round trip and interval FleetExchange._apply passes: its pacer's, here the
                    # lag and the report interval.
                    engine.record_remote_usage(usage, now, f"instance-{sender}", round_trip_ms=EXCHANGE_LAG_MS,
                                               interval_ms=REPORT_MS)
                    engine.record_remote_guard(guard, now)

    def _tick(self, client: GuardClient, broker: int, via: int, rate: float, second: int) -> None:
        key = (client.name, broker, via)  # the client's own queue, for its connection through `via`
        queued = min(self.queue.get(key, 0.0) + rate * TICK_MS / 1000,
                     QUEUE_CAP if client.backlog else rate * PACED_MS / 1000)
        self.queue[key] = queued
        if via in self.dead:  # reconnected through the first instance alive
            via = min(set(range(self.row.instances)) - self.dead)
        connection = (client.name, broker, via)
        if queued < 1 or self.muted_until.get(connection, 0) > self.now_ms:
            return
        if not client.backlog and (self.now_ms - self.phase_ms[client.name]) % PACED_MS:
            return  # a paced client sends every PACED_MS
        # A paced client sends what it offered since its last request; a backlogged one at most a batch.
        nbytes = int(min(queued, client.request_bytes) if client.backlog else queued)
        engine = self.engines[via]
        if client.kind == "produce":
            throttle = engine.record_produce(str(broker), "", client.name, nbytes, self.now_ms)
            delivered = nbytes  # the broker took the request; the throttle applies to what follows
        else:
            throttle = engine.record_fetch(str(broker), "", client.name, nbytes, self.now_ms)
            delivered = 0 if throttle > 0 else nbytes  # a throttled fetch is answered empty
        if delivered:
            self.queue[key] = queued - delivered
            sent = self.run.sent.setdefault((client.name, broker), [0.0] * (second + 1))
            sent[second] += delivered
        if throttle > 0:
            self.muted_until[connection] = self.now_ms + throttle
            self.run.throttles[second] += throttle


def _spread(limits: Sequence[Mapping[FlowKey, float]]) -> float:
    """The largest (max - min) / max of one flow's guard limit over the instances (a missing limit is
    a disagreement as large as the limit)."""
    worst = 0.0
    for key in {key for per_instance in limits for key in per_instance}:
        values = [per_instance.get(key, 0.0) for per_instance in limits]
        worst = max(worst, (max(values) - min(values)) / max(values))
    return worst


def _section(row: GuardRow, workdir: Path) -> GuardSection:
    capacity = workdir / "capacity.json"
    # Cruise Control's capacity is in KB/s (1024 bytes); the guard's limit is capacity x 0.8.
    capacity.write_text(json.dumps({"brokerCapacities": [
        {"brokerId": str(broker), "capacity": {
            "DISK": "100000", "CPU": "100",
            "NW_IN": str(row.limits.get((broker, NW_IN), 1e12) / 0.8 / 1024),
            "NW_OUT": str(row.limits.get((broker, NW_OUT), 1e12) / 0.8 / 1024)}}
        for broker in row.brokers]}))
    return GuardSection.model_validate({
        "enabled": True,
        "capacity_file": str(capacity),
        "replication_factor": row.replication_factor,
        "interval_seconds": 1,
        "weights": tuple({"entity": {"client-id": name}, "weight": weight} for name, weight in row.weights.items()),
        "protected": tuple({"client-id": name} for name in sorted(row.protected)),
        "floor": row.floor,
    })


def fair_shares(row: GuardRow, offers: Mapping[str, Mapping[int, float]]) -> tuple[
        dict[str, float | None], set[tuple[int, str]]]:
    """Each client's max-min fair share of the limits for these offers (None: not limited), as
    `advise` computes it from the same demand, and the resources that bind (those the shares
    fill to their limit)."""
    brokers = row.brokers
    flows = [
        Flow(entity=QuotaEntity(client_id=client.name),
             quota_type=PRODUCE if client.kind == "produce" else FETCH,
             demand=np.array([[offers[client.name].get(broker, 0.0)] for broker in brokers], dtype=np.float64),
             weight=row.weights.get(client.name, 1.0), protected=client.name in row.protected)
        for client in row.clients
    ]
    problem = Problem(
        brokers=brokers,
        limits={(b, r): row.limits.get((b, r), math.inf) for b in brokers for r in (NW_IN, NW_OUT)},
        background={(b, r): np.zeros(1) for b in brokers for r in (NW_IN, NW_OUT)},
        flows=flows, replication_factor=row.replication_factor, scope="broker", stat="max", floor=row.floor,
    )
    advice = water_fill(problem)
    shares = {client.name: flow.quota for client, flow in zip(row.clients, advice.flows, strict=True)}
    return shares, {flow.binding for flow in advice.flows if flow.quota is not None and flow.binding is not None}


def resource_loads(row: GuardRow, run: Run) -> dict[tuple[int, str], list[float]]:
    """Each resource's load per second: the clients' bytes on the wire plus the modelled followers'."""
    brokers = row.brokers
    followers, spread = replication_shares(row.replication_factor, len(brokers))
    kinds = {client.name: client.kind for client in row.clients}
    loads = {(b, r): [0.0] * run.seconds for b in brokers for r in (NW_IN, NW_OUT)}
    for (name, broker), series in run.sent.items():
        for second, nbytes in enumerate(series):
            if kinds[name] == "fetch":
                loads[(broker, NW_OUT)][second] += nbytes
                continue
            loads[(broker, NW_IN)][second] += nbytes
            loads[(broker, NW_OUT)][second] += nbytes * followers
            for other in brokers:
                if other != broker:
                    loads[(other, NW_IN)][second] += nbytes * spread
    return loads


def windows(series: Sequence[float], start: int, end: int) -> list[float]:
    """The mean over each quota window that lies in [start, end)."""
    return [sum(series[s - WINDOW_S:s]) / WINDOW_S for s in range(start + WINDOW_S, end + 1)]


@dataclass(frozen=True)
class Figures:
    """One run's figures over the converged span of the `over` phase, per overloaded resource."""

    load: dict[tuple[int, str], tuple[float, float, float]]  # min, max, mean of 11 s windows / limit
    shares: dict[tuple[str, int], float]  # received / fair share, for flows whose offer is above it
    throttled_when_under: int | None  # throttle ms from QUIET_AFTER_S after the noisy stop to the end
    under_offer: float | None  # the returning noisy client's received / offer in the `under` phase
    # A fleet's guard: the largest spread of one entity's limit between the instances over the converged span.
    spread: float | None = None

    def text(self) -> str:
        load = "; ".join(f"broker {b} {r} {lo:.3f}-{hi:.3f}x (mean {mean:.3f})"
                         for (b, r), (lo, hi, mean) in sorted(self.load.items()))
        shares = ", ".join(f"{name}@{broker} {share:.3f}" for (name, broker), share in sorted(self.shares.items()))
        text = f"11 s load {load}; share of fair share {shares or '-'}"
        if self.spread is not None:
            text += f"; the instances' limits at most {self.spread:.3f} apart"
        if self.throttled_when_under is None or self.under_offer is None:
            return text
        return (f"{text}; throttle ms while under {self.throttled_when_under}; returning noisy got "
                f"{self.under_offer:.3f}x its offer")


def figures(row: GuardRow, run: Run, offers: Mapping[str, Mapping[int, float]],
            shares: Mapping[str, float | None], binding: set[tuple[int, str]]) -> Figures:
    loads = resource_loads(row, run)
    start, end = CONVERGED_S, OVER_S
    load = {}
    for resource in sorted(binding):
        limit = row.limits[resource]
        means = windows(loads[resource], start, end)
        load[resource] = (min(means) / limit, max(means) / limit, sum(means) / len(means) / limit)
    received = {}
    for client in row.clients:
        share = shares[client.name]
        if share is None:
            continue
        for broker, rate in offers[client.name].items():
            if rate > share:
                series = run.sent.get((client.name, broker), [])
                received[(client.name, broker)] = sum(series[start:end]) / (end - start) / share
    spread = max(run.spread[start:end]) if len(run.spread) >= end and row.instances > 1 else None
    if run.seconds <= OVER_S:  # the static run: the `over` phase only
        return Figures(load, received, None, None, spread)
    quiet_from = OVER_S + QUIET_AFTER_S
    returning = next(client for client in row.clients if client.noisy)
    under_start = OVER_S + STOP_S + QUIET_AFTER_S  # judged once its own rise has settled
    got = sum(sum(run.sent.get((returning.name, b), [])[under_start:]) for b in returning.offer)
    offered = sum(returning.offer.values()) * (run.seconds - under_start)
    return Figures(load, received, sum(run.throttles[quiet_from:]), got / offered if offered else 1.0, spread)


def violations(guarded: Figures) -> list[str]:
    found = []
    for (broker, resource), (low, high, _) in sorted(guarded.load.items()):
        if low < LOAD_BAND[0] or high > LOAD_BAND[1]:
            found.append(f"broker {broker} {resource}: 11 s load {low:.3f}-{high:.3f}x the limit, outside "
                         f"{LOAD_BAND[0]}-{LOAD_BAND[1]}")
        if high - low > OSCILLATION:
            found.append(f"broker {broker} {resource}: 11 s load moves by {high - low:.3f} of the limit, "
                         f"over {OSCILLATION}")
    for (name, broker), share in sorted(guarded.shares.items()):
        if share < FAIR_SHARE_MIN:
            found.append(f"{name} on broker {broker} got {share:.3f} of its fair share, under {FAIR_SHARE_MIN}")
    if guarded.spread is not None and guarded.spread > LIMITS_AGREE:
        found.append(f"the instances' guard limits {guarded.spread:.3f} apart, over {LIMITS_AGREE}")
    if guarded.throttled_when_under:
        found.append(f"{guarded.throttled_when_under} ms of throttles while the offer was under the limits")
    return found


@dataclass(frozen=True)
class Outcome:
    row: GuardRow
    seed: int
    guarded: Figures
    static: Figures

    def describe(self) -> str:
        return (f"{self.row.name} seed {self.seed}\n  guard:  {self.guarded.text()}\n"
                f"  static: {self.static.text()}")


def simulate(row: GuardRow, seed: int) -> Outcome:
    """The row's three phases with the guard, and the `over` phase under static quotas of the fair shares."""
    rng = random.Random(seed)
    # Each seed: the clients' offers within +-5 %.
    jitter = {client.name: 1.0 + rng.uniform(-0.05, 0.05) for client in row.clients}
    over = _offers(row, "over", jitter)
    shares, binding = fair_shares(row, over)
    static_quotas: dict[str, dict[QuotaType, float]] = {
        client.name: {("producer_byte_rate" if client.kind == "produce" else "consumer_byte_rate"): share}
        for client in row.clients if (share := shares[client.name]) is not None
    }
    with tempfile.TemporaryDirectory() as workdir:
        guarded = GuardSimulation(row, seed, True, {}, Path(workdir))
        guarded.play(OVER_S, over)
        guarded.play(STOP_S, _offers(row, "stop", jitter))
        guarded.play(UNDER_S, _offers(row, "under", jitter))
        static = GuardSimulation(row, seed, False, static_quotas, Path(workdir))
        static.play(OVER_S, over)  # the same traffic under static quotas: the `over` phase only
    return Outcome(row, seed, figures(row, guarded.run, over, shares, binding),
                   figures(row, static.run, over, shares, binding))


# -- the rows ------------------------------------------------------------------------------------

LIMIT = 1_200_000


def _issue_shape(request_bytes: int, backlog: bool = False) -> tuple[GuardClient, ...]:
    return (
        GuardClient("quiet-1", {1: 100_000}), GuardClient("quiet-2", {1: 100_000}),
        GuardClient("quiet-3", {1: 100_000}),
        GuardClient("noisy-1", {1: 800_000}, request_bytes=request_bytes, noisy=True, backlog=backlog),
        GuardClient("noisy-2", {1: 800_000}, request_bytes=request_bytes, noisy=True, backlog=backlog),
    )


def _one_broker(nw_in: float = LIMIT, nw_out: float = 1e12) -> dict[tuple[int, str], float]:
    return {(1, NW_IN): nw_in, (1, NW_OUT): nw_out}


GUARD_ROWS: tuple[GuardRow, ...] = (
    GuardRow("one-broker-issue-shape", _one_broker(), _issue_shape(SMALL_REQUEST)),
    GuardRow("one-broker-librdkafka-defaults", _one_broker(), _issue_shape(LIBRDKAFKA_BATCH, backlog=True)),
    GuardRow("weights", _one_broker(), _issue_shape(SMALL_REQUEST), weights={"noisy-1": 2.0}),
    GuardRow("protected", _one_broker(), (
        *_issue_shape(SMALL_REQUEST), GuardClient("protected", {1: 200_000}, noisy=True)),
        protected=frozenset({"protected"})),
    GuardRow("floor", _one_broker(), (
        GuardClient("quiet-1", {1: 100_000}),
        GuardClient("noisy-1", {1: 800_000}, noisy=True), GuardClient("noisy-2", {1: 800_000}, noisy=True),
        GuardClient("light-weight", {1: 600_000}, noisy=True)),
        weights={"light-weight": 0.2}, floor=200_000),
    GuardRow("fetch-binds-nw-out", {(1, NW_IN): 1e12, (1, NW_OUT): 2_000_000}, (
        GuardClient("reader-1", {1: 150_000}, kind="fetch"), GuardClient("reader-2", {1: 250_000}, kind="fetch"),
        GuardClient("bulk-1", {1: 1_500_000}, kind="fetch", request_bytes=FETCH_MAX, noisy=True, backlog=True),
        GuardClient("bulk-2", {1: 1_200_000}, kind="fetch", request_bytes=FETCH_MAX, noisy=True, backlog=True))),
    GuardRow("two-brokers-one-binds", {(1, NW_IN): LIMIT, (1, NW_OUT): 1e12, (2, NW_IN): LIMIT, (2, NW_OUT): 1e12}, (
        GuardClient("quiet-1", {1: 100_000, 2: 100_000}), GuardClient("quiet-2", {2: 300_000}),
        GuardClient("noisy-1", {1: 800_000, 2: 200_000}, noisy=True),
        GuardClient("noisy-2", {1: 700_000}, noisy=True))),
    GuardRow("two-brokers-librdkafka-defaults",
             {(1, NW_IN): LIMIT, (1, NW_OUT): 1e12, (2, NW_IN): 900_000, (2, NW_OUT): 1e12}, (
        GuardClient("quiet-1", {1: 100_000, 2: 100_000}),
        GuardClient("noisy-1", {1: 800_000, 2: 600_000}, request_bytes=LIBRDKAFKA_BATCH, noisy=True, backlog=True),
        GuardClient("noisy-2", {1: 800_000}, request_bytes=LIBRDKAFKA_BATCH, noisy=True, backlog=True),
        GuardClient("noisy-3", {2: 700_000}, request_bytes=LIBRDKAFKA_BATCH, noisy=True, backlog=True))),
    GuardRow("three-brokers-replicated",
             {(b, r): (2_400_000 if r == NW_IN else 3_000_000) for b in (1, 2, 3) for r in (NW_IN, NW_OUT)}, (
        GuardClient("quiet-1", {1: 100_000, 2: 100_000, 3: 100_000}),
        GuardClient("noisy-1", {1: 1_000_000, 2: 300_000}, noisy=True),
        GuardClient("noisy-2", {1: 900_000, 3: 200_000}, noisy=True)),
        replication_factor=3),
    GuardRow("produce-and-fetch-both-bind",
             {(1, NW_IN): LIMIT, (1, NW_OUT): 1_500_000}, (
        GuardClient("quiet-1", {1: 100_000}), GuardClient("reader-1", {1: 100_000}, kind="fetch"),
        GuardClient("noisy-1", {1: 900_000}, noisy=True), GuardClient("noisy-2", {1: 700_000}, noisy=True),
        GuardClient("bulk-1", {1: 1_000_000}, kind="fetch", request_bytes=FETCH_MAX, noisy=True, backlog=True),
        GuardClient("bulk-2", {1: 900_000}, kind="fetch", request_bytes=FETCH_MAX, noisy=True, backlog=True))),
    # A fleet (guard.fleet_wide): the issue's shape through three instances, each quiet client on
    # one, noisy-1 scaled out over two of them (a connection through each), noisy-2 on the third.
    GuardRow("fleet-of-3-one-broker", _one_broker(), (
        GuardClient("quiet-1", {1: 100_000}, via=(0,)), GuardClient("quiet-2", {1: 100_000}, via=(1,)),
        GuardClient("quiet-3", {1: 100_000}, via=(2,)),
        GuardClient("noisy-1", {1: 800_000}, noisy=True, via=(0, 1)),
        GuardClient("noisy-2", {1: 800_000}, noisy=True, via=(2,))), instances=3),
    # Two instances in front of two brokers, one binding, every noisy client through both.
    GuardRow("fleet-of-2-two-brokers",
             {(1, NW_IN): LIMIT, (1, NW_OUT): 1e12, (2, NW_IN): LIMIT, (2, NW_OUT): 1e12}, (
        GuardClient("quiet-1", {1: 100_000, 2: 100_000}, via=(0,)), GuardClient("quiet-2", {2: 300_000}, via=(1,)),
        GuardClient("noisy-1", {1: 800_000, 2: 200_000}, noisy=True, via=(0, 1)),
        GuardClient("noisy-2", {1: 700_000}, noisy=True, via=(1,))), instances=2),
    # Three instances in front of three brokers, replication factor 3 (acceptance 3's shape).
    GuardRow("fleet-of-3-three-brokers-replicated",
             {(b, r): (2_400_000 if r == NW_IN else 3_000_000) for b in (1, 2, 3) for r in (NW_IN, NW_OUT)}, (
        GuardClient("quiet-1", {1: 100_000, 2: 100_000, 3: 100_000}, via=(0, 1, 2)),
        GuardClient("noisy-1", {1: 1_000_000, 2: 300_000}, noisy=True, via=(0, 1)),
        GuardClient("noisy-2", {1: 900_000, 3: 200_000}, noisy=True, via=(1, 2))),
        replication_factor=3, instances=3),
    # The wire's fleet shape (bench/guard_fleet.py, per broker): library-default producers, the
    # noisy two through two different instances, so that only the exchange shows either instance
    # the pair whose 1 MB requests must be spread apart (GuardQuotas.spread_admissions).
    GuardRow("fleet-of-3-librdkafka-defaults", _one_broker(), (
        GuardClient("quiet-1", {1: 100_000}, via=(0,)), GuardClient("quiet-2", {1: 100_000}, via=(1,)),
        GuardClient("quiet-3", {1: 100_000}, via=(2,)),
        GuardClient("noisy-1", {1: 800_000}, request_bytes=LIBRDKAFKA_BATCH, noisy=True, backlog=True, via=(0,)),
        GuardClient("noisy-2", {1: 800_000}, request_bytes=LIBRDKAFKA_BATCH, noisy=True, backlog=True, via=(1,))),
        instances=3),
    # The first row's fleet, its third instance dying 50 s into the overload: noisy-2 and quiet-3
    # reconnect through the first; what the dead one forwarded stays in the others' windows.
    GuardRow("fleet-of-3-one-dies", _one_broker(), (
        GuardClient("quiet-1", {1: 100_000}, via=(0,)), GuardClient("quiet-2", {1: 100_000}, via=(1,)),
        GuardClient("quiet-3", {1: 100_000}, via=(2,)),
        GuardClient("noisy-1", {1: 800_000}, noisy=True, via=(0, 1)),
        GuardClient("noisy-2", {1: 800_000}, noisy=True, via=(2,))), instances=3, dies=(2, 50)),
)

# Acceptance 1 is not met on these scenario-seeds (issue 41): the 11 s windows of the guarded
# resource go outside 0.95-1.05x the limit, or move by more than 10 % of it. Per seed, the band
# its windows were measured in (the lowest and highest window over its judged resources, rounded
# outward to 0.01): the test asserts the seed shows no other violation and stays in its band, so
# that a change that makes it worse fails and one that makes it meet the acceptance is seen
# (a seed listed here that no longer violates fails too, to be removed from the list).
# What the first three rows have in common: requests that are a large part of a share (1 MB
# produce requests or 1 MiB fetches from backlogged clients, two seconds of a 450 kB/s share).
# The guard's token bucket (kqp/quotas/guard_limits.py: GuardRate) spaces each such client's
# requests evenly, but a window still holds a whole number of them, and clients that lock in
# phase (the same limit, started together) run a request over or under together: 0.86-1.01x in
# the one-broker row (0.77-1.17x under Kafka's windowed throttle, as static quotas of the same
# values, printed beside, still give). produce-and-fetch-both-bind left the list with the bucket.
# fleet-of-3-one-dies seed 0 joined it: when the instance dies, its noisy client reconnects
# through another whose bucket holds the fleet's deficit, and sends nothing for about 1.5 s, a
# request short in the windows that follow (0.936x; it met the band under the windowed throttle).
# Since the guard spreads held-back clients of one period (GuardQuotas.spread_admissions), the
# noisy two of one-broker-librdkafka-defaults no longer run in phase: 0.92-1.08x (0.85-1.02x
# before; seed 4, 0.92-1.01x before, now holds 11 requests in one window: the two send exactly 10
# a window on average there, and a window holds 9, 10 or 11 as the period drifts by a few ms
# against the second's boundaries). The band needs exactly 10 in every window (one 1 MB request
# is 7.6 % of 11 s of the limit): no spacing gives that. two-brokers-librdkafka-defaults went from
# up to 1.13x to up to 1.08x; fetch-binds-nw-out did not move.
# fleet-of-3-librdkafka-defaults is the one-broker row's pair through two instances, spread across
# the fleet from what the exchange reports of the other's requests: the same bands as on one
# instance (0.925-1.088x; not spread, 0.853-1.012x: the instances' limits differ by a few per
# cent, so the pair drifts through each other's phase instead of staying locked in it).
KNOWN: dict[str, dict[int, tuple[float, float]]] = {
    "one-broker-librdkafka-defaults": {0: (0.93, 1.02), 1: (0.93, 1.02), 2: (0.93, 1.02),
                                       3: (0.92, 1.01), 4: (0.92, 1.08)},
    "fetch-binds-nw-out": {0: (0.96, 1.07), 1: (0.96, 1.07), 2: (0.97, 1.07), 3: (0.96, 1.06), 4: (0.95, 1.06)},
    "two-brokers-librdkafka-defaults": {0: (0.91, 1.08), 1: (0.91, 1.07), 2: (0.91, 1.08),
                                        3: (0.91, 1.07), 4: (0.91, 1.07)},
    "fleet-of-3-one-dies": {0: (0.93, 1.04)},
    "fleet-of-3-librdkafka-defaults": {0: (0.93, 1.09), 1: (0.93, 1.01), 2: (0.93, 1.02), 3: (0.92, 1.09),
                                       4: (0.92, 1.08)},
}
