"""Where Kafka 4.3.1 differs from the 4.0 source the spec was written from.

Each expected number is worked out by hand from Kafka 4.3.1's bytecode (kafka-clients
Rate.windowSize, kafka-server ClientQuotaManager.updateQuotaTypes/recordAndGetThrottleTimeMs,
java.lang.Math.round), not from kqp's constants.
"""

from __future__ import annotations

import math

from kqp.quotas import QuotaEngine, QuotaEntity, QuotaSettings
from kqp.quotas.callbacks import DefaultQuotaCallback
from kqp.quotas.stats import WindowedRate, java_int, java_round, throttle_time
from tests.unit.helpers.quotas import settings_for

LONG_MAX = 9_223_372_036_854_775_807
LONG_MIN = -9_223_372_036_854_775_808


# ---- KAFKA-19282 (Kafka 4.1): a quota type switches off with its last entity ----------------


def test_a_quota_type_switches_off_with_its_last_entity_and_records_nothing_meanwhile() -> None:
    with_quota = settings_for("producer_byte_rate", {(None, "c"): 1000})
    engine = QuotaEngine(with_quota)
    assert engine.record_produce("1", "u", "c", 500, 0) == 0
    engine.update(QuotaSettings())  # the last producer_byte_rate entity is removed
    assert not engine.quota_enabled("producer_byte_rate")
    # quotasEnabled() is false: maybeRecordAndGetThrottleTimeMs returns 0 without recording.
    assert engine.record_produce("1", "u", "c", 10_000_000, 100) == 0
    engine.update(with_quota)
    # Only 500 + 100 bytes were ever recorded: 600 B over the padded 10 s window is 60 B/s,
    # under 1000 B/s. (Kafka <= 4.0 kept recording: the 10 MB would throttle for ~100 s.)
    assert engine.record_produce("1", "u", "c", 100, 200) == 0


def test_each_kind_of_entity_switches_off_when_its_count_reaches_zero() -> None:
    callback = DefaultQuotaCallback()
    kind = "producer_byte_rate"
    callback.update_quota(kind, QuotaEntity(user="alice"), 1000)
    callback.update_quota(kind, QuotaEntity(client_id="c"), 2000)
    callback.update_quota(kind, QuotaEntity(client_id="d"), 2000)
    callback.update_quota(kind, QuotaEntity(client_id="d"), 3000)  # an update, not a second entity
    assert callback.kinds_enabled(kind) == 2 | 1  # UserQuota | ClientIdQuota
    callback.remove_quota(kind, QuotaEntity(client_id="c"))
    assert callback.kinds_enabled(kind) == 2 | 1  # d still has one
    callback.remove_quota(kind, QuotaEntity(client_id="d"))
    assert callback.kinds_enabled(kind) == 2
    # With only user quotas on, DefaultQuotaCallback meters every client under (user, "").
    assert callback.metric_tags(kind, "alice", "any-client") == ("alice", "")
    callback.remove_quota(kind, QuotaEntity(client_id="never-had-one"))  # not active: no change
    assert callback.kinds_enabled(kind) == 2
    callback.remove_quota(kind, QuotaEntity(user="alice"))
    assert callback.kinds_enabled(kind) == 0


# ---- Rate.windowSize truncates toward zero ------------------------------------------------


def test_a_record_older_than_the_oldest_sample_is_measured_with_truncating_division() -> None:
    rate = WindowedRate(samples=11, window_ms=1000, bound=100.0)
    # t = 1000: the first sample starts; 1000 B over the padded 10 s = 100 B/s, not over 100.
    assert rate.record_and_throttle(1000.0, 1000) == 0
    # t = 500, half a window before the sample's start: elapsed = -500. Java:
    # (int) (-500 / 1000) = 0 full windows, elapsed = -500 + (10 - 0) * 1000 = 9500 ms;
    # rate = 2000 B / 9.5 s; throttle = round((2000 / 9.5 - 100) / 100 * 9500) = 10500 ms.
    # (Flooring gives -1 full windows, 10500 ms of window and a 9500 ms throttle.)
    assert rate.record_and_throttle(1000.0, 500) == 10500


# ---- Math.round and the int narrowing ----------------------------------------------------


def test_java_round_saturates_and_rounds_like_java() -> None:
    assert java_round(math.inf) == LONG_MAX
    assert java_round(-math.inf) == LONG_MIN
    assert java_round(math.nan) == 0
    assert java_round(1e300) == LONG_MAX
    assert java_round(-1e300) == LONG_MIN
    # Java 7+ rounds the largest double below 0.5 down (floor(x + 0.5) would give 1).
    assert java_round(0.49999999999999994) == 0
    assert [java_round(x) for x in (0.5, 2.5, -0.5, -2.5, -2.51)] == [1, 3, 0, -2, -3]


def test_a_tiny_positive_bound_gives_long_max_instead_of_raising() -> None:
    # (1e10 - 1e-300) / 1e-300 * 1000 overflows to +Infinity; Math.round(Infinity) = Long.MAX.
    assert throttle_time(1e10, 1e-300, 1000.0) == LONG_MAX


def test_throttles_are_narrowed_to_int_by_wrapping_as_kafka_does() -> None:
    # ClientQuotaManager.recordAndGetThrottleTimeMs: (int) throttleTime(...), bytecode l2i.
    assert java_int(2**31 - 1) == 2**31 - 1
    assert java_int(2**31) == -(2**31)
    assert java_int(LONG_MAX) == -1  # low 32 bits all ones
    assert java_int(10**18) == -1_486_618_624  # 0x0DE0B6B3_A7640000: low word 0xA7640000
