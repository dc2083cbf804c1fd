"""A simulated scenario: the same modelled clients run twice on virtual time, once through the
real proxy (kqp's figure) and once straight to a broker that enforces the quota itself (Kafka's
figure), and what an operator would measure of each.

The proxy is the one `kqp serve` runs: a `KqpConfig` through `app_settings_from_config`, a
`ProxyApp` with a `QuotaEngine` of `config.quota_settings()`, started as `run_app` starts it,
on a `VirtualLoop` whose in-memory network stands for the sockets.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kqp.config import KqpConfig
from kqp.config.models import FleetSection
from kqp.proxy.app import ProxyApp, app_settings_from_config
from kqp.quotas import QuotaEngine
from kqp.quotas.fleet import ReportPacer, UsageDelta
from kqpsim.broker import BROKER_HOST, BROKER_PORT, NODE_ID, BrokerModel
from kqpsim.clients import CLIENT_SHAPES, ClientConnection, ClientShape, ConnectionRecord
from kqpsim.kafka_reference import DEFAULT, Entity, KafkaQuotas
from kqpsim.virtual_loop import Faults as LoopFaults
from kqpsim.virtual_loop import Host, MemoryServer, MemoryTransport, run

KIB = 1024
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Clients:
    """Who sends: one client model, its connections per client-id, how many client-ids, and how
    much each request asks for, and what the application offers (by default it saturates: every
    connection always has a full request ready)."""

    model: str = "librdkafka"  # a key of CLIENT_SHAPES
    connections: int = 1  # per client-id
    client_ids: int = 1  # each with its own quota
    request_bytes: int = 64 * KIB  # a Produce's size; a Fetch's MaxBytes; the admin's partitions per topic
    # A producer's offer per client-id, x the quota, spread over its connections; 0: saturating
    # (every connection always has a full request ready).
    offer: float = 0.0


@dataclass(frozen=True, slots=True)
class Quota:
    """What every client-id gets (set on the <default> client-id, for kqp and Kafka alike)."""

    # bytes/s, producer_byte_rate or consumer_byte_rate by the client's API; for the admin
    # client controller_mutation_rate, partitions/s
    rate: float = 1 * MIB
    # KIP-124 request_percentage (percent of one broker thread); 0: none. The proxy charges the
    # round trip it measures; Kafka's model the broker's handling time.
    request_percentage: float = 0.0
    fair_connection_turns: bool = False  # kqp's enforcement.fair_connection_turns (beyond Kafka)


@dataclass(frozen=True, slots=True)
class Topology:
    """What stands between the clients and Kafka: one proxy, or a fleet of instances sharing one
    budget through the usage topic (modelled by `_exchange`; `--workers`' host relay, which
    shares every loop turn, is not modelled yet), a client's connections spread over them
    round-robin as a balancer would; and the one broker behind."""

    instances: int = 1
    exchange_lag_s: float = 0.05  # a report's way from one instance to the others (the topic's round trip)
    # fleet.report_interval_seconds: the shortest interval; each instance paces its reports by the
    # round trip of its own (kqp.quotas.fleet.ReportPacer), here the exchange's lag.
    report_interval_s: float = FleetSection().report_interval_seconds
    # fleet.count_other_instances: accepted and without effect since issue 39 (every fleet
    # counts the other instances); kept so that the rows that name it stay as they were.
    count_other_instances: bool = False
    broker_latency_s: float = 0.002  # the broker's least time to handle a request
    # Up to this much more per request, drawn uniformly from the seed's own generator (broker.py):
    # 2.0-2.5 ms by default. With no spread every seed locks into one phase of Kafka's throttle
    # arithmetic (docs/quotas.md, "The simulator's open findings").
    broker_latency_spread_s: float = 0.0005
    # The proxy's own handling time, per instance (one event loop: one frame at a time, across
    # all its connections): of each request it reads from a client, and of each response it
    # reads from the broker (virtual_loop.Host). 0 (the default): the proxy takes no time, the
    # clock moving only while its loop waits. docs/testing.md, "The proxy's handling time",
    # calibrates it from the wire.
    proxy_request_s: float = 0.0
    proxy_response_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Faults:
    """What goes wrong, on purpose and seeded: the network's latency and jitter, a busy host whose
    loop runs late, and the first instance dying or stalling."""

    latency_s: float = 0.0005  # one-way, each direction of each link
    jitter_s: float = 0.0002  # up to this much more per delivery
    loop_delay_s: float = 0.0  # a busy host: up to this much added to a wait of the loop ...
    loop_delay_chance: float = 0.0  # ... on this fraction of the waits
    # When (virtual seconds) the first instance dies: its listener and connections close, its
    # reports stop, its clients reconnect to the others. 0: never.
    instance_dies_at_s: float = 0.0
    # When the first instance stalls (a busy or paused process: it reads nothing and reports
    # nothing) and for how long; 0: never.
    instance_stalls_at_s: float = 0.0
    stall_s: float = 0.0

    @property
    def on_the_loop(self) -> LoopFaults:
        """The faults the virtual loop itself plays (the rest are the scenario's to act)."""
        return LoopFaults(self.latency_s, self.jitter_s, self.loop_delay_s, self.loop_delay_chance)


@dataclass(frozen=True, slots=True)
class Scenario:
    """One row of the scenario table: who sends, under what quota, through what, with what
    going wrong; and how long to measure."""

    clients: Clients = Clients()
    quota: Quota = Quota()
    topology: Topology = Topology()
    faults: Faults = Faults()
    # 0: long enough for the scenario (`warmup`, `measure`), so that the phase of a throttle
    # cycle against the span's edges cannot move the measured rate beyond the tolerance.
    warmup_s: float = 0.0
    measure_s: float = 0.0

    @property
    def shape(self) -> ClientShape:
        return CLIENT_SHAPES[self.clients.model]

    @property
    def in_flight_seconds(self) -> float:
        """Seconds of quota one client-id can have outstanding: the largest burst a throttle answers."""
        clients = self.clients
        return clients.connections * self.shape.max_in_flight * clients.request_bytes / self.quota.rate

    @property
    def warmup(self) -> float:
        """Past the first throttles and Kafka's quota window (11 s), several bursts long."""
        return self.warmup_s or max(15.0, 3.0 * self.in_flight_seconds)

    @property
    def measure(self) -> float:
        """Fifty bursts long, a minute at least, fifteen minutes at most."""
        return self.measure_s or min(900.0, max(60.0, 50.0 * self.in_flight_seconds))

    @property
    def tolerance(self) -> float:
        """How far two measurements of the same admitted rate may differ, as a fraction of the
        quota: 5 %, plus what one request per connection in or out at each edge of the span
        is worth (the phase of the requests against the span, which the span's length bounds)."""
        edges = 2.0 * self.clients.connections * self.clients.request_bytes / (self.quota.rate * self.measure)
        return 0.05 + edges

    @property
    def name(self) -> str:
        clients, quota, topology, faults = self.clients, self.quota, self.topology, self.faults
        parts = [f"{clients.model}", f"{clients.client_ids}x{clients.connections}conn", f"q{_size(quota.rate)}",
                 f"r{_size(clients.request_bytes)}"]
        if clients.offer:
            parts.append(f"offer{clients.offer:g}x")
        if quota.fair_connection_turns:
            parts.append("fair")
        if quota.request_percentage:
            parts.append(f"req{quota.request_percentage:g}pct")
        if topology.proxy_request_s or topology.proxy_response_s:
            parts.append(f"proxy{topology.proxy_request_s * 1000:g}+{topology.proxy_response_s * 1000:g}ms")
        if topology.instances > 1:
            parts.append(f"fleet{topology.instances}-lag{topology.exchange_lag_s * 1000:g}ms")
            if topology.count_other_instances:
                parts.append("count-others")
            if faults.instance_dies_at_s:
                parts.append(f"dies{faults.instance_dies_at_s:g}s")
            if faults.instance_stalls_at_s:
                parts.append(f"stalls{faults.stall_s:g}s@{faults.instance_stalls_at_s:g}s")
        if faults.jitter_s:
            parts.append(f"jitter{faults.jitter_s * 1000:g}ms")
        if faults.loop_delay_s:
            parts.append(f"busy{faults.loop_delay_s * 1000:g}ms@{faults.loop_delay_chance:g}")
        return "-".join(parts)

    def config(self) -> KqpConfig:
        quota_type = {"produce": "producer_byte_rate", "fetch": "consumer_byte_rate",
                      "create_topics": "controller_mutation_rate"}[self.shape.api]
        rate = self.quota.rate
        limit = float(rate) if quota_type == "controller_mutation_rate" else int(rate)
        entry: dict[str, object] = {"entity": {"client-id": "<default>"}, quota_type: limit}
        if self.quota.request_percentage:
            entry["request_percentage"] = float(self.quota.request_percentage)
        return KqpConfig.model_validate({
            "upstream": {"bootstrap_servers": (f"{BROKER_HOST}:{BROKER_PORT}",)},
            "metrics": {"enabled": False},
            "quotas": {"entries": (entry,)},
            "enforcement": {"fair_connection_turns": self.quota.fair_connection_turns},
        })

    def kafka_quotas(self) -> KafkaQuotas:
        """The same quotas as `config`, for Kafka's reference: on the <default> client-id, as
        `kafka-configs --entity-type clients --entity-default` sets them."""
        quota_key = {"produce": "producer_byte_rate", "fetch": "consumer_byte_rate",
                     "create_topics": "controller_mutation_rate"}[self.shape.api]
        quotas: dict[str, dict[Entity, float]] = {quota_key: {(None, DEFAULT): float(self.quota.rate)}}
        if self.quota.request_percentage:
            quotas["request_percentage"] = {(None, DEFAULT): float(self.quota.request_percentage)}
        return KafkaQuotas(quotas)

    def replay_command(self, seed: int) -> str:
        # Each field that differs from its default, by its name (unique across the parts): strings
        # bare (no quotes to fight the shell's), everything else as a Python literal.
        fields = ",".join(f"{name}={_field_text(value)}" for name, value in _changed_fields(self))
        return f".venv/bin/python -m kqpsim run '{fields}' --seed {seed} --trace"


def _size(n: float) -> str:
    if n >= MIB and n % MIB == 0:
        return f"{int(n // MIB)}M"
    if n >= KIB and n % KIB == 0:
        return f"{int(n // KIB)}K"
    return f"{n:g}"


@dataclass
class Figures:
    """What an operator measures of one run, over the measured span after the warm-up."""

    records: list[ConnectionRecord]
    span: tuple[float, float]
    quota: float
    client_ids: int
    throttles: int = 0

    def rate_of(self, client_id: str) -> float:
        start, end = self.span
        return sum(r.bytes_between(start, end) for r in self.records if r.client_id == client_id) / (end - start)

    @property
    def client_rates(self) -> list[float]:
        return [self.rate_of(client_id(i)) for i in range(self.client_ids)]

    @property
    def admitted(self) -> float:
        """The mean client-id's admitted rate, as a multiple of its quota."""
        return sum(self.client_rates) / len(self.client_rates) / self.quota

    @property
    def worst_client(self) -> float:
        return max(self.client_rates) / self.quota

    def connection_shares(self) -> list[float]:
        """Each connection's bytes as a fraction of an equal share of its client-id's bytes."""
        start, end = self.span
        shares: list[float] = []
        for i in range(self.client_ids):
            mine = [r.bytes_between(start, end) for r in self.records if r.client_id == client_id(i)]
            total = sum(mine)
            shares.extend(b * len(mine) / total if total else 0.0 for b in mine)
        return shares

    @property
    def fairness(self) -> float:
        """The poorest connection's share of an equal split (1 = perfectly even)."""
        return min(self.connection_shares())

    @property
    def timeouts(self) -> int:
        return sum(r.timeouts for r in self.records)

    @property
    def max_wait_s(self) -> float:
        return max(r.max_wait_s for r in self.records)

    def summary(self) -> str:
        return (f"admitted {self.admitted:.3f}x quota (worst client-id {self.worst_client:.3f}x), "
                f"fairness {self.fairness:.2f}, time-outs {self.timeouts}, longest wait {self.max_wait_s:.1f} s")


def client_id(index: int) -> str:
    return f"client-{index}"


@dataclass
class Outcome:
    scenario: Scenario
    seed: int
    kqp: Figures
    kafka: Figures
    notes: list[str] = field(default_factory=list)

    def digest(self) -> str:
        """A fingerprint of every acknowledgement of both runs: equal digests, equal numbers."""
        runs = (self.kqp, self.kafka)
        text = repr([[(r.client_id, r.acks, r.timeouts) for r in figures.records] for figures in runs])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        return (f"{self.scenario.name} seed {self.seed}\n  kqp:   {self.kqp.summary()}\n"
                f"  kafka: {self.kafka.summary()}\n  replay: {self.scenario.replay_command(self.seed)}")


async def _drive(scenario: Scenario, addresses: list[tuple[str, int]]) -> list[ConnectionRecord]:
    loop = asyncio.get_running_loop()
    shape = scenario.shape
    wanted = scenario.clients
    records: list[ConnectionRecord] = []
    clients: list[ClientConnection] = []
    for i in range(wanted.client_ids):
        for j in range(wanted.connections):
            record = ConnectionRecord(client_id(i))
            address = addresses[j % len(addresses)]
            client = ClientConnection(loop, shape, client_id(i), wanted.request_bytes, address, record,
                                      index=len(clients), fallbacks=tuple(addresses),
                                      offer_bps=wanted.offer * scenario.quota.rate / wanted.connections)
            records.append(record)
            clients.append(client)
    # Connections open at seeded moments within the first second, as a client's do: the seed
    # moves every connection's phase against the others and against the quota windows.
    starts = loop.client_random  # type: ignore[attr-defined]
    for client in clients:
        loop.call_later(starts.uniform(0.0, 1.0), client.open)
    await asyncio.sleep(scenario.warmup + scenario.measure)
    for client in clients:
        client.stop()
    await asyncio.sleep(0.1)
    return records


def _figures(scenario: Scenario, records: list[ConnectionRecord], throttles: int = 0) -> Figures:
    span = (scenario.warmup, scenario.warmup + scenario.measure)
    return Figures(records, span, scenario.quota.rate, scenario.clients.client_ids, throttles)


# The engine built for a run; a test may wrap it (the planted-bug tests do).
EngineFactory = Callable[[KqpConfig], QuotaEngine]


def default_engine(config: KqpConfig) -> QuotaEngine:
    return QuotaEngine(config.quota_settings())


async def _through_kqp(scenario: Scenario, engine_factory: EngineFactory) -> Figures:
    loop = asyncio.get_running_loop()
    topology = scenario.topology
    BrokerModel(latency_s=topology.broker_latency_s, latency_spread_s=topology.broker_latency_spread_s).listen(loop)
    config = scenario.config()
    settings = app_settings_from_config(config)
    # Ports the OS picks (ProxyOptions allows 0 where the config file does not).
    proxy = settings.proxy.model_copy(update={"bootstrap_port": 0, "node_ports": {NODE_ID: 0}})
    settings = dataclasses.replace(settings, proxy=proxy)
    apps = []
    listeners: dict[ProxyApp, list[MemoryServer]] = {}
    network = loop.network  # type: ignore[attr-defined]
    for _ in range(scenario.topology.instances):
        app = ProxyApp(settings, engine_factory(config), config=config, clock_ms=lambda: loop.time() * 1000.0)
        opened = len(network.servers)
        await app.start()
        apps.append(app)
        listeners[app] = network.servers[opened:]  # the listeners this instance opened
        if topology.proxy_request_s or topology.proxy_response_s:
            network.run_on(Host(topology.proxy_request_s, topology.proxy_response_s), listeners[app])
    alive = list(apps)
    stalled: set[ProxyApp] = set()
    exchange = loop.create_task(_exchange(scenario, alive, stalled)) if len(apps) > 1 else None
    faults = scenario.faults
    if faults.instance_dies_at_s:
        loop.call_later(faults.instance_dies_at_s, _die, apps[0], listeners[apps[0]], alive)
    if faults.instance_stalls_at_s:
        loop.call_later(faults.instance_stalls_at_s, _stall, apps[0], stalled, faults.stall_s)
    addresses = []
    for app in apps:
        assert app.server is not None
        addresses.append((proxy.bind_host, app.server.directory.listeners[NODE_ID].port))
    records = await _drive(scenario, addresses)
    if exchange is not None:
        exchange.cancel()
    for app in apps:
        await app.stop()
    return _figures(scenario, records)


def _stall(app: ProxyApp, stalled: set[ProxyApp], seconds: float) -> None:
    """An instance stalls for `seconds`: it reads nothing from its clients or the broker and
    sends no report (others' reports still reach its engine, as they wait in its consumer)."""
    loop = asyncio.get_running_loop()
    server = app.server
    assert server is not None
    stalled.add(app)
    # In connection order: the server keeps a set, whose order is the objects' addresses.
    connections = sorted(server.connections, key=lambda c: c.connection_id)
    transports = [t for c in connections for t in (c.client, c.upstream) if isinstance(t, MemoryTransport)]
    for transport in transports:
        transport.freeze()

    def resume() -> None:
        for transport in transports:
            transport.thaw()
        stalled.discard(app)

    loop.call_later(seconds, resume)


def _die(app: ProxyApp, listeners: list[MemoryServer], alive: list[ProxyApp]) -> None:
    """An instance dies: nothing more is accepted, its connections drop, its reports stop."""
    alive.remove(app)
    server = app.server
    assert server is not None
    # Abrupt, not ProxyServer.stop()'s graceful drain: the process is gone. Its listeners are
    # the in-memory network's (the proxy's own stop() closes them again at the end, a no-op).
    for listener in listeners:
        listener.close()
    # In connection order: the server keeps a set, whose order is the objects' addresses.
    for connection in sorted(server.connections, key=lambda c: c.connection_id):
        for transport in (connection.client, connection.upstream):
            if transport is not None:
                transport.abort()


async def _exchange(scenario: Scenario, apps: list[ProxyApp], stalled: set[ProxyApp]) -> None:
    """The fleet's usage exchange, modelled: each instance, at the interval its `ReportPacer`
    gives (FleetExchange._publish's), takes its usage report from its engine, and every other
    instance records it (FleetExchange._apply's call) once the exchange's lag has passed; the
    report comes back to its own instance after the same lag, which paces the next ones as
    FleetExchange._apply's echo does. The engines are shared as FleetExchange.start shares them;
    the topic itself is what the lag stands for. The instances start together, so their reports
    are taken at the same instants while their pacers agree."""
    for app in apps:
        engine = app.engine
        assert engine is not None
        engine.share_usage(True, mutations_claimed=True)
    names = {app: f"instance-{index}" for index, app in enumerate(apps)}
    section = FleetSection()
    pacers = {app: ReportPacer.for_settings(scenario.topology.report_interval_s, section.unreachable_after_seconds)
              for app in apps}
    reporters = [asyncio.create_task(_report(scenario, app, apps, stalled, names, pacers)) for app in apps]
    try:
        await asyncio.gather(*reporters)
    finally:
        for reporter in reporters:
            reporter.cancel()


async def _report(scenario: Scenario, app: ProxyApp, apps: list[ProxyApp], stalled: set[ProxyApp],
                  names: dict[ProxyApp, str], pacers: dict[ProxyApp, ReportPacer]) -> None:
    """One instance's reports, until it dies (`apps` loses it)."""
    loop = asyncio.get_running_loop()
    section = FleetSection()
    pacer = pacers[app]
    unreported_share = section.max_unreported_share / len(apps)
    lag_s = scenario.topology.exchange_lag_s
    engine = app.engine
    assert engine is not None
    seq = 0

    def deliver(to: ProxyApp, usage: list[UsageDelta], instance: str) -> None:
        assert to.engine is not None
        # Dated by the receiver's own measure of the topic's round trip, as FleetExchange._apply does.
        to.engine.record_remote_usage(usage, loop.time() * 1000.0, instance,
                                      round_trip_ms=pacers[to].least_round_trip_ms,
                                      interval_ms=pacers[to].interval_ms)

    def echo(seq: int) -> None:
        pacer.echoed(seq, loop.time() * 1000.0)

    while True:
        await asyncio.sleep(pacer.interval_ms / 1000.0)
        if app not in apps:
            return  # died
        if app in stalled:
            continue  # a stalled instance reports nothing (what it records waits for its next report)
        now_ms = loop.time() * 1000.0
        usage = engine.take_local_usage(now_ms, unreported_share)
        seq += 1
        pacer.sent(seq, now_ms)
        for other in list(apps):
            if other is not app:
                loop.call_later(lag_s, deliver, other, usage, names[app])
        loop.call_later(lag_s, echo, seq)


async def _straight_to_kafka(scenario: Scenario) -> Figures:
    loop = asyncio.get_running_loop()
    topology = scenario.topology
    broker = BrokerModel(latency_s=topology.broker_latency_s, latency_spread_s=topology.broker_latency_spread_s,
                         kafka=scenario.kafka_quotas())
    broker.listen(loop)
    records = await _drive(scenario, [(BROKER_HOST, BROKER_PORT)])
    return _figures(scenario, records, len(broker.throttles))


def kafka_sees(scenario: Scenario) -> Scenario:
    """What Kafka's run of a scenario depends on: the scenario without what acts on kqp alone
    (fair turns; a fleet's instances, exchange, and an instance that dies or stalls). Rows that
    differ only in those have the same Kafka figure for a seed."""
    return dataclasses.replace(
        scenario, quota=dataclasses.replace(scenario.quota, fair_connection_turns=False),
        topology=Topology(broker_latency_s=scenario.topology.broker_latency_s,
                          broker_latency_spread_s=scenario.topology.broker_latency_spread_s),
        faults=dataclasses.replace(scenario.faults, instance_dies_at_s=0.0, instance_stalls_at_s=0.0, stall_s=0.0))


# Kafka's figures of the last (what Kafka sees of a scenario, seed) runs in this process: the
# simulation is deterministic, so a second run would give the same acknowledgements (the
# cross-process digest test checks that). Rows that share Kafka's runs are near each other in
# the table: the last 32 runs (a run keeps 0.3-0.8 MB of acknowledgements) share 87 of the 400
# Kafka runs of `make test`, where keeping all would share 90.
_KAFKA_RUNS: OrderedDict[tuple[Scenario, int], Figures] = OrderedDict()
_KAFKA_RUNS_KEPT = 32


def forget_kafka_runs() -> None:
    """Run Kafka's model afresh from now on (a test that checks the determinism itself)."""
    _KAFKA_RUNS.clear()


@contextlib.contextmanager
def _kqp_logs_errors_only() -> Iterator[None]:
    """kqp logs errors only while a simulation runs (its warnings of closed connections are
    expected there), and at its own level again after: a test that runs after a simulation in
    the same process still sees kqp's warnings (tests/unit/proxy's caplog checks did not when
    the simulator's tests ran before them)."""
    logger = logging.getLogger("kqp")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def straight_to_kafka(scenario: Scenario, seed: int) -> Figures:
    """The scenario's clients straight to Kafka's model alone, no proxy: a client model's
    calibration against the real client on a real broker (bench/calibration.py)."""
    with _kqp_logs_errors_only():
        figures: Figures = run(lambda: _straight_to_kafka(scenario), seed, scenario.faults.on_the_loop)
    return figures


def simulate(scenario: Scenario, seed: int, engine_factory: EngineFactory = default_engine) -> Outcome:
    """Run the scenario through kqp and straight to Kafka's model, each on its own virtual loop."""
    with _kqp_logs_errors_only():
        kqp = run(lambda: _through_kqp(scenario, engine_factory), seed, scenario.faults.on_the_loop)
        key = (kafka_sees(scenario), seed)
        kafka = _KAFKA_RUNS.get(key)
        if kafka is None:
            kafka = _KAFKA_RUNS[key] = run(lambda: _straight_to_kafka(key[0]), seed, scenario.faults.on_the_loop)
            if len(_KAFKA_RUNS) > _KAFKA_RUNS_KEPT:
                _KAFKA_RUNS.popitem(last=False)
        else:
            _KAFKA_RUNS.move_to_end(key)
    return Outcome(scenario, seed, kqp, kafka)


# The scenario's parts, and which part each field of the `field=value,...` text belongs to
# (None: the scenario's own).
_PARTS: dict[str, type[Clients | Quota | Topology | Faults]] = {
    "clients": Clients, "quota": Quota, "topology": Topology, "faults": Faults}
_PART_OF: dict[str, str | None] = {
    **{f.name: part for part, kind in _PARTS.items() for f in dataclasses.fields(kind)},
    "warmup_s": None, "measure_s": None}
assert len(_PART_OF) == sum(len(dataclasses.fields(kind)) for kind in _PARTS.values()) + 2, "a field name twice"


def _changed_fields(scenario: Scenario) -> list[tuple[str, object]]:
    changed: list[tuple[str, object]] = []
    for f in dataclasses.fields(scenario):
        value = getattr(scenario, f.name)
        if f.name in _PARTS:
            changed.extend((g.name, getattr(value, g.name)) for g in dataclasses.fields(value)
                           if getattr(value, g.name) != g.default)
        elif value != f.default:
            changed.append((f.name, value))
    return changed


def parse_scenario(text: str) -> Scenario:
    """The inverse of the `field=value,...` argument of `Scenario.replay_command`."""
    values: dict[str | None, dict[str, Any]] = {None: {}, **{part: {} for part in _PARTS}}
    if text:
        for item in text.split(","):
            name, _, value = item.partition("=")
            if name not in _PART_OF:
                raise ValueError(f"a scenario has no field {name!r} (fields: {', '.join(_PART_OF)})")
            values[_PART_OF[name]][name] = _literal(value)
    parts = {part: kind(**values[part]) for part, kind in _PARTS.items()}
    return Scenario(**parts, **values[None])  # type: ignore[arg-type]


def _field_text(value: object) -> str:
    return value if isinstance(value, str) else repr(value)


def _literal(value: str) -> Any:
    try:
        result = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value  # a bare string
    if isinstance(result, float) and math.isfinite(result) and result.is_integer() and "." not in value:
        return int(result)
    return result
