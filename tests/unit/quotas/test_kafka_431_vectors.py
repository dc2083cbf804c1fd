"""Spec vectors A11, B1-B6, C3, F2/F3 step 4 and G1-G3 through the entry points the proxy calls.

Each expected number is derived from Kafka 4.3.1's own code (commit 26b251a451ce, "Bump
version to 4.3.1"): the engine methods kqp.quotas.recording calls (record_produce,
record_fetch, record_request_time, mutations) and recording's charge_request,
charge_response and exchange_throttle, which kqp/proxy/policies and the replay call.
"""

from __future__ import annotations

import pytest

from kqp.protocol.api_keys import ApiKey
from kqp.quotas import QuotaEngine, QuotaSettings
from kqp.quotas.recording import (
    QuotaClient,
    RequestOutcome,
    charge_request,
    charge_response,
    exchange_throttle,
    request_charges,
    response_charges,
    upstream_answer_ms,
)
from kqp.quotas.stats import TokenBucket, WindowedRate
from tests.unit.helpers.quotas import D, settings_for

CLIENT = QuotaClient("1", "ANONYMOUS", "test-client")


def _value(engine: QuotaEngine, now: int) -> float:
    (snapshot,) = engine.snapshot(now)
    return snapshot.value


# -- A11: MetricsTest.testQuotas ------------------------------------------------------------


def test_a11_steps_1_to_4_on_the_sensor_every_rate_quota_records_into() -> None:
    # Sensor.record adds the value to the stat, then checks; WindowedRate.record_and_throttle is
    # that call for every engine rate quota. Bound 0.5/s over the padded 10 s window of a new
    # 11 x 1 s sensor: at one instant the sum may reach 5, as the test's upper bound 5.
    rate = WindowedRate(11, 1000, bound=0.5)
    assert rate.record_and_throttle(5, 0) == 0  # step 1: 0.5 <= 0.5
    assert rate.record_and_throttle(1, 0) == 2000  # step 2: (0.6 - 0.5) / 0.5 x 10000
    assert rate.total(0) == 6  # ... and the 1 stays recorded
    assert rate.record_and_throttle(-6, 0) == 0  # step 3: total 0, 0 <= 5 passes
    assert rate.total(0) == 0
    # Step 4: total -1. Kafka's violation here is the test's lower-bound metric (-1 < 0);
    # client quotas only ever build Quota.upperBound (ClientQuotaManager.getQuotaMetricConfig),
    # so kqp has no lower bound and -1 passes the upper one. The value is kept either way.
    assert rate.record_and_throttle(-1, 0) == 0
    assert rate.total(0) == -1


def test_a11_step_3_negative_record_through_the_engine_is_the_fetch_unrecord() -> None:
    # The engine's negative record is the throttled fetch's unrecord (KafkaApis: record -size at
    # the same time, no check): it lands in the same sample, as A11's -6, and cancels the bytes.
    engine = QuotaEngine(settings_for("consumer_byte_rate", {("ANONYMOUS", "test-client"): 0.5}))
    assert engine.record_fetch("1", "ANONYMOUS", "test-client", 5, 0) == 0  # 5 / 10 s = 0.5
    assert engine.record_fetch("1", "ANONYMOUS", "test-client", 1, 0) == 2000  # 0.6: unrecorded
    assert _value(engine, 0) == 0.5  # back to 5 bytes
    assert engine.record_fetch("1", "ANONYMOUS", "test-client", 0, 0) == 0  # at the bound again


# -- B1-B6: QuotaUtilsTest, through the engine's record calls ---------------------------------
# A fresh sensor (W = 1 s) divides by (N - 1) x 1000 ms, so recording O x (N - 1) at t = 0
# gives the observed rate O. Request time: 1 ms of thread time is 0.1 % (nanos x 100 / 1e9).


def _request_throttle(observed_percent: float, bound: float, samples: int) -> int:
    engine = QuotaEngine(settings_for("request_percentage", {(None, D): bound}, window_num=samples))
    request_ms = observed_percent * (samples - 1) * 10
    return engine.record_request_time("1", "u", "c", ApiKey.METADATA, request_ms, 0)


def _byte_throttle(quota_type: str, nbytes: int, bound: float, samples: int) -> int:
    engine = QuotaEngine(settings_for(quota_type, {(None, D): bound}, window_num=samples))  # type: ignore[arg-type]
    if quota_type == "producer_byte_rate":
        return engine.record_produce("1", "u", "c", nbytes, 0)
    return engine.record_fetch("1", "u", "c", nbytes, 0)


