"""Acceptance (issue 13, criterion 3): a fleet behind a TCP load balancer (HAProxy) loses one
instance mid-run; its clients reconnect through the others and the budget still holds.

What it shows are events, in the order they must happen: every instance throttles the client;
one instance is killed; each connection of a producer that the kill cut comes back through
HAProxy (to a survivor: nothing else is there) and carries acknowledgements again; the survivors
stop counting the killed instance only after a whole quota window of its silence, at their first
look past it; then every survivor throttles the client again and every producer is still
acknowledged. None of it is tied to a second of a schedule: a loaded host makes each event
later, not different (fresh clones failed the former schedule three ways, docs/testing.md). Each
wait has a liveness bound, derived below from the settings the event depends on. How closely the
survivors hold the quota is a rate, and rates on this machine are the system test's
(`make system-test`, shape `balancer`: this shape beside the same producers on one Kafka broker in
the same run).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer

from harness.load_balancer import CHECK_FALL, CHECK_INTERVAL_MS, LoadBalancer
from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess, free_port_block, start_together
from tests.integration.helpers.fleet import CLIENT_ID, QUOTA, RECORD_SIZE, fleet_config, metric, wait_for_fleet

pytestmark = pytest.mark.integration

BALANCER_HOST = "127.0.0.10"
INSTANCE_HOSTS = ["127.0.0.11", "127.0.0.12", "127.0.0.13"]

# The liveness bounds. On a working fleet each awaited event follows within a few seconds on an
# idle host; these bounds only catch one that never comes, and are what the configuration lets
# the slowest working path take:
# Kafka's default quota window (11 samples of 1 s), the sensors' span. The fleet's member
# timeout is one window too (kqp.proxy.fleet: an instance silent for a window is forgotten).
QUOTA_WINDOW_S = 11.0
# librdkafka's defaults (CONFIGURATION.md): `socket.timeout.ms`, the longest a request goes
# unanswered (a broker that stalls, a connection muted by a long throttle) before the client
# times it out and sends it again on a new connection; `reconnect.backoff.max.ms`, the longest
# it waits before connecting again.
SOCKET_TIMEOUT_S = 60.0
RECONNECT_BACKOFF_MAX_S = 10.0
# HAProxy marks a dead instance down after CHECK_FALL failed checks, CHECK_INTERVAL_MS apart;
# until then a new connection may be sent to it, refused, and redispatched (`retries 2`).
BALANCER_DOWN_S = CHECK_FALL * CHECK_INTERVAL_MS / 1000
# A producer's request is answered, or timed out and answered on a new connection, within this.
ANSWERED_WITHIN_S = SOCKET_TIMEOUT_S + RECONNECT_BACKOFF_MAX_S + BALANCER_DOWN_S
# Every instance throttles the client once the fleet's usage is over a window's worth of the
# quota: the producers offer 3x the quota, so under a window of their traffic, answered as above.
ENGAGED_WITHIN_S = QUOTA_WINDOW_S + ANSWERED_WITHIN_S
# The survivors forget the killed instance a member timeout after its last report reached them;
# that report may come late by the exchange consumer's request time-out (aiokafka's 40 s default),
# which the producers' bound above covers.
FORGOTTEN_WITHIN_S = QUOTA_WINDOW_S + ANSWERED_WITHIN_S

# Each producer's application offers the quota every second (3x in all), produced at the start of
# the second as one burst, as a batch job produces. librdkafka batches what is queued when it
# serves a partition: a burst leaves as one request of about 256 KiB where a record-by-record
# offer leaves as requests of two or three records (linger.ms 5). On a starved host (a CPU-bound
# loop beside the suite) the proxies and brokers answered those small requests at 0.2-1.5x the
# quota in all, so the fleet never reached its quota and rightly never throttled (docs/testing.md);
# in requests of a second of the quota the same host carries the offer.
RECORDS_PER_SECOND = QUOTA // RECORD_SIZE


@dataclass(frozen=True)
class BrokerView:
    """One broker in one librdkafka statistics report, as that producer sees it."""

    state: str
    # When its connection came up, in seconds of CLOCK_MONOTONIC (librdkafka's clock, and
    # time.monotonic's): the report's `ts` less the state's age. None while it is not up.
    up_since: float | None
    partitions: frozenset[int]  # of the test's topic, led by this broker


@dataclass(frozen=True)
class Stats:
    brokers: dict[int, BrokerView]  # by node id; the bootstrap entries (node -1) left out


@dataclass(frozen=True)
class Ack:
    partition: int


class BalancedProducer:
    """One librdkafka producer through the balancer: library defaults, but `acks=all` and its
    statistics every second. Its delivery reports and statistics are kept in one list in the
    order the client handed them over (one thread polls it), so an acknowledgement that comes
    after a report is one the client got after the state that report shows."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.events: list[Ack | Stats] = []
        self.acknowledged_per_second: list[int] = []
        self.failure: BaseException | None = None
        self._producer = Producer({"bootstrap.servers": bootstrap, "client.id": CLIENT_ID, "acks": "all",
                                   "statistics.interval.ms": 1000, "stats_cb": self._on_stats})

    def _on_stats(self, text: str) -> None:
        report = json.loads(text)
        brokers: dict[int, BrokerView] = {}
        for broker in report.get("brokers", {}).values():
            if int(broker.get("nodeid", -1)) < 0:
                continue
            led = frozenset(int(p["partition"]) for p in broker.get("toppars", {}).values() if p["topic"] == self.topic)
            up = broker["state"] == "UP"
            up_since = (int(report["ts"]) - int(broker["stateage"])) / 1e6 if up else None
            brokers[int(broker["nodeid"])] = BrokerView(str(broker["state"]), up_since, led)
        self.events.append(Stats(brokers))

    def run(self, start: float, stop: threading.Event) -> None:
        try:
            self._run(start, stop)
        except BaseException as exc:  # the test reads it; a thread's exception would be lost
            self.failure = exc

    def _run(self, start: float, stop: threading.Event) -> None:
        payload = b"x" * RECORD_SIZE

        def on_delivery(error: KafkaError | None, message: Message) -> None:
            if error is None:
                self.events.append(Ack(int(message.partition() or 0)))
                second = int(time.monotonic() - start)
                while len(self.acknowledged_per_second) <= second:
                    self.acknowledged_per_second.append(0)
                self.acknowledged_per_second[second] += RECORD_SIZE

        sent = 0
        while not stop.is_set():
            due = (int(time.monotonic() - start) + 1) * RECORDS_PER_SECOND  # this second's offer, at once
            while sent < due and not stop.is_set():
                try:
                    self._producer.produce(self.topic, payload, on_delivery=on_delivery)
                    sent += 1
                except BufferError:  # the queue is full: wait for acknowledgements to make room
                    self._producer.poll(0.05)
            self._producer.poll(0.05)
        # What is still queued or in flight would be acknowledged after the run.
        self._producer.purge(in_queue=True, in_flight=True)
        self._producer.flush(10)


