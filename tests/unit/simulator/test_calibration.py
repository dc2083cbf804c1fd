"""The calibration's model side (bench/calibration.py): a client model straight to Kafka's model,
no proxy, and the report that sets it beside the real client's figure."""

from __future__ import annotations

import pytest

from bench import calibration
from bench.calibration import CALIBRATIONS, Side
from kqpsim import wire
from kqpsim.clients import LIBRDKAFKA
from kqpsim.scenario import KIB, MIB, Clients, Quota, Scenario, straight_to_kafka


def test_straight_to_kafka_records_each_throttle_the_modelled_broker_sends() -> None:
    # 192 KiB requests against 64 KiB/s: every few requests is throttled by Kafka's model.
    scenario = Scenario(Clients("java-producer", request_bytes=192 * KIB), Quota(64 * KIB), warmup_s=5.0,
                        measure_s=20.0)
    figures = straight_to_kafka(scenario, seed=1)
    throttles = [ms for record in figures.records for _, ms in record.throttles]
    assert throttles and all(ms > 0 for ms in throttles)
    assert figures.throttles == len(throttles)  # the broker's count and the client's agree
    assert 0.5 < figures.admitted < 1.5


def test_every_calibration_names_a_model_and_a_quota_on_its_own_client_id() -> None:
    assert len({c.client_id for c in CALIBRATIONS.values()}) == len(CALIBRATIONS)
    assert {c.model.clients.model for c in CALIBRATIONS.values()} == {
        "librdkafka", "java-producer", "aiokafka", "consumer", "admin"}
    for c in CALIBRATIONS.values():
        assert c.warmup < c.seconds


@pytest.mark.parametrize(("real", "verdict"), [(1.0, "PASS"), (1.06, "FAIL"), (0.96, "PASS"), (0.95, "FAIL")])
def test_report_passes_a_model_within_five_percent_of_the_real_client(
        monkeypatch: pytest.MonkeyPatch, real: float, verdict: str) -> None:
    monkeypatch.setattr(calibration, "run_model", lambda _s: [Side(0.999), Side(1.0), Side(1.001)])
    text, passed = calibration.report({"calibrate-admin": [Side(real, 10, None, 0)]}, ["calibrate-admin"])
    assert (verdict == "PASS") == passed
    assert f"{verdict}  calibrate-admin" in text
    assert f"ratio {1.0 / real:.3f}" in text


@pytest.mark.parametrize(("offer", "low", "high"), [(0.5, 0.49, 0.51), (1.5, 0.95, 1.05)])
def test_an_offered_producer_gets_its_offer_under_the_quota_and_about_the_quota_over_it(
        offer: float, low: float, high: float) -> None:
    # Java producer, 16 KB requests, 256 KiB/s: under the quota nothing throttles it; offering
    # 1.5x it gets the quota, as the real Java producer did on Kafka 4.3.1 (docs/testing.md).
    # 60 s measured, as the calibration measures: whole cycles of Kafka's 11 s window (over 30 s
    # their phase moves the figure to 0.95x).
    scenario = Scenario(Clients("java-producer", request_bytes=15_609, offer=offer), Quota(256 * KIB),
                        warmup_s=15.0, measure_s=60.0)
    figures = straight_to_kafka(scenario, seed=1)
    assert low <= figures.admitted <= high
    if offer < 1:
        assert figures.throttles == 0


def _librdkafka_offering(offer: float, seconds: float = 75.0) -> Scenario:
    # The calibration's shape: batch.size 1,000,000 (`request_bytes`), 256 KiB/s.
    return Scenario(Clients("librdkafka", request_bytes=1_000_000, offer=offer), Quota(256 * KIB), warmup_s=15.0,
                    measure_s=seconds - 15.0)


def test_librdkafka_under_its_quota_sends_linger_sized_batches_and_is_never_throttled() -> None:
    # 0.5x of 256 KiB/s in 1 KiB values: a record every 7.8 ms, so each batch's linger.ms (5 ms)
    # ends before the next record comes: one record (1,035 bytes in a batch), the batch's header
    # and the request's in every request, and Kafka charges all of them.
    figures = straight_to_kafka(_librdkafka_offering(0.5, seconds=30.0), seed=1)
    request = 1035 + 61 + wire.produce_overhead("client-0") - 4  # Kafka's size: no size prefix
    assert {size for record in figures.records for _, size in record.acks} == {request}
    assert 0.99 <= figures.admitted / (0.5 * request / 1024) <= 1.01
    assert figures.throttles == 0


def test_librdkafka_over_its_quota_batches_up_to_batch_size_once_the_socket_is_full() -> None:
    # Offering 1.5x, the socket fills behind the broker's mute after about 20 s (the real client's
    # did at 21 s, docs/testing.md): until then linger-sized batches, then batches of what the
    # offer built while the one before waited for room, up to batch.size and no further; Kafka
    # answers the first of them once the small requests ahead have drained, near 29 s.
    figures = straight_to_kafka(_librdkafka_offering(1.5), seed=1)
    acks = [(at, size) for record in figures.records for at, size in record.acks]
    assert max(size for at, size in acks if at < 25.0) < 5_000
    large = [size for at, size in acks if size > 100_000]
    assert large and max(large) <= 1_000_000 + wire.produce_overhead("client-0")
    assert figures.timeouts == 0
    assert figures.records[0].max_wait_s < LIBRDKAFKA.batching.request_timeout_s  # type: ignore[union-attr]


def test_a_saturating_librdkafka_row_keeps_five_requests_of_one_size_in_flight() -> None:
    # Without an offer the model does not batch: the table's librdkafka rows are as they were.
    scenario = Scenario(Clients("librdkafka", request_bytes=64 * KIB), Quota(1 * MIB), warmup_s=5.0, measure_s=10.0)
    figures = straight_to_kafka(scenario, seed=1)
    assert {size for record in figures.records for _, size in record.acks} == {64 * KIB - 4}