@pytest.mark.parametrize(
    ("observed", "bound", "samples", "expected"),
    [
        pytest.param(16.5, 16.5, 10, 0, id="B1-N10"),  # O = T: 0
        pytest.param(16.5, 16.5, 11, 0, id="B1-N11"),
        pytest.param(16.5, 20.4, 10, 0, id="B2"),  # QuotaUtils gives -1721; callers throttle only > 0
        pytest.param(18.2, 18.2, 10, 0, id="B4"),  # bounded variant, O = T: 0
        pytest.param(55, 50, 2, 100, id="B5"),  # (55 - 50) / 50 x 1000, under the 1000 ms cap
        # (100 - 50) / 50 x 9000 = 9000, capped at the request quota's max throttle: Kafka's
        # ClientRequestQuotaManager passes quota.window.size.seconds x 1000 = 1000 ms (the
        # test's 500 is its own parameter).
        pytest.param(100, 50, 10, 1000, id="B6"),
    ],
)
def test_b_vectors_through_the_request_quota(observed: float, bound: float, samples: int, expected: int) -> None:
    assert _request_throttle(observed, bound, samples) == expected


@pytest.mark.parametrize("quota_type", ["producer_byte_rate", "consumer_byte_rate"])
@pytest.mark.parametrize(
    ("nbytes", "bound", "samples", "expected"),
    [
        pytest.param(165, 16.5, 11, 0, id="B1-N11"),  # 165 / 10 s = 16.5 = T
        pytest.param(200, 50, 3, 2000, id="B3"),  # 200 / 2 s = 100: (100 - 50) / 50 x 2000
        pytest.param(900, 50, 10, 9000, id="B6-unbounded"),  # 900 / 9 s = 100; throttleTime, no cap
    ],
)
def test_b_vectors_through_the_byte_rates(
    quota_type: str, nbytes: int, bound: float, samples: int, expected: int
) -> None:
    assert _byte_throttle(quota_type, nbytes, bound, samples) == expected


# -- C3: TokenBucket on a clock that starts at 0 ----------------------------------------------


def test_c3_kafka_refill_from_its_initial_state_gives_0_then_5() -> None:
    # Kafka's TokenBucket starts with tokens = 0, lastUpdateMs = 0; refill adds rate x dt.
    # Quota 5/s, N = 10, W = 2 s (burst 100). Started from that state at t = 0, our refill
    # arithmetic gives the vector: 0 at t = 0, 5 at t = 1000.
    bucket = TokenBucket(10, 2000, 5.0, now_ms=0)
    bucket.tokens, bucket.last_update_ms = 0.0, 0
    assert bucket.measure(0) == 0
    assert bucket.measure(1000) == 5


@pytest.mark.parametrize("start_ms", [0, 1_750_000_000_000])
def test_c3_the_engine_bucket_starts_full_as_kafka_on_its_epoch_clock(start_ms: int) -> None:
    # A broker's clock is epoch ms, so its first refill adds 5 x T / 1000 >= burst: 100. The
    # engine's time may start near 0; its bucket starts full so the numbers are Kafka's.
    engine = QuotaEngine(
        settings_for("controller_mutation_rate", {(None, D): 5.0}, controller_window_num=10, controller_window_size_s=2)
    )
    outcome = engine.mutations("1", "u", "c", ApiKey.CREATE_TOPICS, 7, [("t", 60)], start_ms)
    assert outcome.accepted == [True]
    (snapshot,) = engine.snapshot(start_ms + 1000)
    assert snapshot.tokens == 45  # 100 - 60 (C1b), + 5 after 1 s


# -- F2 / F3 step 4: the time-adjusted controller throttle -------------------------------------


def _mutation_engine() -> QuotaEngine:
    # Rate 10, N = 10, W = 1 s: burst 100.
    return QuotaEngine(
        settings_for("controller_mutation_rate", {("ANONYMOUS", "test-client"): 10.0}, controller_window_num=10)
    )


def _create(engine: QuotaEngine, version: int, partitions: int, now: int) -> RequestOutcome:
    charges = request_charges(ApiKey.CREATE_TOPICS, version, 100, True, [("t", partitions)])
    return charge_request(engine, CLIENT, charges, now)


def test_f2_strict_step_4_the_rejection_throttle_shrinks_with_time() -> None:
    engine = _mutation_engine()
    assert _create(engine, 6, 90, 0).throttle_ms == 0  # tokens 10
    assert _create(engine, 6, 90, 0).throttle_ms == 0  # check saw 10 >= 0; tokens -80
    third = _create(engine, 6, 90, 0)
    assert third.mutation is not None and third.mutation.accepted == [False]
    assert exchange_throttle(third, 0, 0) == 8000  # 80 / 10 x 1000
    # Step 4: read at t = 5000, AbstractControllerMutationQuota.throttleTime gives
    # max(0, 8000 - (5000 - 0)) = 3000.
    assert exchange_throttle(third, 0, 5000) == 3000
    assert exchange_throttle(third, 0, 9000) == 0  # never negative