class CutConnections:
    """What became of one producer's connections that the kill cut, read from its events as they
    come (`update`), by broker node. A connection is cut when a report after the kill shows it
    down, or up since a moment after the kill (librdkafka may reconnect between two reports), where
    the last report before the kill showed it up. `back` once a report shows it up since after the
    kill and an acknowledgement from a partition that broker leads came after that report; `cut`
    until then; `idle` for a cut connection to a broker that leads none of the topic's partitions
    (librdkafka connects only where it has something to send)."""

    def __init__(self, producer: BalancedProducer, killed_at: float) -> None:
        self.producer = producer
        self.killed_at = killed_at  # time.monotonic() just before the kill
        before = next((e for e in reversed(producer.events[:]) if isinstance(e, Stats)), Stats({}))
        self._was_up = {node for node, view in before.brokers.items() if view.state == "UP"}
        self._read = len(producer.events)
        self.fates: dict[int, str] = {}
        self._up_again: dict[int, frozenset[int]] = {}

    def update(self) -> dict[int, str]:
        events = self.producer.events
        end = len(events)
        for event in events[self._read:end]:
            if isinstance(event, Stats):
                for node, view in event.brokers.items():
                    kept = view.up_since is not None and view.up_since <= self.killed_at
                    if node not in self._was_up or kept or node in self._up_again or self.fates.get(node) == "back":
                        continue
                    self.fates[node] = "cut" if view.partitions else "idle"
                    if view.up_since is not None and view.partitions:
                        self._up_again[node] = view.partitions
            else:
                for node, led in list(self._up_again.items()):
                    if event.partition in led:
                        self.fates[node] = "back"
                        del self._up_again[node]
        self._read = end
        return self.fates


def latest_views(producer: BalancedProducer, since: float) -> dict[int, tuple[str, float | None]]:
    """The producer's last statistics report, by node: its connection's state and since when it
    has been up, in seconds from `since`."""
    last = next((e for e in reversed(producer.events[:]) if isinstance(e, Stats)), Stats({}))
    return {node: (view.state, None if view.up_since is None else round(view.up_since - since, 1))
            for node, view in last.brokers.items()}


