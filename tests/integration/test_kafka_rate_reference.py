"""The integration tests' own copy of Kafka's byte-rate arithmetic (helpers/kafka_rate.py), which
checks the proxy's throttles from outside, gives Kafka's numbers: the vectors of
../shared/docs/kafka-quota-spec.md section 9 that Kafka's own tests assert. No broker needed."""

from __future__ import annotations

from tests.integration.helpers.kafka_rate import KafkaRateSensor


def test_client_quota_manager_vector_d1() -> None:
    """ClientQuotaManagerTest.testQuotaViolation: 500 B/s, 11 x 1 s."""
    sensor = KafkaRateSensor(bound=500)
    assert [sensor.record(400, t) for t in range(0, 10_000, 1000)] == [0] * 10
    assert sensor.record(2300, 10_500) == 2100
    assert [sensor.record(400, t) for t in range(12_600, 20_000, 1000)] == [1200] * 8
    assert sensor.record(400, 20_600) == 1700
    assert sensor.record(400, 21_600) == 0
    assert sensor.record(0, 22_600) == 0  # the bursty sample has rolled over


def test_quota_utils_vector_b3() -> None:
    """QuotaUtilsTest: 100 observed against 50 over a fresh sensor of 3 windows (2 s): 2000 ms."""
    assert KafkaRateSensor(bound=50, samples=3).record(200, 0) == 2000


def test_a_rate_at_the_bound_is_not_throttled() -> None:
    """Vector B1: a value equal to the bound passes (16.5 B/s over a fresh sensor's 10 s)."""
    assert KafkaRateSensor(bound=16.5, samples=11).record(165, 0) == 0
