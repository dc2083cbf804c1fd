"""The quota sensors the engine records into, and how a throttle comes out of them.

Theory of operation, for a reader who knows the broker
------------------------------------------------------
A Kafka broker meters each client with a `Sensor` per quota type (ClientQuotaManager.
getOrCreateQuotaSensors), named by the client's metric tags: `user` and `client-id` as the
KIP-55 precedence resolved them, or whatever a custom ClientQuotaCallback returns. The sensor
holds one stat with the quota as its bound. kqp keeps the same objects: a `RateSensor` per
client and quota type, and a `MutationSensor` for the controller mutation quota.

Byte rates and request time use `Rate` over a `WindowedSum` (org.apache.kafka.common.metrics.
stats, here `kqp.quotas.stats.WindowedRate`). A SampledStat keeps `quota.window.num` samples
(11 by default) of `quota.window.size.seconds` (1 s): a record goes into the current sample,
or starts a new one when the current one is a window old; samples with no event for
num x size are purged. The rate is the sum of the samples over `Rate.windowSize`: the time
since the oldest sample starts, padded to at least num - 1 full windows, so a new client is
measured over 10 s, never over the few milliseconds since its first request (which would
throttle every first burst).

Sensor.record(value, now, checkQuotas) adds the value first and checks the bound after, so
the request that goes over is recorded and pays. The throttle is QuotaUtils.throttleTime:
with O the measured rate, T the bound and W the window size, the client must stay silent X
ms so that O * W / (W + X) = T, that is X = (O - T) / T * W, rounded as Java's Math.round.
Kafka narrows it to an int (l2i) for the response, so an absurd throttle wraps negative and
counts as none (`stats.java_int`). Request time and connection creation take
QuotaUtils.boundedThrottleTime, capped at one window (ClientRequestQuotaManager.throttleTime;
the engine applies the cap). A fetch over quota is answered empty, so KafkaApis unrecords its
bytes (ClientQuotaManager.unrecordQuotaSensor); the engine does the same unless the caller
delivers the data anyway (a ShareFetch through the proxy, kqp.quotas.recording).

The controller mutation quota (KIP-599) is a `TokenBucket` instead (`stats.TokenBucket`,
Kafka's TokenBucket stat): it refills at the quota up to a burst of num x size x quota
partitions, a mutation takes its partitions out, and a negative balance D gives a throttle
of -D / quota seconds (ControllerMutationQuotaManager.throttleTimeMs). Beside it the
`mutation-rate` Rate is kept for observability only, with the broker's default MetricConfig.

A sensor idle for `sensor_expiry_s` (Kafka's one hour, Sensor.hasExpired) is dropped with its
history, as on the broker; `expired` tells anyone still holding it to look it up again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kqp.frozen_value import FrozenValue
from kqp.quotas.callbacks import CLIENT_ID_TAG, USER_TAG
from kqp.quotas.settings import Scope
from kqp.quotas.stats import NO_QUOTA_BOUND, TokenBucket, WindowedRate

# Kafka's broker default MetricConfig (metrics.num.samples, metrics.sample.window.ms), which
# the observability-only mutation-rate stat uses.
_DEFAULT_METRIC_SAMPLES = 2
_DEFAULT_METRIC_WINDOW_MS = 30_000


@dataclass(frozen=True, slots=True)
class SensorSnapshot(FrozenValue):
    """One sensor's figures for metrics. Units per quota type: bytes/s, percent of a thread,
    partitions/s (mutation-rate), connections/s."""

    quota_type: str
    scope: Scope
    broker: str | None  # the upstream broker label for scope "broker", None for "cluster"
    user: str
    client_id: str
    tags: Mapping[str, str]
    value: float
    limit: float | None
    tokens: float | None
    throttle_count: int
    throttle_ms_total: int
    dry_run: bool


class SensorIdentity:
    """Who a sensor meters: its scope and tags, and whether its throttles are enforced."""

    __slots__ = ("broker", "client_id", "custom_tags", "dry_run", "scope", "user")

    def __init__(
        self,
        broker: str | None,
        scope: Scope,
        user: str,
        client_id: str,
        custom_tags: Mapping[str, str] | None,
        dry_run: bool,
    ) -> None:
        self.broker = broker
        self.scope: Scope = scope
        self.user = user
        self.client_id = client_id
        # Only kept when a custom callback chose the tags; the default ones are (user, client-id).
        self.custom_tags = custom_tags
        self.dry_run = dry_run

    @property
    def tags(self) -> Mapping[str, str]:
        """The sensor's metric tags, as Kafka names the sensor by them."""
        if self.custom_tags is not None:
            return self.custom_tags
        return {USER_TAG: self.user, CLIENT_ID_TAG: self.client_id}