def client_connections_to_brokers(proxy: ProxyProcess) -> int:
    """Client connections open on the instance's broker listeners (not the bootstrap listener),
    the least of three looks: HAProxy's health checks last a fraction of a millisecond."""
    def once() -> int:
        return sum(int(float(line.rsplit(" ", 1)[1])) for line in proxy.metrics_text().splitlines()
                   if line.startswith("kqp_connections_open{") and 'listener="node-' in line)
    looks = []
    for _ in range(3):
        looks.append(once())
        time.sleep(0.05)
    return min(looks)


def throttled_seconds(proxy: ProxyProcess) -> float:
    return metric(proxy, "kqp_throttle_time_seconds_total", client_id=CLIENT_ID, source="proxy") or 0.0


def await_event(condition: Callable[[], bool], within_s: float, what: str, state: Callable[[], object],
                producers: list[BalancedProducer]) -> float:
    """Seconds until `condition` held; past the liveness bound, fails with `what` and `state()`,
    and at once if a producer's thread failed."""
    began = time.monotonic()
    while not condition():
        failures = [p.failure for p in producers if p.failure is not None]
        assert not failures, f"{what}: a producer failed: {failures}"
        if time.monotonic() - began > within_s:
            raise AssertionError(f"{what}: not within the liveness bound of {within_s:.1f} s; {state()}")
        time.sleep(0.2)
    return time.monotonic() - began


@pytest.fixture
def fleet_behind_balancer(
    kafka_3nodes: KafkaCluster, tmp_path: Path, topic_name: str
) -> Iterator[tuple[LoadBalancer, list[ProxyProcess]]]:
    """Three instances on the same ports of 127.0.0.11-13, advertising HAProxy on 127.0.0.10."""
    usage_topic = f"_kqp_usage-{topic_name}"[:200]
    highest_node = max(kafka_3nodes.nodes)
    base = free_port_block(highest_node + 2, hosts=[BALANCER_HOST, *INSTANCE_HOSTS])
    node_port_base, bootstrap_port = base + 1, base + highest_node + 2
    proxies = [
        ProxyProcess(kafka_3nodes.bootstrap, tmp_path / f"instance-{index}.log",
                     config=fleet_config(tmp_path / f"instance-{index}.yaml", usage_topic),
                     bind_host=host, advertised_host=BALANCER_HOST, ports=(bootstrap_port, node_port_base))
        for index, host in enumerate(INSTANCE_HOSTS)
    ]
    balancer = LoadBalancer(BALANCER_HOST, [bootstrap_port, *(node_port_base + n for n in kafka_3nodes.nodes)],
                            INSTANCE_HOSTS, tmp_path)
    started: list[ProxyProcess] = []
    try:
        started.extend(start_together(proxies))
        balancer.start()
        yield balancer, proxies
    finally:
        balancer.stop()
        codes = {proxy.log_path.name: proxy.stop() for proxy in started}
    survivors = {name: code for name, code in codes.items() if code != -9}
    assert all(code == 0 for code in survivors.values()), f"an instance did not exit cleanly: {codes}"


def departures_logged(proxy: ProxyProcess, instance_suffix: str) -> list[tuple[float, float, float]]:
    """(silent, member timeout, since the previous check) in seconds, for each time the instance
    logged that an instance whose id ends with `instance_suffix` left the fleet."""
    pattern = re.compile(rf"instance \S+{re.escape(instance_suffix)} left the fleet: no report for ([\d.]+) s, "
                         r"over the member timeout of ([\d.]+) s .*the previous membership check was ([\d.]+) s before")
    return [(float(m[1]), float(m[2]), float(m[3])) for m in pattern.finditer(proxy.log_path.read_text())]


