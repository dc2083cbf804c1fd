"""The recording rules (kqp.quotas.recording): what each request and response charges, and when."""

from __future__ import annotations

import pytest

from kqp.protocol.api_keys import ApiKey
from kqp.quotas import QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings
from kqp.quotas.recording import (
    QuotaClient,
    RequestCharges,
    ResponseCharges,
    broker_label,
    charge_request,
    charge_response,
    request_charged_at_arrival,
    request_charges,
    response_charges,
)
from tests.unit.helpers.quotas import D, settings_for

CLIENT = QuotaClient("1", "u", "c")


def test_produce_charges_its_request_size_at_the_response() -> None:
    charges = response_charges(ApiKey.PRODUCE, 1_000, 40, round_trip_ms=3.5)
    assert charges == ResponseCharges(ApiKey.PRODUCE, produce_bytes=1_000, fetch_bytes=None, request_time_ms=3.5)


def test_fetch_charges_four_plus_its_response_body() -> None:
    # Kafka counts a fetch as 4 + the response body (FetchResponse.sizeOf), not the header.
    charges = response_charges(ApiKey.FETCH, 80, 10_000, round_trip_ms=2.0)
    assert charges.fetch_bytes == 10_004 and charges.produce_bytes is None


@pytest.mark.parametrize(
    ("round_trip_ms", "max_wait_ms", "charged_ms"),
    [(520.0, 500, 20.0), (499.0, 500, 499.0), (7.0, 0, 7.0), (7.0, None, 7.0)],
)
def test_a_long_poll_is_charged_without_its_wait(
    round_trip_ms: float, max_wait_ms: int | None, charged_ms: float
) -> None:
    # A fetch that waited out MaxWaitMs spent it in purgatory; one answered earlier did not wait.
    assert response_charges(ApiKey.FETCH, 80, 100, round_trip_ms, max_wait_ms).request_time_ms == charged_ms


@pytest.mark.parametrize("api_key", [ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE])
def test_sasl_is_never_charged_request_time(api_key: ApiKey) -> None:
    # The broker's authenticator handles SASL in the network layer, outside KafkaApis' quotas.
    assert response_charges(api_key, 50, 20, round_trip_ms=30.0) == ResponseCharges(api_key)


def test_other_apis_charge_request_time_only() -> None:
    assert response_charges(ApiKey.METADATA, 50, 900, 4.0) == ResponseCharges(ApiKey.METADATA, request_time_ms=4.0)


def test_what_a_request_charges_on_arrival() -> None:
    assert request_charges(ApiKey.PRODUCE, 9, 700, expects_response=False).produce_bytes == 700
    assert request_charges(ApiKey.PRODUCE, 9, 700, expects_response=True) == RequestCharges(ApiKey.PRODUCE, 9)
    assert request_charges(ApiKey.FETCH, 17, 90, True).fetch
    topics = [("a", 3), ("b", 1)]
    assert request_charges(ApiKey.CREATE_TOPICS, 7, 90, True, topics).mutations == (("a", 3), ("b", 1))
    # A validate-only mutation is passed without topics when it is free: nothing is charged.
    assert request_charges(ApiKey.CREATE_TOPICS, 7, 90, True, None) == RequestCharges(ApiKey.CREATE_TOPICS, 7)


def test_responses_charge_the_engine_as_direct_calls_do() -> None:
    # 100 B/s for every client-id, one budget for the cluster: the second 1000 bytes on
    # another broker overruns it (the engine's own vector in test_engine.py).
    settings = settings_for("producer_byte_rate", {(None, D): 100}, scope="cluster")
    engine, direct = QuotaEngine(settings), QuotaEngine(settings)
    produce = response_charges(ApiKey.PRODUCE, 1_000, 10, None)
    first = charge_response(engine, CLIENT, produce, 0)
    second = charge_response(engine, QuotaClient("2", "u", "c"), produce, 0)
    assert (first, second) == (
        direct.record_produce("1", "u", "c", 1_000, 0),
        direct.record_produce("2", "u", "c", 1_000, 0),
    )
    assert second == 10_000


