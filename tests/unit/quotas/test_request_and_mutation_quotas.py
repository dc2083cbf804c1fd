"""Request-time (spec §9 E), controller mutation (F), combining (G) and IP connection rate (H)."""

from __future__ import annotations

import pytest

from kqp.quotas import EXEMPT_REQUEST_API_KEYS, IpQuotaEntry, MutationOutcome, QuotaEngine, QuotaSettings
from tests.unit.helpers.quotas import D, settings_for

CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS = 19, 20, 37


def test_client_request_quota_manager_test_request_percentage_quota_violation_e1() -> None:
    engine = QuotaEngine(settings_for("request_percentage", {("ANONYMOUS", "test-client"): 1}))

    def request(ms: float, now: int) -> int:
        return engine.record_request_time("1", "ANONYMOUS", "test-client", 3, ms, now)

    for t in range(0, 10_000, 1000):
        assert request(4, t) == 0
    assert request(67.1, 10_500) == 210  # (10.2 - 10) / 10 * 10500
    for t in range(10_710, 20_710, 1000):
        assert request(4, t) == 400
    assert request(4, 20_710) == 900
    assert request(0, 21_710) == 0
    assert request(500, 21_710) == 1000  # capped at the quota window
    for t in range(22_710, 32_710, 1000):
        assert request(0, t) == 1000
    assert request(0, 32_710) == 0


# Kafka 4.3.1's exemptions, read from KafkaApis/ControllerApis bytecode (handlers that send
# with sendResponseExemptThrottle): WriteTxnMarkers; AlterPartition and the controller-only
# KRaft RPCs Vote, BeginQuorumEpoch, EndQuorumEpoch, FetchSnapshot, UpdateRaftVoter.
KAFKA_431_EXEMPT = [27, 52, 53, 54, 56, 59, 82]
# Charged by Kafka 4.3.1 although kqp once exempted them (or their brokers forward them and
# charge): ZooKeeper-era keys gone since 4.0 included.
KAFKA_431_CHARGED = [4, 5, 6, 7, 55, 57, 58, 62, 63, 67, 70, 80, 81, 83, 84, 85, 86, 87]


@pytest.mark.parametrize("api_key", KAFKA_431_EXEMPT)
def test_exempt_apis_are_never_charged(api_key: int) -> None:
    engine = QuotaEngine(settings_for("request_percentage", {(None, D): 0.001}))
    assert engine.record_request_time("1", "u", "c", api_key, 10_000, 0) == 0
    assert engine.tracked_sensors() == 0


@pytest.mark.parametrize("api_key", KAFKA_431_CHARGED)
def test_apis_kafka_charges_are_charged(api_key: int) -> None:
    # 0.001 % of a thread is 0.00001 s of time per second; 10 s of request time throttles
    # for the whole 1000 ms window the request quota's throttle is capped at.
    engine = QuotaEngine(settings_for("request_percentage", {(None, D): 0.001}))
    assert engine.record_request_time("1", "u", "c", api_key, 10_000, 0) == 1000


def test_the_exempt_list_is_exactly_kafkas() -> None:
    assert sorted(EXEMPT_REQUEST_API_KEYS) == KAFKA_431_EXEMPT


def test_acks0_produce_and_follower_fetch_are_exempt_by_flag() -> None:
    engine = QuotaEngine(settings_for("request_percentage", {(None, D): 0.001}))
    assert engine.record_request_time("1", "u", "c", 0, 10_000, 0, exempt=True) == 0
    assert engine.record_request_time("1", "u", "c", 0, 10_000, 0) == 1000


def test_update_features_is_a_cluster_action_that_is_throttled() -> None:
    assert 57 not in EXEMPT_REQUEST_API_KEYS
    engine = QuotaEngine(settings_for("request_percentage", {(None, D): 0.001}))
    assert engine.record_request_time("1", "u", "c", 57, 10_000, 0) == 1000


# F2 — StrictControllerMutationQuotaTest: rate 10, N = 10, W = 1 s: burst 100.
def _mutation_engine(rate: float, samples: int = 10) -> QuotaEngine:
    return QuotaEngine(
        settings_for("controller_mutation_rate", {("ANONYMOUS", "test-client"): rate}, controller_window_num=samples)
    )


def _mutate(
    engine: QuotaEngine, version: int, partitions: list[int], now: int, api_key: int = CREATE_TOPICS
) -> MutationOutcome:
    topics = [(f"t{i}", p) for i, p in enumerate(partitions)]
    return engine.mutations("1", "ANONYMOUS", "test-client", api_key, version, topics, now)