class QuotaSensor:
    """Kafka's quota Sensor (org.apache.kafka.common.metrics.Sensor, one of a client's
    ClientSensors): who it meters, when it last recorded (Sensor.hasExpired), whether it was
    dropped, and its throttle counts for metrics, besides its stat.

    `rate` is the Rate the sensor reports as its value: the quota stat itself for byte rates
    and request time, the observability-only mutation-rate for controller mutations.
    """

    __slots__ = ("expired", "identity", "last_record_ms", "rate", "throttle_count", "throttle_ms_total")

    def __init__(self, rate: WindowedRate, now_ms: int, identity: SensorIdentity) -> None:
        self.rate = rate
        self.identity = identity
        self.last_record_ms = now_ms
        self.expired = False
        self.throttle_count = 0
        self.throttle_ms_total = 0

    @property
    def bound(self) -> float:
        """The quota the sensor enforces (NO_QUOTA_BOUND when none applies)."""
        return self.rate.bound

    @bound.setter
    def bound(self, value: float) -> None:
        self.rate.bound = value

    def record(self, value: float, now_ms: int) -> None:
        self.rate.record(value, now_ms)

    def record_at(self, value: float, at_ms: int, now_ms: int) -> None:
        """Record at `now_ms` what another fleet instance recorded at `at_ms` (WindowedRate.record_at)."""
        self.rate.record_at(value, at_ms, now_ms)

    def snapshot(self, quota_type: str, now_ms: int) -> SensorSnapshot:
        """The sensor's figures at `now_ms`, read without purging (observing changes nothing)."""
        bound = self.bound
        identity = self.identity
        return SensorSnapshot(
            quota_type=quota_type,
            scope=identity.scope,
            broker=identity.broker,
            user=identity.user,
            client_id=identity.client_id,
            tags=identity.tags,
            value=self.rate.peek(now_ms),
            limit=None if bound == NO_QUOTA_BOUND else bound,
            tokens=self._tokens(now_ms),
            throttle_count=self.throttle_count,
            throttle_ms_total=self.throttle_ms_total,
            dry_run=identity.dry_run,
        )

    def _tokens(self, now_ms: int) -> float | None:
        return None


class RateSensor(QuotaSensor):
    """A Sensor whose stat is a Rate with the quota as its bound (produce, fetch, request
    time, connection creation): Sensor.record(value, now, checkQuotas=true) is
    `rate.record_and_throttle`."""

    __slots__ = ()

    def __init__(self, samples: int, window_ms: int, bound: float, now_ms: int, identity: SensorIdentity) -> None:
        super().__init__(WindowedRate(samples, window_ms, bound), now_ms, identity)


class MutationSensor(QuotaSensor):
    """ControllerMutationQuotaManager's sensor: the KIP-599 TokenBucket (metric `tokens`)
    enforces; the `mutation-rate` Rate (Kafka's default MetricConfig) is only reported."""

    __slots__ = ("bucket",)

    def __init__(self, samples: int, window_ms: int, bound: float, now_ms: int, identity: SensorIdentity) -> None:
        super().__init__(WindowedRate(_DEFAULT_METRIC_SAMPLES, _DEFAULT_METRIC_WINDOW_MS), now_ms, identity)
        self.bucket = TokenBucket(samples, window_ms, bound, now_ms)

    @property
    def bound(self) -> float:
        return self.bucket.bound

    @bound.setter
    def bound(self, value: float) -> None:
        self.bucket.bound = value

    def record(self, value: float, now_ms: int) -> None:
        self.bucket.record(value, now_ms)
        self.rate.record(value, now_ms)

    def record_at(self, value: float, at_ms: int, now_ms: int) -> None:
        # The bucket's clock only goes forward: charged now, as before reports carried ages.
        self.record(value, now_ms)

    def _tokens(self, now_ms: int) -> float | None:
        return self.bucket.peek(now_ms)