def test_acks_zero_produce_is_charged_on_arrival() -> None:
    engine = QuotaEngine(settings_for("producer_byte_rate", {(None, D): 100}))
    charges = request_charges(ApiKey.PRODUCE, 9, 2_000, expects_response=False)
    assert charge_request(engine, CLIENT, charges, 0).throttle_ms == QuotaEngine(
        settings_for("producer_byte_rate", {(None, D): 100})
    ).record_produce("1", "u", "c", 2_000, 0)
    assert charge_request(engine, CLIENT, charges, 0).throttle_ms > 0


def test_the_largest_throttle_of_a_response_wins() -> None:
    # 100 B/s and 1 % of a thread: 1500 bytes overrun for 5 s, while the request-time
    # throttle of 2 s of thread time is bounded by one quota window.
    entity = QuotaEntity(None, D)
    settings = QuotaSettings(entries=(QuotaEntry(entity, {"producer_byte_rate": 100, "request_percentage": 1}),))
    engine, direct = QuotaEngine(settings), QuotaEngine(settings)
    throttle = charge_response(engine, CLIENT, response_charges(ApiKey.PRODUCE, 1_500, 10, 2_000.0), 0)
    by_bytes = direct.record_produce("1", "u", "c", 1_500, 0)
    by_time = direct.record_request_time("1", "u", "c", ApiKey.PRODUCE, 2_000.0, 0)
    assert throttle == max(by_bytes, by_time) == by_bytes > by_time > 0


@pytest.mark.parametrize("api_key", [ApiKey.FETCH, ApiKey.SHARE_FETCH])
def test_a_share_fetch_long_poll_is_charged_without_its_wait_too(api_key: ApiKey) -> None:
    # DelayedShareFetch waits in purgatory as DelayedFetch does.
    assert response_charges(api_key, 80, 100, 520.0, 500).request_time_ms == 20.0


@pytest.mark.parametrize("api_key", [ApiKey.FETCH, ApiKey.SHARE_FETCH])
def test_a_fetch_reads_its_cap_only_when_a_quota_needs_it(api_key: ApiKey) -> None:
    # KafkaApis caps both Fetch and ShareFetch MaxBytes at the quota window
    # (handleFetchRequest, handleFetchFromShareFetchRequest).
    fetch = request_charges(api_key, 1, 90, True)
    unlimited = QuotaEngine(settings_for("producer_byte_rate", {(None, D): 100}))
    assert not request_charged_at_arrival(unlimited, fetch)
    assert charge_request(unlimited, CLIENT, fetch, 0).fetch_max_bytes_cap is None
    limited = QuotaEngine(settings_for("consumer_byte_rate", {(None, D): 1_000}))
    assert request_charged_at_arrival(limited, fetch)
    # limit x (samples - 1) x window seconds: 1000 x 10 x 1 with Kafka's defaults.
    assert charge_request(limited, CLIENT, fetch, 0).fetch_max_bytes_cap == 10_000


def test_mutations_charge_the_bucket_on_arrival() -> None:
    settings = settings_for("controller_mutation_rate", {(None, D): 10})
    engine = QuotaEngine(settings)
    charges = request_charges(ApiKey.CREATE_TOPICS, 7, 90, True, [("a", 200), ("b", 1)])
    outcome = charge_request(engine, CLIENT, charges, 0)
    expected = QuotaEngine(settings).mutations("1", "u", "c", ApiKey.CREATE_TOPICS, 7, [("a", 200), ("b", 1)], 0)
    assert outcome.mutation is not None and outcome.mutation.accepted == expected.accepted == [True, False]
    assert outcome.throttle_ms == expected.throttle_ms > 0


def test_broker_labels() -> None:
    assert [broker_label(n) for n in (None, -1, 0, 3)] == ["bootstrap", "bootstrap", "0", "3"]