def _tokens(engine: QuotaEngine, now: int) -> float:
    (snapshot,) = engine.snapshot(now)
    assert snapshot.tokens is not None
    return snapshot.tokens


def test_strict_controller_mutation_quota_f2() -> None:
    engine = _mutation_engine(10)
    first = _mutate(engine, 6, [90], 0)
    assert (first.accepted, first.throttle_ms, _tokens(engine, 0)) == ([True], 0, 10)
    second = _mutate(engine, 6, [90], 0)  # the check saw 10 >= 0: accepted, overdrawn
    assert (second.accepted, second.throttle_ms, _tokens(engine, 0)) == ([True], 0, -80)
    third = _mutate(engine, 6, [90], 0)
    assert (third.accepted, third.throttle_ms, _tokens(engine, 0)) == ([False], 8000, -80)
    assert _tokens(engine, 5000) == -30  # 3000 ms left to refill
    # Step 4, observed: a request at t = 5000 is rejected (not recorded) with the time-adjusted
    # throttle, 8000 - 5000 = 3000 ms (AbstractControllerMutationQuota.throttleTime).
    fourth = _mutate(engine, 6, [1], 5000)
    assert (fourth.accepted, fourth.throttle_ms, _tokens(engine, 5000)) == ([False], 3000, -30)


def test_permissive_controller_mutation_quota_f3() -> None:
    engine = _mutation_engine(10)
    assert _mutate(engine, 5, [90], 0).throttle_ms == 0
    second = _mutate(engine, 5, [90], 0)
    assert (second.accepted, second.throttle_ms) == ([True], 8000)
    third = _mutate(engine, 5, [90], 0)
    assert (third.accepted, third.throttle_ms) == ([True], 17000)
    assert _tokens(engine, 5000) == -120  # 12000 ms
    # Step 4, observed: at t = 5000 the throttle is 17000 - 5000 = 12000 ms (a request that
    # records nothing, as a topic with no partitions to create).
    fourth = _mutate(engine, 5, [0], 5000)
    assert (fourth.accepted, fourth.throttle_ms) == ([True], 12000)


def test_controller_mutation_quota_manager_test_violation_f4() -> None:
    engine = _mutation_engine(10)
    for t in range(0, 10_000, 1000):
        assert _mutate(engine, 6, [10], t).throttle_ms == 0
        assert _tokens(engine, t) == 90
    assert _mutate(engine, 6, [110], 10_000).throttle_ms == 0  # the bucket was full
    rejected = _mutate(engine, 6, [110], 10_000)
    assert (rejected.accepted, rejected.throttle_ms) == ([False], 1000)
    assert _mutate(engine, 6, [110], 11_000).throttle_ms == 0  # refilled to 0: passes the check
    assert _tokens(engine, 11_000) == -110


@pytest.mark.parametrize(
    ("api_key", "strict_version", "permissive_version"),
    [
        pytest.param(CREATE_TOPICS, 6, 5, id="F5-F6-CreateTopics"),
        pytest.param(DELETE_TOPICS, 5, 4, id="F7-DeleteTopics"),
        pytest.param(CREATE_PARTITIONS, 3, 2, id="F8-CreatePartitions"),
    ],
)
def test_controller_mutation_quota_test_strict_and_permissive_f5_f8(
    api_key: int, strict_version: int, permissive_version: int
) -> None:
    strict = _mutation_engine(2.0)  # burst 20
    outcome = _mutate(strict, strict_version, [30, 30], 0, api_key)
    assert (outcome.accepted, outcome.throttle_ms) == ([True, False], 5000)
    retry = _mutate(strict, strict_version, [30], 5000, api_key)  # F5b: after the delay
    assert (retry.accepted, retry.throttle_ms) == ([True], 0)
    permissive = _mutation_engine(2.0)
    outcome = _mutate(permissive, permissive_version, [30, 30], 0, api_key)
    assert (outcome.accepted, outcome.throttle_ms) == ([True, True], 20000)


def test_controller_mutation_quota_test_unlimited_principal_f9() -> None:
    engine = _mutation_engine(2.0)
    outcome = engine.mutations("1", "other", "client", CREATE_TOPICS, 7, [("a", 30), ("b", 30)], 0)
    assert (outcome.accepted, outcome.throttle_ms) == ([True, True], 0)


def test_no_mutation_quota_configured_records_nothing() -> None:
    engine = QuotaEngine(QuotaSettings())
    outcome = engine.mutations("1", "u", "c", CREATE_TOPICS, 7, [("a", 10_000)], 0)
    assert (outcome.accepted, outcome.throttle_ms, engine.tracked_sensors()) == ([True], 0, 0)


