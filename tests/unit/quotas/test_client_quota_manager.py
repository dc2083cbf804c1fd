"""Produce/fetch byte-rate quotas against ClientQuotaManagerTest (spec §9 D)."""

from __future__ import annotations

import pytest

from kqp.quotas import QuotaEngine, QuotaSettings, QuotaType
from tests.unit.helpers.quotas import D, FakeClock, settings_for

PRODUCE: QuotaType = "producer_byte_rate"


def test_client_quota_manager_test_quota_violation_d1() -> None:
    engine = QuotaEngine(settings_for(PRODUCE, {(None, D): 500}))
    clock = FakeClock()

    def produce(nbytes: int) -> int:
        return engine.record_produce("1", "ANONYMOUS", "unknown", nbytes, clock.now_ms)

    for _ in range(10):
        assert produce(400) == 0
        clock.sleep(1000)
    clock.now_ms = 10_500
    assert produce(2300) == 2100  # (6300 / 10.5 - 500) / 500 * 10500
    clock.now_ms = 12_600
    for _ in range(8):
        assert produce(400) == 1200
        clock.sleep(1000)
    assert produce(400) == 1700  # at 20600
    clock.sleep(1000)
    assert produce(400) == 0
    clock.sleep(1000)
    assert produce(0) == 0  # the bursty sample has rolled over


# D2 — testQuotaConfigPrecedence. All records at one instant; each check records value x 11.
D2_QUOTAS = {
    (D, None): 1000,
    (None, D): 2000,
    (D, D): 3000,
    ("userA", None): 4000,
    ("userA", "client1"): 5000,
    ("userB", None): 6000,
    ("userB", "client1"): 7000,
    ("userB", D): 8000,
    ("userC", None): 10000,
    (None, "client1"): 9000,
}


def test_client_quota_manager_test_quota_config_precedence_d2() -> None:
    quotas: dict[tuple[str | None, str | None], float] = dict(D2_QUOTAS)
    engine = QuotaEngine(settings_for(PRODUCE, quotas))

    def check(user: str, client: str, bound: float, value: int, throttle: int) -> None:
        assert engine.quota(PRODUCE, user, client) == bound, (user, client)
        assert engine.record_produce("1", user, client, value * 11, 0) == throttle, (user, client)

    def reconfigure(**changes: float | None) -> None:
        for key, value in changes.items():
            user, client = key.split("__")
            entity = (
                None if user == "none" else D if user == "default" else user,
                None if client == "none" else D if client == "default" else client,
            )
            if value is None:
                del quotas[entity]
            else:
                quotas[entity] = value
        engine.update(settings_for(PRODUCE, quotas))

    check("userA", "client1", 5000, 4500, 0)
    check("userA", "client2", 4000, 4500, 2375)
    check("userA", "client3", 4000, 0, 2375)  # the user quota is shared
    check("userA", "client1", 5000, 0, 0)  # (user, client-id) is exclusive
    check("userB", "client1", 7000, 8000, 2571)
    check("userB", "client2", 8000, 7000, 0)  # per-client default: exclusive
    check("userB", "client3", 8000, 7000, 0)
    check("userD", "client1", 3000, 3500, 2833)
    check("userD", "client2", 3000, 2500, 0)
    check("userE", "client1", 3000, 2500, 0)
    reconfigure(default__default=None)
    check("userD", "client1", 1000, 0, 0)  # tags changed, the counter restarts
    check("userE", "client4", 1000, 1500, 6500)
    check("userF", "client4", 1000, 800, 0)
    check("userF", "client5", 1000, 800, 7600)  # the default user quota is shared
    reconfigure(default__none=None)
    check("userF", "client4", 2000, 0, 0)
    check("userF", "client5", 2000, 0, 0)
    check("userF", "client5", 2000, 2500, 3750)
    check("userG", "client5", 2000, 0, 3750)  # the client-id quota is shared across users
    reconfigure(userA__none=8000, userA__client1=10000)
    check("userA", "client2", 8000, 0, 0)
    check("userA", "client2", 8000, 4500, 2375)  # summed with earlier values
    check("userA", "client1", 10000, 0, 0)
    check("userA", "client1", 10000, 6000, 1550)
    reconfigure(userA__client1=None)
    check("userA", "client6", 8000, 0, 2375)  # the shared user quota
    reconfigure(userA__client6=11000)
    check("userA", "client6", 11000, 8500, 0)
    reconfigure(userA__default=12000, userA__client6=None)
    check("userA", "client6", 12000, 4000, 1458)  # summed with earlier values


@pytest.mark.parametrize(
    "entity",
    [
        pytest.param((D, None), id="default-user"),
        pytest.param(("userA", None), id="user"),
        pytest.param(("userA", "client1"), id="user-client"),
    ],
)
def test_client_quota_manager_test_set_and_remove_quota_d3(entity: tuple[str | None, str | None]) -> None:
    engine = QuotaEngine(QuotaSettings())
    # D3a: no quotas at all: nothing recorded, no cap.
    assert engine.quota(PRODUCE, "userA", "client1") is None
    assert engine.fetch_max_bytes_cap("1", "userA", "client1", 0) is None
    assert engine.record_produce("1", "userA", "client1", 11_000, 0) == 0
    assert engine.tracked_sensors() == 0
    # D3b: a quota of 10.
    engine.update(settings_for(PRODUCE, {entity: 10}))
    assert engine.quota(PRODUCE, "userA", "client1") == 10
    assert engine.record_produce("1", "userA", "client1", 11_000, 0) == 1_090_000
    # D3c: removed again: the bound goes back to "no quota" and nothing throttles.
    engine.update(QuotaSettings())
    assert engine.quota(PRODUCE, "userA", "client1") is None
    assert engine.record_produce("1", "userA", "client1", 11_000, 0) == 0