def test_f3_permissive_step_4_the_throttle_shrinks_with_time() -> None:
    engine = _mutation_engine()
    assert _create(engine, 5, 90, 0).throttle_ms == 0  # tokens 10
    assert _create(engine, 5, 90, 0).throttle_ms == 8000  # tokens -80
    third = _create(engine, 5, 90, 0)
    assert exchange_throttle(third, 0, 0) == 17000  # tokens -170
    assert exchange_throttle(third, 0, 5000) == 12000  # step 4: 17000 - 5000


def test_a_forwarded_mutation_subtracts_the_upstreams_answer_time_not_the_proxys_own_waits() -> None:
    # Kafka subtracts the controller's span, from its quota check to its answer; the broker
    # passes the figure on. The proxy subtracts the upstream's answer time (40 ms here), not
    # the 900 ms since its charge (a fleet's order, a mute): the client waits as long as
    # Kafka's controller would have told it.
    engine = _mutation_engine()
    _create(engine, 6, 90, 0)
    _create(engine, 6, 90, 0)
    third = _create(engine, 6, 90, 0)
    assert exchange_throttle(third, 0, 900, upstream_ms=40.7) == 7960
    assert exchange_throttle(third, 0, 900, upstream_ms=None) == 7100  # answered by the proxy
    assert exchange_throttle(RequestOutcome(throttle_ms=700), 0, 5000, upstream_ms=40) == 700
    assert upstream_answer_ms(1_000_000, 1_040_700) == 40.7


def test_a_throttle_that_is_not_a_mutation_is_not_adjusted() -> None:
    # acks=0 Produce's throttle is applied when it is computed; no response comes later.
    assert exchange_throttle(RequestOutcome(throttle_ms=700), 0, 5000) == 700


# -- G1-G3: KafkaApisTest.testKRaftControllerThrottleTimeEnforced -----------------------------


@pytest.mark.parametrize(
    ("overdraw", "request_ms", "expected"),
    [
        pytest.param(0, 215, 1500, id="G1"),  # controller 0, request 1500
        pytest.param(3, 0, 1500, id="G2"),  # controller 1500, request 0
        pytest.param(6, 210, 3000, id="G3"),  # controller 3000, request 1000: max, not 4000
    ],
)
def test_g_the_response_carries_the_max_of_the_controller_and_request_throttles(
    overdraw: int, request_ms: float, expected: int
) -> None:
    # Controller rate 2/s, 11 x 1 s: burst 22. Request quota 1 % over 11 x 2 s windows: a new
    # sensor divides by 20 s, and the request throttle is capped at 2000 ms.
    entries = (
        settings_for("controller_mutation_rate", {(None, D): 2.0}).entries
        + settings_for("request_percentage", {(None, D): 1.0}).entries
    )
    engine = QuotaEngine(QuotaSettings(entries=entries, window_size_s=2))
    client = QuotaClient("1", "u", "c")
    create = request_charges(ApiKey.CREATE_TOPICS, 7, 100, True, [("a", 22 + overdraw)])
    charge_request(engine, client, create, 0)  # a full bucket admits it: tokens = -overdraw
    # The next CreateTopics is rejected with overdraw / 2 x 1000 ms (strict: 0 when tokens = 0).
    outcome = charge_request(engine, client, request_charges(ApiKey.CREATE_TOPICS, 7, 100, True, [("b", 1)]), 0)
    # Its request time: request_ms x 0.1 % over 20 s against 1 %: (request_ms / 200 - 1) x 20000.
    response = charge_response(engine, client, response_charges(ApiKey.CREATE_TOPICS, 100, 50, request_ms), 0)
    assert exchange_throttle(outcome, response, 0) == expected


# -- ShareFetch (KIP-932): charged to the consumer byte rate like Fetch -----------------------


def test_share_fetch_response_bytes_are_charged_to_the_consumer_byte_rate() -> None:
    # KafkaApis.processShareFetchResponse records ShareFetchContext.responseSize (4 + body)
    # into quotas.fetch. 100 B/s over a new 11 x 1 s sensor (10 s): 2000 bytes is 200 B/s,
    # (200 - 100) / 100 x 10000 = 10000 ms.
    engine = QuotaEngine(settings_for("consumer_byte_rate", {("ANONYMOUS", "test-client"): 100}))
    charges = response_charges(ApiKey.SHARE_FETCH, 60, 1996, None)
    assert charges.fetch_bytes == 2000
    assert charge_response(engine, CLIENT, charges, 0) == 10_000
    assert _value(engine, 0) == 200  # delivered by the proxy, so kept recorded (as Fetch)


def test_share_acknowledge_is_not_charged_to_the_byte_rate() -> None:
    assert response_charges(ApiKey.SHARE_ACKNOWLEDGE, 60, 1996, None).fetch_bytes is None