def test_mutations_reject_other_api_keys() -> None:
    with pytest.raises(ValueError, match="not a controller mutation"):
        QuotaEngine(QuotaSettings()).mutations("1", "u", "c", 0, 9, [], 0)


def test_quota_metric_tokens_follow_a_quota_change() -> None:
    """testQuotaMetric: the tokens sensor is created on first use; a new rate reaches it."""
    engine = QuotaEngine(settings_for("controller_mutation_rate", {("ThrottledPrincipal", None): 2.0}))
    assert engine.tracked_sensors() == 0
    engine.mutations("1", "ThrottledPrincipal", "any", CREATE_TOPICS, 7, [("t", 1)], 0)
    (snapshot,) = engine.snapshot(0)
    assert (snapshot.tags, snapshot.limit) == ({"user": "ThrottledPrincipal", "client-id": ""}, 2.0)
    engine.update(settings_for("controller_mutation_rate", {("ThrottledPrincipal", None): 4.0}))
    (snapshot,) = engine.snapshot(0)
    assert snapshot.limit == 4.0


# H — ConnectionQuotasTest.testEnforcedIpConnectionRateQuotaUpdate (N = 2, W = 1 s, frozen clock).
def _connect(engine: QuotaEngine, ip: str, attempts: int) -> tuple[int, int]:
    """Connections accepted before the first throttle, and that throttle."""
    for accepted in range(attempts):
        throttle = engine.connection_created(ip, 0)
        if throttle:
            return accepted, throttle
    return attempts, 0


def test_connection_quotas_test_ip_connection_rate_quota_update_h1_h4() -> None:
    def settings(*entries: IpQuotaEntry) -> QuotaSettings:
        return QuotaSettings(ip_entries=entries, window_num=2)

    engine = QuotaEngine(settings(IpQuotaEntry("10.0.0.1", 20)))
    assert _connect(engine, "10.0.0.1", 40) == (20, 50)  # H1
    engine.update(settings(IpQuotaEntry("10.0.0.1", 30)))
    assert _connect(engine, "10.0.0.1", 40) == (10, 33)  # H2: 30 in total
    engine.update(settings())
    assert _connect(engine, "10.0.0.1", 40) == (40, 0)  # H3
    assert _connect(engine, "10.0.0.2", 40) == (40, 0)
    engine.update(settings(IpQuotaEntry(D, 20)))
    assert _connect(engine, "10.0.0.2", 40) == (20, 50)  # H4: unrecorded earlier connections don't count


def test_connection_quotas_test_rejected_connection_is_unrecorded_h5() -> None:
    engine = QuotaEngine(QuotaSettings(ip_entries=(IpQuotaEntry("10.0.0.1", 0),), window_num=2))
    assert engine.connection_created("10.0.0.1", 0) == 1000  # bounded by the window
    (snapshot,) = engine.snapshot(0)
    assert snapshot.value == 0
    assert snapshot.tags == {"ip": "10.0.0.1"}


@pytest.mark.parametrize(
    ("overdraw", "request_ms", "controller_throttle", "request_throttle"),
    [
        pytest.param(0, 215, 0, 1500, id="G1-request-only"),
        pytest.param(3, 0, 1500, 0, id="G2-controller-only"),
        pytest.param(6, 210, 3000, 1000, id="G3-both"),
    ],
)
def test_kafka_apis_test_controller_and_request_throttles_are_independent_g1_g3(
    overdraw: int, request_ms: float, controller_throttle: int, request_throttle: int
) -> None:
    """testKRaftControllerThrottleTimeEnforced: the broker applies max(controller, request);
    the engine computes each one on its own sensor, neither feeding the other."""
    entries = (
        settings_for("controller_mutation_rate", {(None, D): 2.0}).entries
        + settings_for("request_percentage", {(None, D): 1.0}).entries
    )
    engine = QuotaEngine(QuotaSettings(entries=entries, window_size_s=2))  # request throttles up to 2000 ms
    engine.mutations("1", "u", "c", CREATE_TOPICS, 7, [("a", 22 + overdraw)], 0)  # burst 22, overdrawn
    mutation = engine.mutations("1", "u", "c", CREATE_TOPICS, 7, [("b", 1)], 0).throttle_ms
    # request_ms over a fresh 20 s window: (request_ms / 10 / 20 - 1) * 20000 ms.
    request = engine.record_request_time("1", "u", "c", CREATE_TOPICS, request_ms, 0)
    assert (mutation, request) == (controller_throttle, request_throttle)
