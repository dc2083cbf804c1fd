"""The simulator catches what it is for: a proxy that enforces the quota wrongly fails its
checks. Each test plants a bug in one policy of the enforcement chain the real ProxyApp builds
(the product's policy, wrapped or subclassed with the bug, in its place in the chain) and runs
a scenario the unplanted proxy passes, judged as `make test` judges a row: kqp's figures over
the seeds against Kafka's over the same seeds, paired by rank (kqpsim/table.py).

Kafka's charging and the chain are compiled in the compiled build (kqp/compiled_modules.py),
and an interpreted class cannot subclass a compiled one: the bugs planted in Kafka's charging
wrap the product's policy (`InKafkaCharging`) instead of subclassing it, and the app is handed
a chain made with the planted factories instead of a subclass of the chain."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import kqp.proxy.app
from kqp.config.models import EnforcementSection
from kqp.proxy.hooks import ClientView, Exchange, RequestVerdict, ResponseVerdict
from kqp.proxy.policies.chain import POLICIES, EnforcementPolicies
from kqp.proxy.policies.fair_turns import FairTurns
from kqp.proxy.policies.kafka_charging import KafkaCharging
from kqp.proxy.policies.policy import PHASES, Policy
from kqp.proxy.policies.registry import PolicyRegistry
from kqp.proxy.policies.tables import PolicyFactory
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import QuotaEngine, QuotaSettings
from kqpsim.scenario import KIB, MIB, Clients, Quota, Scenario, Topology, simulate
from kqpsim.table import Violation, figures, sample, violations

# A broker slow to answer (100 ms) bounds what an unthrottled connection sends, so that a
# planted bug costs seconds of simulation, not minutes.
FIVE_PRODUCERS = Scenario(Clients("librdkafka", 5, request_bytes=64 * KIB), Quota(1 * MIB),
                          topology=Topology(broker_latency_s=0.1), warmup_s=12, measure_s=24)
FIVE_JAVA_PRODUCERS_TAKING_TURNS = Scenario(Clients("java-producer", 5, request_bytes=64 * KIB),
                                            Quota(1 * MIB, fair_connection_turns=True))


class InKafkaCharging(Policy):
    """Kafka's charging with a bug to plant in it: it takes part in the phases, for the APIs,
    under the settings KafkaCharging does, and hands each call to the product's own object of
    the connection (`charging`), which a subclass calls where its bug leaves the product's way."""

    request_apis = KafkaCharging.request_apis
    response_apis = KafkaCharging.response_apis

    def __init__(self, registry: PolicyRegistry) -> None:
        self.charging = KafkaCharging(registry)

    @classmethod
    def enabled(cls, settings: EnforcementSection, quotas: QuotaSettings) -> bool:
        return KafkaCharging.enabled(settings, quotas)

    def request(self, client: ClientView, exchange: Exchange, frame: bytes, now_ms: float) -> RequestVerdict | None:
        return self.charging.request(client, exchange, frame, now_ms)

    def response(self, client: ClientView, exchange: Exchange, frame: bytes | bytearray, body_offset: int,
                 body_size: int, now_ms: float) -> ResponseVerdict | None:
        return self.charging.response(client, exchange, frame, body_offset, body_size, now_ms)


class ForgetsOneConnection(InKafkaCharging):
    """Planted bug: the responses of the client's first connection are neither charged nor throttled."""

    forgotten: int | None = None

    def response(self, client: ClientView, exchange: Exchange, frame: bytes | bytearray, body_offset: int,
                 body_size: int, now_ms: float) -> ResponseVerdict | None:
        if ForgetsOneConnection.forgotten is None:
            ForgetsOneConnection.forgotten = client.connection_id
        if client.connection_id == ForgetsOneConnection.forgotten:
            return None
        return self.charging.response(client, exchange, frame, body_offset, body_size, now_ms)


class NeverMutes(InKafkaCharging):
    """Planted bug: ThrottleTimeMs is set, but the connection is never muted (KIP-219 half done)."""

    def response(self, client: ClientView, exchange: Exchange, frame: bytes | bytearray, body_offset: int,
                 body_size: int, now_ms: float) -> ResponseVerdict | None:
        verdict = self.charging.response(client, exchange, frame, body_offset, body_size, now_ms)
        if verdict is not None:
            verdict.mute_ms = 0
        return verdict


class UnderchargesProduce(InKafkaCharging):
    """Planted bug: a Produce is charged 90 % of its size (a header miscounted, say)."""

    def response(self, client: ClientView, exchange: Exchange, frame: bytes | bytearray, body_offset: int,
                 body_size: int, now_ms: float) -> ResponseVerdict | None:
        size = exchange.request_bytes
        exchange.request_bytes = 4 + (size - 4) * 9 // 10  # the size prefix is not charged
        try:
            return self.charging.response(client, exchange, frame, body_offset, body_size, now_ms)
        finally:
            exchange.request_bytes = size


