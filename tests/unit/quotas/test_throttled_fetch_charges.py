"""A throttled Fetch, as KafkaApis.handleFetchRequest charges it: request time recorded first,
then the response size; if either throttles, the size is unrecorded (unrecordQuotaSensor) and
the consumer is answered empty (`answered_empty`). ShareFetch keeps its data and its record."""

from __future__ import annotations

from kqp.protocol.api_keys import ApiKey
from kqp.quotas import QuotaEngine, QuotaSettings
from kqp.quotas.recording import QuotaClient, answered_empty, charge_response, response_charges
from kqp.quotas.settings import QuotaEntity, QuotaEntry

CLIENT = QuotaClient("1", "ANONYMOUS", "consumer")


def engine(**quotas: float) -> QuotaEngine:
    return QuotaEngine(QuotaSettings(entries=(QuotaEntry(QuotaEntity(client_id="consumer"), quotas),)))


def fetched(engine: QuotaEngine, now_ms: int) -> float:
    (rate,) = (s.value for s in engine.snapshot(now_ms) if s.quota_type == "consumer_byte_rate")
    return rate


def test_a_fetch_over_the_byte_rate_is_unrecorded_and_answered_empty() -> None:
    quotas = engine(consumer_byte_rate=1000.0)
    # 19,996 + 4 bytes on a fresh 11 x 1 s sensor (10 s): 2000 B/s, (2000 - 1000) / 1000 x 10 s.
    throttle = charge_response(quotas, CLIENT, response_charges(ApiKey.FETCH, 60, 19_996, 1.0), 0)
    assert throttle == 10_000
    assert answered_empty(ApiKey.FETCH, throttle)
    assert fetched(quotas, 0) == 0  # the consumer got nothing, so nothing counts
    # The same offsets fetched again after the throttle are charged as if for the first time.
    assert charge_response(quotas, CLIENT, response_charges(ApiKey.FETCH, 60, 5_996, 1.0), 10_000) == 0
    assert fetched(quotas, 10_000) == 600


def test_a_fetch_under_the_byte_rate_is_kept_and_delivered() -> None:
    quotas = engine(consumer_byte_rate=1000.0)
    assert charge_response(quotas, CLIENT, response_charges(ApiKey.FETCH, 60, 5_996, 1.0), 0) == 0
    assert not answered_empty(ApiKey.FETCH, 0)
    assert fetched(quotas, 0) == 600


def test_a_request_quota_throttle_also_unrecords_the_bytes() -> None:
    # KIP-124 request_percentage 1 (%) with a consumer byte rate far away: a 500 ms fetch on a
    # fresh sensor is 5 % of a thread over 10 s; the bytes, under their own quota, are unrecorded
    # all the same because the response goes out empty.
    quotas = engine(consumer_byte_rate=10_000_000.0, request_percentage=1.0)
    throttle = charge_response(quotas, CLIENT, response_charges(ApiKey.FETCH, 60, 5_996, 500.0), 0)
    assert throttle > 0 and answered_empty(ApiKey.FETCH, throttle)
    assert fetched(quotas, 0) == 0


def test_a_throttled_share_fetch_keeps_its_bytes() -> None:
    quotas = engine(consumer_byte_rate=1000.0)
    throttle = charge_response(quotas, CLIENT, response_charges(ApiKey.SHARE_FETCH, 60, 19_996, 1.0), 0)
    assert throttle == 10_000
    assert not answered_empty(ApiKey.SHARE_FETCH, throttle)
    assert fetched(quotas, 0) == 2_000


def test_only_a_throttle_empties_a_fetch_and_only_a_fetch() -> None:
    assert not answered_empty(ApiKey.PRODUCE, 100)
    assert not answered_empty(ApiKey.FETCH, 0)