def test_get_max_value_in_quota_window_d3_d4() -> None:
    engine = QuotaEngine(settings_for("consumer_byte_rate", {("userA", None): 10}))
    assert engine.fetch_max_bytes_cap("1", "userA", "client1", 0) == 100
    assert engine.fetch_max_bytes_cap("1", "userB", "client1", 0) is None  # no limit for these tags
    # testGetMaxValueInQuotaWindowWithNonDefaultQuotaWindow: N = 4, W = 1 s.
    engine = QuotaEngine(settings_for("consumer_byte_rate", {(D, None): 10}, window_num=4))
    assert engine.fetch_max_bytes_cap("1", "userA", "client1", 0) == 30
    assert QuotaEngine(QuotaSettings(window_num=4)).fetch_max_bytes_cap("1", "u", "c", 0) is None


@pytest.mark.parametrize(
    ("c1", "c2", "default"),
    [
        pytest.param((None, "c1"), (None, "c2"), (None, D), id="client-id"),
        pytest.param(("c1", None), ("c2", None), (D, None), id="user"),
        pytest.param(("c1", "c1"), ("c2", "c2"), (D, D), id="user-client-id"),
    ],
)
def test_client_quota_manager_test_quota_parsing_d5(
    c1: tuple[str | None, str | None], c2: tuple[str | None, str | None], default: tuple[str | None, str | None]
) -> None:
    engine = QuotaEngine(settings_for(PRODUCE, {c1: 2000, c2: 4000}))
    assert engine.quota(PRODUCE, "random", "random") is None
    assert engine.record_produce("1", "c1", "c1", 2500 * 11, 0) == 3750
    engine.update(settings_for(PRODUCE, {c1: 3000, c2: 4000}))
    assert engine.record_produce("1", "c1", "c1", 0, 0) == 0
    engine.update(settings_for(PRODUCE, {c1: 500, c2: 4000}))
    assert engine.record_produce("1", "c1", "c1", 0, 0) == 45000
    engine.update(settings_for(PRODUCE, {c2: 4000, default: 4000}))
    assert engine.quota(PRODUCE, "c1", "c1") == 4000
    assert engine.record_produce("1", "c1", "c1", 1000 * 11, 0) == 0  # 38500 / 10 = 3850 <= 4000


def test_client_quota_manager_test_client_id_not_sanitized_d7() -> None:
    engine = QuotaEngine(settings_for(PRODUCE, {(None, D): 1000}))
    engine.record_produce("1", "ANONYMOUS", "client@#$%", 10, 0)
    (snapshot,) = engine.snapshot()
    assert snapshot.tags == {"user": "", "client-id": "client@#$%"}


def test_user_tag_is_sanitized_like_kafka() -> None:
    engine = QuotaEngine(settings_for(PRODUCE, {("a b*c~@", None): 1000}))
    assert engine.quota(PRODUCE, "a b*c~@", "x") == 1000
    engine.record_produce("1", "a b*c~@", "x", 10, 0)
    (snapshot,) = engine.snapshot()
    assert snapshot.user == "a%20b%2Ac%7E%40"
    assert snapshot.limit == 1000


def test_fetch_unrecords_throttled_bytes_g_fetch() -> None:
    """G-fetch: a throttled fetch is unrecorded (empty response); produce is not."""
    fetch = QuotaEngine(settings_for("consumer_byte_rate", {(None, D): 100}))
    produce = QuotaEngine(settings_for(PRODUCE, {(None, D): 100}))

    def rate(engine: QuotaEngine, now: int) -> float:
        return next(iter(engine.snapshot(now))).value

    assert fetch.record_fetch("1", "u", "c", 500, 0) == 0
    assert produce.record_produce("1", "u", "c", 500, 0) == 0
    assert fetch.record_fetch("1", "u", "c", 1000, 0) == 5000
    assert produce.record_produce("1", "u", "c", 1000, 0) == 5000
    assert rate(fetch, 0) == 50
    assert fetch.record_fetch("1", "u", "c", 0, 5000) == 0
    assert produce.record_produce("1", "u", "c", 0, 5000) == 5000  # windowSize padded to 10 s
    assert fetch.record_fetch("1", "u", "c", 600, 5000) == 1000
    assert rate(fetch, 5000) == 50
    assert produce.record_produce("1", "u", "c", 0, 15000) == 0


def test_fetch_is_unrecorded_when_the_request_quota_throttles_it() -> None:
    engine = QuotaEngine(settings_for("consumer_byte_rate", {(None, D): 100}))
    assert engine.record_fetch("1", "u", "c", 500, 0, request_throttle_ms=300) == 0
    assert next(iter(engine.snapshot(0))).value == 0