class TurnsForgetOneConnection(FairTurns):
    """Planted bug: with fair turns, one connection is never held for the others' throttles
    (its turn is cut to its own throttle; its own throttle still applies)."""

    def turn(self, client: ClientView, exchange: Exchange, body_size: int, throttle_ms: int,
             now_ms: float, delivered: bool = True) -> int | None:
        mute_ms = super().turn(client, exchange, body_size, throttle_ms, now_ms, delivered)
        if client.connection_id == 1 and mute_ms is not None:
            return min(mute_ms, throttle_ms)
        return mute_ms


def plant(monkeypatch: pytest.MonkeyPatch, buggy: PolicyFactory, in_place_of: PolicyFactory) -> None:
    """Has the app build its enforcement chain with `buggy` in place of the product's policy `in_place_of`."""
    assert in_place_of in POLICIES
    factories = tuple(buggy if factory is in_place_of else factory for factory in POLICIES)

    def planted(engine: QuotaEngine, settings: EnforcementSection, clock_ms: Callable[[], float],
                topics: TopicDirectory) -> EnforcementPolicies:
        return EnforcementPolicies(engine, settings, clock_ms, topics, factories)

    monkeypatch.setattr(kqp.proxy.app, "EnforcementPolicies", planted)


def test_the_wrapper_takes_part_where_kafka_charging_does() -> None:
    # Else a bug planted through it would also drop (or add) the phases it does not touch.
    assert [phase for phase in PHASES if getattr(KafkaCharging, phase) is not getattr(Policy, phase)] == [
        phase for phase in PHASES if getattr(InKafkaCharging, phase) is not getattr(Policy, phase)]
    assert (InKafkaCharging.hold_apis, InKafkaCharging.request_apis, InKafkaCharging.response_apis) == (
        KafkaCharging.hold_apis, KafkaCharging.request_apis, KafkaCharging.response_apis)


SEEDS = (0, 1)


def judged(scenario: Scenario, before_each_seed: Callable[[], None] = lambda: None) -> list[Violation]:
    """The violations of the scenario over SEEDS, with kqp's figures of every seed (the lowest
    too, not only one) held to Kafka's of the same rank."""
    samples = []
    for seed in SEEDS:
        before_each_seed()
        samples.append(sample(simulate(scenario, seed)))
    return violations(scenario, samples)


def test_the_unplanted_proxy_passes_these_scenarios() -> None:
    for scenario in (FIVE_PRODUCERS, FIVE_JAVA_PRODUCERS_TAKING_TURNS):
        assert judged(scenario) == [], scenario.name


def test_a_policy_that_forgets_one_connections_bytes_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    plant(monkeypatch, ForgetsOneConnection, KafkaCharging)
    found = judged(FIVE_PRODUCERS, lambda: monkeypatch.setattr(ForgetsOneConnection, "forgotten", None))
    # Over on every rank: the lowest of kqp's seeds is still over Kafka's lowest.
    assert sum(violation.kind == "over" for violation in found) == len(SEEDS), found


def test_a_throttle_that_does_not_mute_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # librdkafka ignores ThrottleTimeMs: only the mute holds it back.
    plant(monkeypatch, NeverMutes, KafkaCharging)
    found = judged(FIVE_PRODUCERS)
    assert sum(violation.kind == "over" for violation in found) == len(SEEDS), found


def test_a_charge_ten_percent_short_is_caught_where_kafkas_own_figure_spreads_by_phase(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # librdkafka at 64 KiB/s with requests of 3 s of quota: Kafka's model admits 1.080-1.148x
    # over these seeds by phase alone (docs/quotas.md, finding d), and the tolerance is 0.058.
    # Charged 90 %, kqp admits 1.268x on every seed: over Kafka's figure of the same rank at
    # every rank, the highest included. (Charged 95 % it admits 1.112x, within the tolerance of
    # Kafka's 1.080x, seed by seed as by rank.)
    scenario = Scenario(Clients("librdkafka", 1, request_bytes=192 * KIB), Quota(64 * KIB))
    assert violations(scenario, [sample(simulate(scenario, seed)) for seed in range(6)]) == []  # unplanted
    plant(monkeypatch, UnderchargesProduce, KafkaCharging)
    samples = [sample(simulate(scenario, seed)) for seed in range(6)]
    kafka = sorted(figures("over", s)[1] for s in samples)
    assert kafka[-1] - kafka[0] > scenario.tolerance / 2, kafka  # Kafka's own figure spreads
    found = violations(scenario, samples)
    assert sum(violation.kind == "over" for violation in found) == len(samples), found


def test_fair_turns_that_skip_one_connection_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    plant(monkeypatch, TurnsForgetOneConnection, FairTurns)
    assert judged(FIVE_JAVA_PRODUCERS_TAKING_TURNS)
