"""Kafka's client quotas, written from Kafka's own source: the project's one independent figure.

Two suites ask this module, not kqp.quotas, what Kafka would record, throttle and answer, so an
error in kqp.quotas cannot also be in "Kafka's figure": the simulator's modelled broker
(kqpsim/broker.py) and the integration tests that replay a capture's
`quota_*` columns to check each response's ThrottleTimeMs (test_oauthbearer_through_proxy.py's
assert_kafka_throttles). It lives in the simulator's package, kqpsim, so that both, and bench/,
import it as it is. It shares no code with kqp (tests/unit/simulator/test_kafka_reference.py
fails if it imports anything but the standard library) and it is written per rule from these files of apache/kafka
(read at trunk 1eb7644, checked against the 4.3.1 jars where the code moved: Rate.windowSize,
SampledStat.purgeObsoleteSamples and Sample.isComplete compile to the same rules):

- clients/.../common/metrics/{Quota,Sensor,QuotaViolationException}.java
- clients/.../common/metrics/stats/{SampledStat,WindowedSum,Rate,TokenBucket}.java
- server-common/.../server/quota/QuotaUtils.java (throttle time from a violation)
- core/.../server/ClientQuotaManager.scala (DefaultQuotaCallback; in 4.3 server/.../quota/ClientQuotaManager.java)
- core/.../server/ClientRequestQuotaManager.scala, ControllerMutationQuotaManager.scala
- core/.../server/KafkaApis.scala (handleProduceRequest, handleFetchRequest)

What it leaves out, as the simulator never reaches it: sensor expiry (3600 s idle), the
throttle-time Avg sensors, network-thread time (recordNoThrottle after the send), custom
callbacks, and the muting itself, which is the broker model's channel (SocketServer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

LONG_MAX = 2**63 - 1
NO_QUOTA = float(LONG_MAX)  # ClientQuotaManager.quotaLimit: a missing limit is Long.MAX_VALUE
DEFAULT = "<default>"  # ZooKeeperInternals.DEFAULT_STRING: the <default> entity
BROKER_FETCH_MAX_BYTES = 55 * 1024 * 1024  # ServerConfigs fetch.max.bytes default (57671680)
NANOS_TO_PERCENT = 100.0 / 1e9  # ClientRequestQuotaManager.NanosToPercentagePerSecond


def java_round(value: float) -> int:
    """Math.round(double): floor(x + 0.5), saturating at the long range (NaN is 0)."""
    if math.isnan(value):
        return 0
    if value >= LONG_MAX:
        return LONG_MAX
    if value <= -LONG_MAX - 1:
        return -LONG_MAX - 1
    return math.floor(value + 0.5)


def java_long_to_int(value: int) -> int:
    """Scala Long.toInt: keep the low 32 bits (ClientQuotaManager's `throttleTime(e, t).toInt`)."""
    low = value & 0xFFFFFFFF
    return low - (1 << 32) if low >= 1 << 31 else low


@dataclass(frozen=True)
class MetricConfig:
    """MetricConfig as the quota managers build it: samples, window, an upper-bound Quota."""

    samples: int
    window_ms: int
    bound: float | None = None  # Quota.upperBound(limit); None: no quota on the metric


class QuotaViolation(Exception):
    """QuotaViolationException: the metric's measured value and its bound."""

    def __init__(self, value: float, bound: float) -> None:
        super().__init__(f"violated quota. Actual: {value}, Threshold: {bound}")
        self.value = value
        self.bound = bound


@dataclass
class _Sample:
    start_ms: int
    last_event_ms: int
    value: float = 0.0
    events: int = 0

    def reset(self, now_ms: int) -> None:
        self.start_ms = self.last_event_ms = now_ms
        self.value = 0.0
        self.events = 0


class Rate:
    """Rate over a WindowedSum (SampledStat since 3.8: `samples + 1` slots, the extra one for a
    sample that started before the window but still has events inside it)."""

    def __init__(self, config: MetricConfig) -> None:
        self.config = config
        self.samples: list[_Sample] = []
        self.current = 0

    # SampledStat.record: roll to the next slot when the current sample is complete
    # (Sample.isComplete: its window has passed; eventWindow is Long.MAX_VALUE for quotas).
    def record(self, value: float, now_ms: int) -> None:
        sample = self._current(now_ms)
        if now_ms - sample.start_ms >= self.config.window_ms:
            self.current = (self.current + 1) % (self.config.samples + 1)  # SampledStat.advance
            if self.current >= len(self.samples):
                sample = _Sample(now_ms, now_ms)
                self.samples.append(sample)
            else:
                sample = self.samples[self.current]
                sample.reset(now_ms)
        sample.value += value  # WindowedSum.update
        sample.events += 1
        sample.last_event_ms = now_ms

    def _current(self, now_ms: int) -> _Sample:
        if not self.samples:
            self.samples.append(_Sample(now_ms, now_ms))
        return self.samples[self.current]

    # SampledStat.purgeObsoleteSamples: a sample with no event in the last samples x window is
    # reset to now (in place; its slot stays).
    def purge(self, now_ms: int) -> None:
        expire_age = self.config.samples * self.config.window_ms
        for sample in self.samples:
            if now_ms - sample.last_event_ms >= expire_age:
                sample.reset(now_ms)

    def _oldest(self, now_ms: int) -> _Sample:
        if not self.samples:
            self.samples.append(_Sample(now_ms, now_ms))
        oldest = self.samples[0]
        for sample in self.samples[1:]:
            if sample.start_ms < oldest.start_ms:
                oldest = sample
        return oldest

    def total(self, now_ms: int) -> float:
        """SampledStat.measure with WindowedSum.combine: purge, then every slot's value."""
        self.purge(now_ms)
        return sum(sample.value for sample in self.samples)

    # Rate.windowSize: the elapsed time since the oldest sample, padded to at least
    # samples - 1 full windows, and never under 1 ms.
    def window_size(self, now_ms: int) -> int:
        self.purge(now_ms)
        window = self.config.window_ms
        elapsed = now_ms - self._oldest(now_ms).start_ms
        full_windows = elapsed // window
        least = self.config.samples - 1
        if full_windows < least:
            elapsed += (least - full_windows) * window
        return max(elapsed, 1)

    def measure(self, now_ms: int) -> float:
        """Rate.measure: the windowed sum per second of the window size."""
        value = self.total(now_ms)
        return value / (self.window_size(now_ms) / 1000.0)


class TokenBucket:
    """TokenBucket (KIP-599): refilled at the bound per second up to samples x window x bound.
    Kafka's clock is epoch milliseconds from a bucket whose last update is 0, so the first
    refill fills it: this one starts full, which is the same thing on any clock."""

    def __init__(self, config: MetricConfig) -> None:
        self.config = config
        self.tokens: float | None = None  # full at the first use
        self.last_update_ms = 0

    def _refill(self, now_ms: int) -> None:
        bound = self.config.bound
        assert bound is not None
        burst = self.config.samples * (self.config.window_ms / 1000.0) * bound
        if self.tokens is None:
            self.tokens = burst
        else:
            self.tokens = min(burst, self.tokens + bound * ((now_ms - self.last_update_ms) / 1000.0))
        self.last_update_ms = now_ms

    def measure(self, now_ms: int) -> float:
        if self.config.bound is None:
            return float(LONG_MAX)
        self._refill(now_ms)
        assert self.tokens is not None
        return self.tokens

    def record(self, value: float, now_ms: int) -> None:
        if self.config.bound is None:
            return
        self._refill(now_ms)
        assert self.tokens is not None
        burst = self.config.samples * (self.config.window_ms / 1000.0) * self.config.bound
        self.tokens = min(burst, self.tokens - value)


class Sensor:
    """Sensor with one quota'd stat, as every client quota sensor has (the controller's also has
    an unquota'd mutation-rate Rate, which decides nothing)."""

    def __init__(self, stat: Rate | TokenBucket) -> None:
        self.stat = stat

    # Sensor.recordInternal: every stat records first, then the quotas are checked, so a
    # violating value stays recorded.
    def record(self, value: float, now_ms: int, check_quotas: bool = True) -> None:
        self.stat.record(value, now_ms)
        if check_quotas:
            self.check_quotas(now_ms)

    # Sensor.checkQuotas: a TokenBucket violates below zero, anything else when Quota.acceptable
    # (value <= bound for an upper bound) fails.
    def check_quotas(self, now_ms: int) -> None:
        bound = self.stat.config.bound
        if bound is None:
            return
        value = self.stat.measure(now_ms)
        violated = value < 0 if isinstance(self.stat, TokenBucket) else not value <= bound
        if violated:
            raise QuotaViolation(value, bound)


# QuotaUtils.throttleTime: the delay X after which the rate is back at the bound,
# O * W / (W + X) = T, over the same window size Rate.measure divided by.
def throttle_time(violation: QuotaViolation, rate: Rate, now_ms: int) -> int:
    difference = violation.value - violation.bound
    return java_round(difference / violation.bound * rate.window_size(now_ms))


def bounded_throttle_time(violation: QuotaViolation, rate: Rate, max_ms: int, now_ms: int) -> int:
    return min(throttle_time(violation, rate, now_ms), max_ms)


# ControllerMutationQuotaManager.throttleTimeMs: the time to refill the deficit to zero.
def token_throttle_time(violation: QuotaViolation) -> int:
    return java_round(-violation.value / violation.bound * 1000)


Entity = tuple[str | None, str | None]  # (user, client-id); None: absent, DEFAULT: <default>
# ClientQuotaManager.QuotaTypes bits: which kinds of entity have ever had a quota.
_CLIENT_ID, _USER, _USER_CLIENT_ID = 1, 2, 4


class ClientQuotaManager:
    """ClientQuotaManager with its DefaultQuotaCallback: one sensor per metric-tag pair."""

    def __init__(self, samples: int = 11, window_s: int = 1) -> None:
        self.samples = samples  # quota.window.num
        self.window_ms = window_s * 1000  # quota.window.size.seconds
        self.quotas: dict[Entity, float] = {}
        self.types_enabled = 0
        self.sensors: dict[tuple[str, str], Sensor] = {}

    # updateQuota / removeQuota: set the entity kind's bit (4.1+ clears it with the kind's last
    # entity, KAFKA-19282), then give every live sensor the bound its tags now resolve to.
    def set_quotas(self, quotas: dict[Entity, float]) -> None:
        self.quotas = dict(quotas)
        self.types_enabled = 0
        for user, client in self.quotas:
            self.types_enabled |= (_USER_CLIENT_ID if user is not None and client is not None
                                   else _USER if user is not None else _CLIENT_ID)
        for tags, sensor in self.sensors.items():
            sensor.stat.config = self._config(self.limit(tags))

    @property
    def enabled(self) -> bool:
        return self.types_enabled != 0

    # DefaultQuotaCallback.quotaMetricTags: with one kind of entity the tags are fixed; with
    # several, walk the eight levels and stop at the first that has a quota.
    def tags(self, user: str, client_id: str) -> tuple[str, str]:
        enabled = self.types_enabled
        if enabled in (0, _CLIENT_ID):
            return "", client_id
        if enabled == _USER:
            return user, ""
        if enabled == _USER_CLIENT_ID:
            return user, client_id
        for entity, tags in (((user, client_id), (user, client_id)), ((user, DEFAULT), (user, client_id)),
                             ((user, None), (user, "")), ((DEFAULT, client_id), (user, client_id)),
                             ((DEFAULT, DEFAULT), (user, client_id)), ((DEFAULT, None), (user, ""))):
            if entity in self.quotas:
                return tags
        return "", client_id

    # DefaultQuotaCallback.quotaLimit: the most specific entity of the tags' kind.
    def limit(self, tags: tuple[str, str]) -> float:
        user, client_id = tags
        if user and client_id:
            candidates: list[Entity] = [(user, client_id), (user, DEFAULT), (DEFAULT, client_id), (DEFAULT, DEFAULT)]
        elif user:
            candidates = [(user, None), (DEFAULT, None)]
        elif client_id:
            candidates = [(None, client_id), (None, DEFAULT)]
        else:
            candidates = []
        for entity in candidates:
            if entity in self.quotas:
                return self.quotas[entity]
        return NO_QUOTA

    def _config(self, limit: float) -> MetricConfig:
        return MetricConfig(self.samples, self.window_ms, limit)

    def _new_stat(self, config: MetricConfig) -> Rate | TokenBucket:
        return Rate(config)

    def sensor(self, user: str, client_id: str) -> Sensor:
        tags = self.tags(user, client_id)
        sensor = self.sensors.get(tags)
        if sensor is None:
            sensor = self.sensors[tags] = Sensor(self._new_stat(self._config(self.limit(tags))))
        return sensor

    def _throttle(self, violation: QuotaViolation, rate: Rate, now_ms: int) -> int:
        return java_long_to_int(throttle_time(violation, rate, now_ms))  # unbounded for bytes

    # maybeRecordAndGetThrottleTimeMs: nothing is recorded while no quota of this kind exists.
    def record(self, user: str, client_id: str, value: float, now_ms: int) -> int:
        if not self.enabled:
            return 0
        sensor = self.sensor(user, client_id)
        try:
            sensor.record(value, now_ms)
        except QuotaViolation as violation:
            assert isinstance(sensor.stat, Rate)
            return self._throttle(violation, sensor.stat, now_ms)
        return 0

    # unrecordQuotaSensor: the same value negated at the same time, unchecked: it lands in the
    # sample the value went to, so the sum is what it was.
    def unrecord(self, user: str, client_id: str, value: float, now_ms: int) -> None:
        self.sensor(user, client_id).record(-value, now_ms, check_quotas=False)

    # getMaxValueInQuotaWindow: the largest value an idle sensor admits unthrottled.
    def max_value_in_quota_window(self, user: str, client_id: str) -> float:
        if not self.enabled:
            return float("inf")  # Double.MaxValue
        limit = self.limit(self.tags(user, client_id))
        if limit == NO_QUOTA:
            return float("inf")
        return limit * (self.samples - 1) * (self.window_ms // 1000)


class ClientRequestQuotaManager(ClientQuotaManager):
    """Request time as a percentage of one thread (KIP-124); throttles bounded by one window."""

    def _throttle(self, violation: QuotaViolation, rate: Rate, now_ms: int) -> int:
        return bounded_throttle_time(violation, rate, self.window_ms, now_ms)

    def record_request(self, user: str, client_id: str, thread_nanos: int, now_ms: int) -> int:
        return self.record(user, client_id, thread_nanos * NANOS_TO_PERCENT, now_ms)


@dataclass
class MutationQuota:
    """Strict- or PermissiveControllerMutationQuota for one request (ControllerMutationQuotaManager.newQuotaFor)."""

    sensor: Sensor | None  # None: quotas disabled, the unbounded quota
    strict: bool
    last_throttle_ms: int = 0
    last_recorded_ms: int = 0
    accepted: list[bool] = field(default_factory=list)

    def record(self, permits: float, now_ms: int) -> None:
        if self.sensor is None:
            self.accepted.append(True)
            return
        try:
            if self.strict:
                # Strict: check first, record unchecked, so one topic may overdraw the bucket.
                self.sensor.check_quotas(now_ms)
                self.sensor.record(permits, now_ms, check_quotas=False)
            else:
                self.sensor.record(permits, now_ms)
        except QuotaViolation as violation:
            self.last_throttle_ms = token_throttle_time(violation)
            self.last_recorded_ms = now_ms
            if self.strict:  # ThrottlingQuotaExceededException for this topic; nothing recorded
                self.accepted.append(False)
                return
        self.accepted.append(True)

    # AbstractControllerMutationQuota.throttleTime: the violation's throttle less the time since.
    def throttle_time(self, now_ms: int) -> int:
        return max(0, self.last_throttle_ms - (now_ms - self.last_recorded_ms))


class ControllerMutationQuotaManager(ClientQuotaManager):
    """controller_mutation_rate in partitions/s over a TokenBucket (KIP-599)."""

    def _new_stat(self, config: MetricConfig) -> Rate | TokenBucket:
        return TokenBucket(config)

    def quota_for(self, user: str, client_id: str, strict: bool) -> MutationQuota:
        return MutationQuota(self.sensor(user, client_id) if self.enabled else None, strict)


# The first version of each mutation API whose quota is strict (ControllerApis' newQuotaFor calls).
STRICT_SINCE = {19: 6, 37: 3, 20: 5}  # CreateTopics, CreatePartitions, DeleteTopics


@dataclass(frozen=True)
class FetchAnswer:
    throttle_ms: int
    empty: bool  # FetchContext.getThrottledResponse: no data, the fetch is unrecorded


class KafkaQuotas:
    """What KafkaApis does with the four managers for the requests the simulator sends."""

    def __init__(self, quotas: dict[str, dict[Entity, float]] | None = None, *, window_num: int = 11,
                 controller_window_num: int = 11) -> None:
        # quota.window.num and controller.quota.window.num (QuotaConfig); both windows 1 s.
        self.produce = ClientQuotaManager(window_num)
        self.fetch = ClientQuotaManager(window_num)
        self.request = ClientRequestQuotaManager(window_num)
        self.mutation = ControllerMutationQuotaManager(controller_window_num)
        for key, limits in (quotas or {}).items():
            self.manager(key).set_quotas(limits)

    def manager(self, quota_key: str) -> ClientQuotaManager:
        """ClientQuotaMetadataManager: which manager a quota key goes to."""
        return {"producer_byte_rate": self.produce, "consumer_byte_rate": self.fetch,
                "request_percentage": self.request, "controller_mutation_rate": self.mutation}[quota_key]

    # handleProduceRequest: the request's size (header and body) to the produce quota and its
    # thread time to the request quota (not for acks=0); the larger throttle is sent and muted.
    def handle_produce(self, user: str, client_id: str, request_size: int, thread_nanos: int, now_ms: int,
                       acks: int = -1) -> int:
        bandwidth = self.produce.record(user, client_id, request_size, now_ms)
        request = 0 if acks == 0 else self.request.record_request(user, client_id, thread_nanos, now_ms)
        return max(bandwidth, request)

    # handleFetchRequest (consumer): MaxBytes capped by fetch.max.bytes and by what an idle
    # quota window admits, before the log is read.
    def fetch_max_bytes(self, user: str, client_id: str, request_max_bytes: int) -> int:
        window = self.fetch.max_value_in_quota_window(user, client_id)
        cap = LONG_MAX if math.isinf(window) else int(window)  # Double.toInt saturates
        return min(request_max_bytes, BROKER_FETCH_MAX_BYTES, cap, 2**31 - 1)

    # ... then request time, then the response's size; if either throttles, the size is
    # unrecorded and the answer is empty (KafkaApis: "we should unrecord ... because we are
    # going to return an empty response").
    def handle_fetch(self, user: str, client_id: str, response_size: int, thread_nanos: int,
                     now_ms: int) -> FetchAnswer:
        request = self.request.record_request(user, client_id, thread_nanos, now_ms)
        bandwidth = self.fetch.record(user, client_id, response_size, now_ms)
        throttle = max(bandwidth, request)
        if throttle > 0:
            self.fetch.unrecord(user, client_id, response_size, now_ms)
            return FetchAnswer(throttle, empty=True)
        return FetchAnswer(0, empty=False)

    # CreateTopics (and the other mutations) forwarded to the controller: partitions charged
    # topic by topic in request order; the response's throttle is the larger of the
    # controller's and the broker's request throttle (sendForwardedResponse).
    def handle_mutation(self, user: str, client_id: str, api_key: int, api_version: int,
                        topics: list[tuple[str, int]], thread_nanos: int, now_ms: int) -> tuple[list[bool], int]:
        quota = self.mutation.quota_for(user, client_id, strict=api_version >= STRICT_SINCE[api_key])
        for _name, partitions in topics:
            quota.record(partitions, now_ms)
        request = self.request.record_request(user, client_id, thread_nanos, now_ms)
        return quota.accepted, max(quota.throttle_time(now_ms), request)