def test_a_killed_instance_leaves_its_clients_to_the_others_and_the_budget_holds(
    fleet_behind_balancer: tuple[LoadBalancer, list[ProxyProcess]], kafka_3nodes: KafkaCluster, topic_name: str
) -> None:
    balancer, proxies = fleet_behind_balancer
    wait_for_fleet(proxies)
    kafka_3nodes.create_topic(topic_name, partitions=3)
    bootstrap = f"{balancer.listen_host}:{balancer.ports[0]}"
    producers = [BalancedProducer(bootstrap, topic_name) for _ in range(3)]
    stop = threading.Event()
    start = time.monotonic()
    threads = [threading.Thread(target=p.run, args=(start, stop)) for p in producers]
    for thread in threads:
        thread.start()
    victim, survivors = proxies[-1], proxies[:-1]

    def acknowledged() -> str:
        seconds = max(len(p.acknowledged_per_second) for p in producers)
        totals = [sum(p.acknowledged_per_second[i] for p in producers if i < len(p.acknowledged_per_second))
                  for i in range(seconds)]
        return f"acknowledged per second (x quota) {[round(t / QUOTA, 1) for t in totals]}"

    try:
        # 1. The balancer spread the client-id's connections: every instance throttles it.
        engaged = await_event(
            lambda: all(throttled_seconds(p) > 0 for p in proxies), ENGAGED_WITHIN_S,
            f"every instance throttles {CLIENT_ID}",
            lambda: f"seconds of throttle per instance {[throttled_seconds(p) for p in proxies]}, fleet instances "
                    f"seen {[metric(p, 'kqp_fleet_instances') for p in proxies]}; {acknowledged()}", producers)

        # 2. The kill. What it cuts: the victim's client connections to brokers, each a producer's.
        victim_held = client_connections_to_brokers(victim)
        assert victim_held >= 1, "the balancer gave the instance to be killed no client"
        assert victim.process is not None
        victim_id_suffix = f":{victim.process.pid}"  # kqp.proxy.fleet.default_instance_id
        cuts = [CutConnections(p, time.monotonic()) for p in producers]
        victim.process.kill()
        victim.process.wait(10)
        killed = time.monotonic()

        # 3. Each connection the kill cut comes back through HAProxy to a survivor and is acknowledged
        # again. Every cut is counted: the producers saw at least as many as the victim held.
        def fates() -> list[dict[int, str]]:
            return [c.update() for c in cuts]

        def all_back() -> bool:
            now = fates()
            every = [fate for f in now for fate in f.values()]
            return len(every) >= victim_held and "cut" not in every and "back" in every

        await_event(
            all_back, ANSWERED_WITHIN_S,
            f"the {victim_held} connections the killed instance held come back through the survivors",
            lambda: f"per producer, broker node: fate {fates()}, state and seconds up since the kill in its last "
                    f"report {[latest_views(p, killed) for p in producers]}; {acknowledged()}", producers)
        reconnected = time.monotonic() - killed

        # 4. The survivors forget the killed instance, at their first membership check past one
        # member timeout (a quota window) of its silence, each on its own clock (kqp.proxy.fleet's log).
        await_event(
            lambda: all(metric(p, "kqp_fleet_instances") == 2 for p in survivors), FORGOTTEN_WITHIN_S,
            "the survivors count two instances",
            lambda: f"fleet instances seen {[metric(p, 'kqp_fleet_instances') for p in survivors]}", producers)
        forgotten = time.monotonic() - killed
        for survivor in survivors:
            departures = departures_logged(survivor, victim_id_suffix)
            assert departures, f"{survivor.log_path.name} logged no departure of the killed instance"
            # Not before a whole window of silence, and at the first check after it (a survivor
            # that read a late report of it after forgetting it forgets it again, so as well).
            for silent, member_timeout, since_check in departures:
                assert member_timeout == QUOTA_WINDOW_S
                assert member_timeout < silent <= member_timeout + since_check + 0.001, departures

        # 5. The budget holds without it: every survivor throttles the client again, and every
        # producer is still acknowledged.
        throttled_then = [throttled_seconds(p) for p in survivors]
        acks_then = [len(p.events) for p in producers]
        await_event(
            lambda: all(throttled_seconds(p) > t for p, t in zip(survivors, throttled_then, strict=True))
            and all(any(isinstance(e, Ack) for e in islice(p.events, i, None))
                    for p, i in zip(producers, acks_then, strict=True)),
            ANSWERED_WITHIN_S, "every survivor throttles the client again and every producer is acknowledged",
            lambda: f"seconds of throttle per survivor, then {throttled_then} and now "
                    f"{[throttled_seconds(p) for p in survivors]}; {acknowledged()}", producers)
        held = time.monotonic() - killed
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert [p.failure for p in producers] == [None, None, None]
    print(f"every instance throttled the client {engaged:.1f} s after the producers started; the kill cut "
          f"{victim_held} client connections to brokers, all back through the survivors and acknowledged "
          f"{reconnected:.1f} s after it (per producer, broker node: {[c.fates for c in cuts]}); the survivors "
          f"had forgotten the killed instance by {forgotten:.1f} s after it and throttled the client again by "
          f"{held:.1f} s; "
          f"{acknowledged()}, the kill in second {killed - start:.0f}")
