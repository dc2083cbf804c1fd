"""Kafka 4.3.1's client quota managers, one class per Kafka class, each naming the methods it
follows, so that a reviewer can read them beside the broker's code:

    ClientQuotaManager               org.apache.kafka.server.quota.ClientQuotaManager
                                     (produce and fetch byte rates, KIP-13/55; the sensor
                                     bookkeeping every other manager inherits)
    ClientRequestQuotaManager        kafka.server.ClientRequestQuotaManager (KIP-124)
    ControllerMutationQuotaManager   org.apache.kafka.server.quota.ControllerMutationQuotaManager
                                     with its Strict/PermissiveControllerMutationQuota (KIP-599)
    ConnectionQuotas                 kafka.network.ConnectionQuotas, per-IP rate (KIP-612)

kqp.quotas.engine.QuotaManagers holds one of each and records in KafkaApis' order. How a
sensor turns records into a throttle is in kqp.quotas.sensors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Generic, Protocol, TypeVar

from kqp.protocol.api_keys import ApiKey
from kqp.quotas.callbacks import (
    CLIENT_ID_TAG,
    USER_TAG,
    ClientQuotaCallback,
    DefaultQuotaCallback,
    EntityResolvingCallback,
)
from kqp.quotas.sensors import MutationSensor, QuotaSensor, RateSensor, SensorIdentity
from kqp.quotas.settings import DEFAULT_ENTITY, QuotaEntity, QuotaEntry, QuotaSettings, QuotaType, Scope
from kqp.quotas.stats import INT_MAX, NO_QUOTA_BOUND, java_int, token_bucket_throttle_time

# ClientRequestQuotaManager.NanosToPercentagePerSecond: 1 ms of thread time per second = 0.1 %.
NANOS_TO_PERCENT = 100.0 / 1_000_000_000

# Kafka 4.3.1's request-quota exemptions by API key (sendResponseExemptThrottle), read from
# its bytecode: on brokers (KafkaApis) WriteTxnMarkers (27); on controllers (ControllerApis)
# AlterPartition (56) and the KRaft RPCs that only controllers serve: Vote (52),
# BeginQuorumEpoch (53), EndQuorumEpoch (54), FetchSnapshot (59), UpdateRaftVoter (82). The
# proxy fronts brokers, so APIs a broker serves itself take the broker's rule: DescribeQuorum
# (55), AddRaftVoter (80), RemoveRaftVoter (81) and UpdateFeatures (57) are forwarded to the
# controller and charged, as are BrokerRegistration/Heartbeat (62, 63), AllocateProducerIds
# (67), ControllerRegistration (70), Envelope (58) and the share-group state APIs (83-87).
# Produce with acks=0 and follower Fetch are exempt per request (`exempt=True`).
EXEMPT_REQUEST_API_KEYS: frozenset[int] = frozenset({27, 52, 53, 54, 56, 59, 82})

# KIP-599: versions from which a mutation over quota is rejected per topic (strict) rather
# than accepted and followed by a throttle (permissive).
STRICT_MUTATION_SINCE: Mapping[int, int] = {
    ApiKey.CREATE_TOPICS: 6,
    ApiKey.DELETE_TOPICS: 5,
    ApiKey.CREATE_PARTITIONS: 3,
}

# Bound by the sensors' common base rather than restricted to the two: the compiled build erases
# a type variable to its bound, so a manager reads and sets its sensors' fields directly (the
# hot path's expiry check and last-record time) instead of through generic attribute lookups.
S = TypeVar("S", bound=QuotaSensor)


class LimitScale(Protocol):
    @property
    def limit_scale(self) -> float:
        """The fraction of each configured quota this engine enforces (1 = all of it)."""
        ...


class QuotaHost(Protocol):
    """What a manager reads of the engine that holds it (kqp.quotas.engine's QuotaManagers):
    the settings, the configured entries and the sharing seam's limit scale. A Protocol rather
    than the class, so that this module, which the engine imports, does not import it back."""

    @property
    def settings(self) -> QuotaSettings: ...

    @property
    def entries(self) -> Mapping[QuotaEntity, QuotaEntry]: ...

    @property
    def sharing(self) -> LimitScale: ...


class ClientQuotaManager(Generic[S]):
    """Kafka's ClientQuotaManager for one quota type: sensors by metric tags, limits from the
    ClientQuotaCallback, and (for produce and fetch) recording.

    Follows getOrCreateQuotaSensors (`sensor`), quota/updateQuotaMetricConfigs (`limit_for`,
    `refresh_limits`), quotaTypesEnabled (`refresh_enabled`), recordAndGetThrottleTimeMs
    (`record`) and maxValueInQuotaWindow (`max_value_in_window`). kqp adds a scope per quota
    entry: a sensor per upstream broker (`scope: broker`, as each Kafka broker meters alone)
    or one for the whole cluster.
    """

    __slots__ = (
        "cache", "cache_previous", "callback", "default_callback", "enabled", "engine", "factory", "poll_reset",
        "quota_type", "resolver", "samples", "sensors", "window_ms",
    )

    def __init__(
        self,
        engine: QuotaHost,
        quota_type: QuotaType,
        callback: ClientQuotaCallback,
        factory: Callable[[int, int, float, int, SensorIdentity], S],
    ) -> None:
        self.engine = engine
        self.factory: Callable[[int, int, float, int, SensorIdentity], S] = factory
        self.quota_type = quota_type
        self.callback = callback
        self.default_callback = callback if isinstance(callback, DefaultQuotaCallback) else None
        self.resolver = callback if isinstance(callback, EntityResolvingCallback) else None
        self.poll_reset = self.default_callback is None
        self.samples = 0
        self.window_ms = 0
        self.sensors: dict[tuple[object, ...], S] = {}
        self.cache: dict[tuple[str, str, str], S] = {}
        self.cache_previous: dict[tuple[str, str, str], S] = {}
        self.enabled = False

    def configure(self, samples: int, window_ms: int) -> None:
        if (samples, window_ms) != (self.samples, self.window_ms):
            # Kafka's windows are static broker configs; a change starts every sensor afresh.
            self.samples, self.window_ms = samples, window_ms
            self.drop_all()

    def drop_all(self) -> None:
        for sensor in self.sensors.values():
            sensor.expired = True
        self.sensors.clear()
        self.forget_clients()

    def forget_clients(self) -> None:
        self.cache.clear()
        self.cache_previous.clear()

    def refresh_enabled(self) -> None:
        """quotaTypesEnabled != 0 (a custom callback turns every quota type on, Kafka's CustomQuotas)."""
        default = self.default_callback
        self.enabled = default is None or default.kinds_enabled(self.quota_type) != 0

    def client_sensor(self, broker: str, user: str, client_id: str, now_ms: int) -> S:
        """The sensor a client's request records into, marked as used at `now_ms`."""
        sensor = self.cache.get((broker, user, client_id))
        if sensor is None or sensor.expired or self.poll_reset:
            sensor = self.sensor(broker, user, client_id, now_ms)
        sensor.last_record_ms = now_ms
        return sensor

    def sensor(self, broker: str, user: str, client_id: str, now_ms: int) -> S:
        """The client's sensor, created if needed (getOrCreateQuotaSensors)."""
        if self.poll_reset and self.callback.quota_reset_required(self.quota_type):
            self.refresh_limits()
        key = (broker, user, client_id)
        sensor = self.cache.get(key)
        if sensor is not None and not sensor.expired:
            return sensor
        sensor = self.cache_previous.pop(key, None)
        if sensor is None or sensor.expired:
            sensor = self._resolve(broker, user, client_id, now_ms)
        self.cache[key] = sensor
        return sensor

    def _resolve(self, broker: str, user: str, client_id: str, now_ms: int) -> S:
        default = self.default_callback
        custom_tags: dict[str, str] | None = None
        if default is not None:
            user_tag, client_tag = default.metric_tags(self.quota_type, user, client_id)
            tags: Mapping[str, str] = {USER_TAG: user_tag, CLIENT_ID_TAG: client_tag}
        else:
            custom_tags = dict(self.callback.quota_metric_tags(self.quota_type, user, client_id))
            tags = custom_tags
        scope, dry_run = self.entry_policy(tags)
        scope_broker = broker if scope == "broker" else None
        return self._sensor_for(scope_broker, tags, custom_tags, dry_run, now_ms)

    def _sensor_for(
        self,
        scope_broker: str | None,
        tags: Mapping[str, str],
        custom_tags: dict[str, str] | None,
        dry_run: bool,
        now_ms: int,
    ) -> S:
        user_tag, client_tag = tags.get(USER_TAG, ""), tags.get(CLIENT_ID_TAG, "")
        # Default tags need no more than their two values (keys are a memory cost per client).
        sensor_key: tuple[object, ...] = (
            (scope_broker, user_tag, client_tag) if custom_tags is None else (scope_broker, *tags.items())
        )
        sensor = self.sensors.get(sensor_key)
        if sensor is None:
            scope: Scope = "cluster" if scope_broker is None else "broker"
            identity = SensorIdentity(scope_broker, scope, user_tag, client_tag, custom_tags, dry_run)
            sensor = self.factory(self.samples, self.window_ms, self.limit_for(tags), now_ms, identity)
            self.sensors[sensor_key] = sensor
        return sensor

    def sensor_for_tags(self, scope_broker: str | None, tags: Mapping[str, str], now_ms: int) -> S:
        """The sensor with these metric tags, created if needed: a sensor named by its tags
        (and scope broker) rather than by a client."""
        custom_tags = None if self.default_callback is not None else dict(tags)
        return self._sensor_for(scope_broker, tags, custom_tags, self.entry_policy(tags)[1], now_ms)

    def limit_for(self, tags: Mapping[str, str]) -> float:
        """The bound a sensor with these tags enforces (quota(), Long.MAX_VALUE when none),
        times the sharing seam's `limit_scale`."""
        limit = self.callback.quota_limit(self.quota_type, tags)
        return NO_QUOTA_BOUND if limit is None else float(limit) * self.engine.sharing.limit_scale

    def entry_policy(self, tags: Mapping[str, str]) -> tuple[Scope, bool]:
        """Scope and dry run of the configured entry whose limit applies to these tags."""
        settings = self.engine.settings
        entry = None
        if self.resolver is not None:
            entity = self.resolver.quota_entity(self.quota_type, tags)
            if entity is not None:
                entry = self.engine.entries.get(entity)
        if entry is None:
            return settings.scope, settings.dry_run
        return entry.scope or settings.scope, settings.dry_run or entry.dry_run

    def refresh_limits(self) -> None:
        """updateQuotaMetricConfigs: every live sensor gets its current limit, history kept."""
        for sensor in self.sensors.values():
            tags = sensor.identity.tags
            sensor.bound = self.limit_for(tags)
            sensor.identity.dry_run = self.entry_policy(tags)[1]
        # Tags, and so sensors, may now differ for a client: resolve each one again.
        self.forget_clients()

    def expire(self, now_ms: int, expiry_ms: float) -> int:
        idle = [key for key, sensor in self.sensors.items() if now_ms - sensor.last_record_ms > expiry_ms]
        for key in idle:
            self.sensors.pop(key).expired = True
        return len(idle)

    def record(self: ClientQuotaManager[RateSensor], sensor: RateSensor, value: float, now_ms: int) -> int:
        """recordAndGetThrottleTimeMs: record, then QuotaUtils.throttleTime if over the bound,
        narrowed to an int as Kafka's l2i does (a negative result is no throttle)."""
        return java_int(sensor.rate.record_and_throttle(value, now_ms))

    def max_value_in_window(self: ClientQuotaManager[RateSensor], sensor: RateSensor) -> int | None:
        """maxValueInQuotaWindow as an int: limit x (samples - 1) x window_s; None without a quota."""
        if sensor.bound == NO_QUOTA_BOUND:
            return None
        cap = sensor.bound * (self.samples - 1) * (self.window_ms // 1000)
        return int(cap) if cap < INT_MAX else INT_MAX


class ClientRequestQuotaManager(ClientQuotaManager[RateSensor]):
    """kafka.server.ClientRequestQuotaManager: request time as percent of one thread.

    Follows maybeRecordAndGetThrottleTimeMs (the exempt APIs and flags are never recorded)
    and throttleTime, which is QuotaUtils.boundedThrottleTime: capped at one quota window.
    """

    __slots__ = ()

    def record_time(self, sensor: RateSensor, request_ms: float, now_ms: int) -> tuple[float, int]:
        """Record the request's thread time; (percent recorded, throttle capped at a window)."""
        percent = request_ms * 1_000_000 * NANOS_TO_PERCENT
        throttle = sensor.rate.record_and_throttle(percent, now_ms)
        return percent, min(throttle, self.window_ms)


class ControllerMutationQuotaManager(ClientQuotaManager[MutationSensor]):
    """org.apache.kafka.server.quota.ControllerMutationQuotaManager: partitions per second.

    Follows newQuotaFor (strict from the versions in STRICT_MUTATION_SINCE, permissive before),
    StrictControllerMutationQuota.record / PermissiveControllerMutationQuota.record (`charge`)
    and throttleTimeMs (`stats.token_bucket_throttle_time`).
    """

    __slots__ = ()

    def charge(self, sensor: MutationSensor, strict: bool, topics: Sequence[tuple[str, int]], now_ms: int
               ) -> tuple[list[bool], int, int]:
        """Charge each topic's partitions in request order: (verdicts, throttle, partitions recorded).

        Strict checks the bucket before recording each topic: a topic that finds it negative is
        rejected and not recorded (unless dry run), so one topic may overdraw and the next
        request pays. Permissive records every topic, then throttles by the deficit.
        """
        bucket, dry_run = sensor.bucket, sensor.identity.dry_run
        verdicts: list[bool] = []
        last_throttle = 0
        recorded = 0
        for _topic, partitions in topics:
            if strict:
                tokens = bucket.measure(now_ms)
                if tokens < 0:
                    verdicts.append(False)
                    last_throttle = token_bucket_throttle_time(tokens, bucket.bound)
                    if not dry_run:
                        continue
                else:
                    verdicts.append(True)
                sensor.record(partitions, now_ms)
                recorded += partitions
            else:
                verdicts.append(True)
                sensor.record(partitions, now_ms)
                recorded += partitions
                tokens = bucket.measure(now_ms)
                if tokens < 0:
                    last_throttle = token_bucket_throttle_time(tokens, bucket.bound)
        # AbstractControllerMutationQuota.throttleTime: an int, never negative.
        return verdicts, max(java_int(last_throttle), 0), recorded


class ConnectionQuotas:
    """kafka.network.ConnectionQuotas, per IP only (KIP-612): recordIpConnectionMaybeThrottle
    and updateIpConnectionRateQuota. The throttle is bounded by one window, as Kafka's."""

    __slots__ = ("default_limit", "limits", "samples", "sensors", "window_ms")

    def __init__(self) -> None:
        self.limits: dict[str, float] = {}
        self.default_limit: float | None = None
        self.sensors: dict[str, RateSensor] = {}
        self.samples = 0
        self.window_ms = 0

    def configure(self, settings: QuotaSettings) -> None:
        samples, window_ms = settings.window_num, settings.window_size_s * 1000
        if (samples, window_ms) != (self.samples, self.window_ms):
            self.samples, self.window_ms = samples, window_ms
            self.sensors.clear()
        self.limits = {e.ip: float(e.connection_creation_rate) for e in settings.ip_entries if e.ip != DEFAULT_ENTITY}
        defaults = [e.connection_creation_rate for e in settings.ip_entries if e.ip == DEFAULT_ENTITY]
        self.default_limit = float(defaults[-1]) if defaults else None
        for ip, sensor in self.sensors.items():
            limit = self.limit_for(ip)
            sensor.bound = NO_QUOTA_BOUND if limit is None else limit
            sensor.identity.dry_run = settings.dry_run

    def limit_for(self, ip: str) -> float | None:
        return self.limits.get(ip, self.default_limit)

    def sensor(self, ip: str, limit: float, dry_run: bool, now_ms: int) -> RateSensor:
        sensor = self.sensors.get(ip)
        if sensor is None:
            identity = SensorIdentity(None, "cluster", "", "", {"ip": ip}, dry_run)
            sensor = self.sensors[ip] = RateSensor(self.samples, self.window_ms, limit, now_ms, identity)
        sensor.last_record_ms = now_ms
        return sensor
