"""The simulator catches what it is for: a proxy that enforces the quota wrongly fails its
checks. Each test plants a bug in one policy of the enforcement chain the real ProxyApp builds
(the product's policy, subclassed with the bug, in its place in the chain) and runs a scenario
the unplanted proxy passes, judged as `make test` judges a row: kqp's figures over the seeds
against Kafka's over the same seeds, paired by rank (kqpsim/table.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import kqp.proxy.app
from kqp.proxy.hooks import ClientView, Exchange, ResponseVerdict
from kqp.proxy.policies.chain import POLICIES, EnforcementPolicies
from kqp.proxy.policies.fair_turns import FairTurns
from kqp.proxy.policies.kafka_charging import KafkaCharging
from kqp.proxy.policies.tables import PolicyFactory
from kqpsim.scenario import KIB, MIB, Clients, Quota, Scenario, Topology, simulate
from kqpsim.table import Violation, figures, sample, violations

# A broker slow to answer (100 ms) bounds what an unthrottled connection sends, so that a
# planted bug costs seconds of simulation, not minutes.
FIVE_PRODUCERS = Scenario(Clients("librdkafka", 5, request_bytes=64 * KIB), Quota(1 * MIB),
                          topology=Topology(broker_latency_s=0.1), warmup_s=12, measure_s=24)
FIVE_JAVA_PRODUCERS_TAKING_TURNS = Scenario(Clients("java-producer", 5, request_bytes=64 * KIB),
                                            Quota(1 * MIB, fair_connection_turns=True))


class ForgetsOneConnection(KafkaCharging):
    """Planted bug: the responses of the client's first connection are neither charged nor throttled."""

    forgotten: int | None = None

    def response(self, client: ClientView, exchange: Exchange, frame: bytes | bytearray, body_offset: int,
                 body_size: int, now_ms: float) -> ResponseVerdict | None:
        if ForgetsOneConnection.forgotten is None:
            ForgetsOneConnection.forgotten = client.connection_id
        if client.connection_id == ForgetsOneConnection.forgotten:
            return None
        return super().response(client, exchange, frame, body_offset, body_size, now_ms)


class NeverMutes(KafkaCharging):
    """Planted bug: ThrottleTimeMs is set, but the connection is never muted (KIP-219 half done)."""

    def response(self, client: ClientView, exchange: Exchange, frame: bytes | bytearray, body_offset: int,
                 body_size: int, now_ms: float) -> ResponseVerdict | None:
        verdict = super().response(client, exchange, frame, body_offset, body_size, now_ms)
        if verdict is not None:
            verdict.mute_ms = 0
        return verdict


class UnderchargesProduce(KafkaCharging):
    """Planted bug: a Produce is charged 90 % of its size (a header miscounted, say)."""

    def response(self, client: ClientView, exchange: Exchange, frame: bytes | bytearray, body_offset: int,
                 body_size: int, now_ms: float) -> ResponseVerdict | None:
        size = exchange.request_bytes
        exchange.request_bytes = 4 + (size - 4) * 9 // 10  # the size prefix is not charged
        try:
            return super().response(client, exchange, frame, body_offset, body_size, now_ms)
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


def plant(monkeypatch: pytest.MonkeyPatch, buggy: PolicyFactory) -> None:
    """Has the app build its enforcement chain with `buggy` in place of the policy it subclasses."""
    factories = tuple(buggy if isinstance(buggy, type) and issubclass(buggy, factory) else factory
                      for factory in POLICIES)
    assert buggy in factories

    class Planted(EnforcementPolicies):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, factories=factories, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(kqp.proxy.app, "EnforcementPolicies", Planted)


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
    plant(monkeypatch, ForgetsOneConnection)
    found = judged(FIVE_PRODUCERS, lambda: monkeypatch.setattr(ForgetsOneConnection, "forgotten", None))
    # Over on every rank: the lowest of kqp's seeds is still over Kafka's lowest.
    assert sum(violation.kind == "over" for violation in found) == len(SEEDS), found


def test_a_throttle_that_does_not_mute_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # librdkafka ignores ThrottleTimeMs: only the mute holds it back.
    plant(monkeypatch, NeverMutes)
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
    plant(monkeypatch, UnderchargesProduce)
    samples = [sample(simulate(scenario, seed)) for seed in range(6)]
    kafka = sorted(figures("over", s)[1] for s in samples)
    assert kafka[-1] - kafka[0] > scenario.tolerance / 2, kafka  # Kafka's own figure spreads
    found = violations(scenario, samples)
    assert sum(violation.kind == "over" for violation in found) == len(samples), found


def test_fair_turns_that_skip_one_connection_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    plant(monkeypatch, TurnsForgetOneConnection)
    assert judged(FIVE_JAVA_PRODUCERS_TAKING_TURNS)
