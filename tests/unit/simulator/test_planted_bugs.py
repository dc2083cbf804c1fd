"""The simulator catches what it is for: a proxy that enforces the quota wrongly fails its
checks. Each test plants a bug in one policy of the enforcement chain the real ProxyApp builds
(the product's policy, subclassed with the bug, in its place in the chain) and runs a scenario
the unplanted proxy passes."""

from __future__ import annotations

import pytest

import kqp.proxy.app
from kqp.proxy.hooks import ClientView, Exchange, ResponseVerdict
from kqp.proxy.policies.chain import POLICIES, EnforcementPolicies
from kqp.proxy.policies.fair_turns import FairTurns
from kqp.proxy.policies.kafka_charging import KafkaCharging
from kqp.proxy.policies.tables import PolicyFactory
from kqpsim.scenario import KIB, MIB, Scenario, simulate
from kqpsim.table import violations

# A broker slow to answer (100 ms) bounds what an unthrottled connection sends, so that a
# planted bug costs seconds of simulation, not minutes.
FIVE_PRODUCERS = Scenario("librdkafka", connections=5, quota=1 * MIB, request_bytes=64 * KIB, broker_latency_s=0.1,
                          warmup_s=12, measure_s=24)
FIVE_JAVA_PRODUCERS_TAKING_TURNS = Scenario("java-producer", connections=5, quota=1 * MIB, request_bytes=64 * KIB,
                                            fair_connection_turns=True)


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


@pytest.mark.parametrize("seed", [0, 1])
def test_the_unplanted_proxy_passes_these_scenarios(seed: int) -> None:
    for scenario in (FIVE_PRODUCERS, FIVE_JAVA_PRODUCERS_TAKING_TURNS):
        outcome = simulate(scenario, seed)
        assert violations(outcome) == [], outcome.describe()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_policy_that_forgets_one_connections_bytes_is_caught(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    plant(monkeypatch, ForgetsOneConnection)
    monkeypatch.setattr(ForgetsOneConnection, "forgotten", None)
    outcome = simulate(FIVE_PRODUCERS, seed)
    found = violations(outcome)
    assert any(violation.kind == "over" for violation in found), outcome.describe()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_throttle_that_does_not_mute_is_caught(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    # librdkafka ignores ThrottleTimeMs: only the mute holds it back.
    plant(monkeypatch, NeverMutes)
    outcome = simulate(FIVE_PRODUCERS, seed)
    assert any(violation.kind == "over" for violation in violations(outcome)), outcome.describe()


@pytest.mark.parametrize("seed", [0, 1])
def test_fair_turns_that_skip_one_connection_are_caught(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    plant(monkeypatch, TurnsForgetOneConnection)
    outcome = simulate(FIVE_JAVA_PRODUCERS_TAKING_TURNS, seed)
    assert violations(outcome), outcome.describe()
