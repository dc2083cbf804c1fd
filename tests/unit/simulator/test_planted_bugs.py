"""The simulator catches what it is for: a proxy that enforces the quota wrongly fails its
checks. Each test plants a bug in the quota hook the real ProxyApp builds (the product's
class, subclassed with the bug) and runs a scenario the unplanted proxy passes."""

from __future__ import annotations

import pytest

import kqp.proxy.app
from kqp.proxy.enforcement import QuotaEnforcement
from kqp.proxy.hooks import ClientView, Exchange, ResponseVerdict
from tests.unit.helpers.simulator.scenario import KIB, MIB, Scenario, simulate
from tests.unit.helpers.simulator.table import violations

# A broker slow to answer (100 ms) bounds what an unthrottled connection sends, so that a
# planted bug costs seconds of simulation, not minutes.
FIVE_PRODUCERS = Scenario("librdkafka", connections=5, quota=1 * MIB, request_bytes=64 * KIB, broker_latency_s=0.1,
                          warmup_s=12, measure_s=24)
FIVE_JAVA_PRODUCERS_TAKING_TURNS = Scenario("java-producer", connections=5, quota=1 * MIB, request_bytes=64 * KIB,
                                            fair_connection_turns=True)


class ForgetsOneConnection(QuotaEnforcement):
    """Planted bug: the responses of the client's first connection are neither charged nor throttled."""

    forgotten: int | None = None

    def response(self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int
                 ) -> ResponseVerdict | None:
        if ForgetsOneConnection.forgotten is None:
            ForgetsOneConnection.forgotten = client.connection_id
        if client.connection_id == ForgetsOneConnection.forgotten:
            return None
        return super().response(client, exchange, frame, body_offset)


class NeverMutes(QuotaEnforcement):
    """Planted bug: ThrottleTimeMs is set, but the connection is never muted (KIP-219 half done)."""

    def response(self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int
                 ) -> ResponseVerdict | None:
        verdict = super().response(client, exchange, frame, body_offset)
        if verdict is not None:
            verdict.mute_ms = 0
        return verdict


class TurnsForgetOneConnection(QuotaEnforcement):
    """Planted bug: with fair turns, one connection is never held for the others' throttles
    (its mutes from the shared budget are dropped; its own throttle still applies)."""

    def response(self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int
                 ) -> ResponseVerdict | None:
        verdict = super().response(client, exchange, frame, body_offset)
        if client.connection_id == 1 and verdict is not None:
            verdict.mute_ms = min(verdict.mute_ms, exchange.proxy_throttle_ms)
        return verdict


@pytest.mark.parametrize("seed", [0, 1])
def test_the_unplanted_proxy_passes_these_scenarios(seed: int) -> None:
    for scenario in (FIVE_PRODUCERS, FIVE_JAVA_PRODUCERS_TAKING_TURNS):
        outcome = simulate(scenario, seed)
        assert violations(outcome) == [], outcome.describe()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_policy_that_forgets_one_connections_bytes_is_caught(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setattr(kqp.proxy.app, "QuotaEnforcement", ForgetsOneConnection)
    monkeypatch.setattr(ForgetsOneConnection, "forgotten", None)
    outcome = simulate(FIVE_PRODUCERS, seed)
    found = violations(outcome)
    assert any("over max(quota" in finding for finding in found), outcome.describe()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_throttle_that_does_not_mute_is_caught(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    # librdkafka ignores ThrottleTimeMs: only the mute holds it back.
    monkeypatch.setattr(kqp.proxy.app, "QuotaEnforcement", NeverMutes)
    outcome = simulate(FIVE_PRODUCERS, seed)
    assert any("over max(quota" in finding for finding in violations(outcome)), outcome.describe()


@pytest.mark.parametrize("seed", [0, 1])
def test_fair_turns_that_skip_one_connection_are_caught(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setattr(kqp.proxy.app, "QuotaEnforcement", TurnsForgetOneConnection)
    outcome = simulate(FIVE_JAVA_PRODUCERS_TAKING_TURNS, seed)
    assert violations(outcome), outcome.describe()
