"""QuotaEngine: Kafka's client quota managers, with the broker's recording order.

One manager per quota type (produce, fetch, request, controller mutation) plus the KIP-612
per-IP connection rate. Every method takes the time in milliseconds; the engine has no clock.

Hot path: a client's sensor is found with one dict lookup keyed by (broker, user, client-id);
the KIP-55/KIP-257 resolution (tags, limit, scope, dry run) only runs on a miss. Those lookups
live in two generations that rotate once per sensor-expiry period, so a flood of one-off
client-ids cannot grow the cache without bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kqp.protocol.api_keys import ApiKey
from kqp.quotas.callbacks import (
    CLIENT_ID_TAG,
    USER_TAG,
    ClientQuotaCallback,
    ClusterMetadata,
    DefaultQuotaCallback,
    EntityResolvingCallback,
    load_callback,
)
from kqp.quotas.fleet import UsageDelta
from kqp.quotas.settings import (
    DEFAULT_ENTITY,
    QUOTA_TYPES,
    QuotaEntity,
    QuotaEntry,
    QuotaSettings,
    QuotaType,
    Scope,
)
from kqp.quotas.stats import (
    INT_MAX,
    NO_QUOTA_BOUND,
    TokenBucket,
    WindowedRate,
    java_int,
    token_bucket_throttle_time,
)

CONNECTION_CREATION_RATE = "connection_creation_rate"

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

# Kafka's broker default MetricConfig (metrics.num.samples, metrics.sample.window.ms), used by
# the observability-only mutation-rate stat.
_DEFAULT_METRIC_SAMPLES = 2
_DEFAULT_METRIC_WINDOW_MS = 30_000

ThrottleObserver = Callable[[str, Mapping[str, str], int, bool], None]
"""on_throttle(quota_type, tags, throttle_ms, enforced): called only for throttles > 0; tags are
the sensor's metric tags ({"user", "client-id"} by default, {"ip"} for connections)."""


@dataclass(slots=True)
class MutationOutcome:
    """What the broker answers a CreateTopics/CreatePartitions/DeleteTopics with.

    accepted: per topic in request order (False = THROTTLING_QUOTA_EXCEEDED);
    throttle_ms: the controller-mutation ThrottleTimeMs to enforce at `computed_at_ms`
    (combine with the request-quota throttle by max; later, use `throttle_at`);
    would_accept / computed_throttle_ms: the verdict before dry run, equal to the above when
    enforced.
    """

    accepted: list[bool]
    throttle_ms: int
    would_accept: list[bool] = field(default_factory=list)
    computed_throttle_ms: int = 0
    dry_run: bool = False
    computed_at_ms: int = 0

    def throttle_at(self, now_ms: float) -> int:
        """The throttle a response sent at `now_ms` carries (AbstractControllerMutationQuota.
        throttleTime): less the time since it was computed, so the client waits until the
        same instant however long the request took to answer; never below 0."""
        if self.throttle_ms == 0:
            return 0
        return max(0, java_int(self.throttle_ms - (int(now_ms) - self.computed_at_ms)))


@dataclass(frozen=True, slots=True)
class SensorSnapshot:
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


class _SensorIdentity:
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


class RateSensor(WindowedRate):
    """A quota sensor metered by a Rate: what the client's requests are recorded into."""

    __slots__ = (
        "expired", "identity", "last_record_ms", "remote_instances", "throttle_count", "throttle_ms_total", "unshared",
        "unshared_listed",
    )

    def __init__(self, samples: int, window_ms: int, bound: float, now_ms: int, identity: _SensorIdentity) -> None:
        super().__init__(samples, window_ms, bound)
        self.identity = identity
        self.last_record_ms = now_ms
        self.expired = False
        self.throttle_count = 0
        self.throttle_ms_total = 0
        # Fleet sharing: what this instance recorded since its last usage report.
        self.unshared = 0.0
        self.unshared_listed = False
        # Fleet sharing, fetch sensors only: the other instances that reported this client's usage.
        self.remote_instances: set[str] | None = None


class MutationSensor:
    """ControllerMutation sensor: the KIP-599 `tokens` bucket and the `mutation-rate` Rate."""

    __slots__ = (
        "bucket", "expired", "identity", "last_record_ms", "rate", "throttle_count", "throttle_ms_total",
        "unshared", "unshared_listed",
    )

    def __init__(self, samples: int, window_ms: int, bound: float, now_ms: int, identity: _SensorIdentity) -> None:
        self.bucket = TokenBucket(samples, window_ms, bound, now_ms)
        self.rate = WindowedRate(_DEFAULT_METRIC_SAMPLES, _DEFAULT_METRIC_WINDOW_MS)
        self.identity = identity
        self.last_record_ms = now_ms
        self.expired = False
        self.throttle_count = 0
        self.throttle_ms_total = 0
        self.unshared = 0.0
        self.unshared_listed = False

    def record(self, partitions: float, now_ms: int) -> None:
        self.bucket.record(partitions, now_ms)
        self.rate.record(partitions, now_ms)

    @property
    def bound(self) -> float:
        return self.bucket.bound

    @bound.setter
    def bound(self, value: float) -> None:
        self.bucket.bound = value


def _tags(identity: _SensorIdentity) -> Mapping[str, str]:
    if identity.custom_tags is not None:
        return identity.custom_tags
    return {USER_TAG: identity.user, CLIENT_ID_TAG: identity.client_id}


_Sensor = RateSensor | MutationSensor
S = TypeVar("S", RateSensor, MutationSensor)


class _Manager(Generic[S]):
    """ClientQuotaManager for one quota type: sensors by tags, the client lookup cache."""

    __slots__ = (
        "cache",
        "cache_previous",
        "callback",
        "default_callback",
        "enabled",
        "engine",
        "factory",
        "poll_reset",
        "quota_type",
        "resolver",
        "samples",
        "sensors",
        "window_ms",
    )

    def __init__(
        self,
        engine: QuotaEngine,
        quota_type: QuotaType,
        callback: ClientQuotaCallback,
        factory: Callable[[int, int, float, int, _SensorIdentity], S],
    ) -> None:
        self.engine = engine
        self.factory: Callable[[int, int, float, int, _SensorIdentity], S] = factory
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
        default = self.default_callback
        # CUSTOM_QUOTAS: with a custom callback quotas are always on (quotaTypesEnabled = 8).
        self.enabled = default is None or default.kinds_enabled(self.quota_type) != 0

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
            identity = _SensorIdentity(scope_broker, scope, user_tag, client_tag, custom_tags, dry_run)
            sensor = self.factory(self.samples, self.window_ms, self.limit_for(tags), now_ms, identity)
            self.sensors[sensor_key] = sensor
        return sensor

    def shared_sensor(self, scope_broker: str | None, tags: Mapping[str, str], now_ms: int) -> S:
        """The sensor another fleet instance's usage report names (created if this one has none)."""
        custom_tags = None if self.default_callback is not None else dict(tags)
        return self._sensor_for(scope_broker, tags, custom_tags, self.entry_policy(tags)[1], now_ms)

    def limit_for(self, tags: Mapping[str, str]) -> float:
        """The bound a sensor with these tags enforces: the quota, times this instance's share
        of it while a fleet exchange is down under the `share` policy (1 otherwise)."""
        limit = self.callback.quota_limit(self.quota_type, tags)
        return NO_QUOTA_BOUND if limit is None else float(limit) * self.engine.budget_share

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
            tags = _tags(sensor.identity)
            sensor.bound = self.limit_for(tags)
            sensor.identity.dry_run = self.entry_policy(tags)[1]
        # Tags, and so sensors, may now differ for a client: resolve each one again.
        self.forget_clients()

    def expire(self, now_ms: int, expiry_ms: float) -> int:
        idle = [key for key, sensor in self.sensors.items() if now_ms - sensor.last_record_ms > expiry_ms]
        for key in idle:
            self.sensors.pop(key).expired = True
        return len(idle)


class _IpQuotas:
    """KIP-612 per-IP connection creation rate (ConnectionQuotas.recordIpConnectionMaybeThrottle)."""

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


def _limits_by_type(settings: QuotaSettings) -> dict[QuotaType, dict[QuotaEntity, float]]:
    limits: dict[QuotaType, dict[QuotaEntity, float]] = {t: {} for t in QUOTA_TYPES}
    for entry in settings.entries:
        for quota_type, value in entry.limits.items():
            limits[quota_type][entry.entity] = float(value)
    return limits


class QuotaEngine:
    """Kafka's client quotas for every upstream broker (or the whole cluster), time passed in.

    Returned throttles are the milliseconds to enforce; 0 means none (or dry run). Several
    quotas on one request combine by max, never by sum (the caller takes the max).
    """

    def __init__(
        self,
        settings: QuotaSettings,
        callback: ClientQuotaCallback | None = None,
        on_throttle: ThrottleObserver | None = None,
    ) -> None:
        if callback is None:
            callback = load_callback(settings.callback, settings.callback_options) if settings.callback else None
        self.callback: ClientQuotaCallback = callback if callback is not None else DefaultQuotaCallback()
        self.on_throttle = on_throttle
        self.settings = QuotaSettings()
        self.entries: dict[QuotaEntity, QuotaEntry] = {}
        self._limits: dict[QuotaType, dict[QuotaEntity, float]] = {t: {} for t in QUOTA_TYPES}
        callback = self.callback
        self._produce = _Manager(self, "producer_byte_rate", callback, RateSensor)
        self._fetch = _Manager(self, "consumer_byte_rate", callback, RateSensor)
        self._request = _Manager(self, "request_percentage", callback, RateSensor)
        self._mutation = _Manager(self, "controller_mutation_rate", callback, MutationSensor)
        self._managers: dict[QuotaType, _Manager[Any]] = {
            "producer_byte_rate": self._produce,
            "consumer_byte_rate": self._fetch,
            "request_percentage": self._request,
            "controller_mutation_rate": self._mutation,
        }
        self._ip = _IpQuotas()
        self._request_max_throttle_ms = 0
        self._connection_max_throttle_ms = 0
        self._expiry_ms = 0.0
        self._rotated_at_ms: float | None = None
        # Fleet sharing (kqp.quotas.fleet): off until an exchange asks for local usage.
        self.budget_share = 1.0
        self._sharing = False
        # Fleet sharing: mutations travel as claims every instance charges (kqp.quotas.fleet),
        # so what they record is not usage to report as well.
        self.mutations_claimed = False
        self._unshared: list[tuple[QuotaType, _Sensor]] = []
        # Deltas `take_local_usage` left out because their client was far from its quota.
        self.deltas_kept_quiet = 0
        # Fleet sharing: when each other instance last reported (heartbeats included).
        self._remote_report_ms: dict[str, int] = {}
        self.update(settings)

    @classmethod
    def from_config(cls, settings: QuotaSettings, on_throttle: ThrottleObserver | None = None) -> QuotaEngine:
        return cls(settings, on_throttle=on_throttle)

    # -- configuration -------------------------------------------------------------------------

    def update(self, settings: QuotaSettings) -> None:
        """Apply new settings live: changed limits reach existing sensors, history is kept."""
        self.settings = settings
        self.entries = {entry.entity: entry for entry in settings.entries}
        window_ms = settings.window_size_s * 1000
        for quota_type, manager in self._managers.items():
            if quota_type == "controller_mutation_rate":
                manager.configure(settings.controller_window_num, settings.controller_window_size_s * 1000)
            else:
                manager.configure(settings.window_num, window_ms)
        new_limits = _limits_by_type(settings)
        for quota_type in QUOTA_TYPES:
            old, new = self._limits[quota_type], new_limits[quota_type]
            for entity in old.keys() - new.keys():
                self.callback.remove_quota(quota_type, entity)
            for entity, value in new.items():
                if old.get(entity) != value:
                    self.callback.update_quota(quota_type, entity, value)
        self._limits = new_limits
        for manager in self._managers.values():
            manager.refresh_enabled()
            manager.refresh_limits()
        self._ip.configure(settings)
        self._request_max_throttle_ms = window_ms
        self._connection_max_throttle_ms = window_ms
        self._expiry_ms = settings.sensor_expiry_s * 1000.0

    def update_cluster_metadata(self, metadata: ClusterMetadata) -> bool:
        """KIP-257: pass cluster metadata to the callback; refresh every limit if it asks."""
        changed = self.callback.update_cluster_metadata(metadata)
        if changed:
            for manager in self._managers.values():
                manager.refresh_limits()
        return changed

    def quota(self, quota_type: QuotaType, user: str, client_id: str) -> float | None:
        """The limit that applies to a client now (Kafka's `quota(user, clientId)`), or None."""
        return self.callback.quota_limit(quota_type, self._metric_tags(quota_type, user, client_id))

    def _metric_tags(self, quota_type: QuotaType, user: str, client_id: str) -> Mapping[str, str]:
        """The sensor tags a client's quota of this type resolves to (its entity)."""
        default = self._managers[quota_type].default_callback
        if default is not None:
            user_tag, client_tag = default.metric_tags(quota_type, user, client_id)
            return {USER_TAG: user_tag, CLIENT_ID_TAG: client_tag}
        return self.callback.quota_metric_tags(quota_type, user, client_id)

    def cluster_scoped(self, user: str, client_id: str) -> bool:
        """Whether any client quota that limits this client has `scope: cluster` (one budget
        across every broker), so a throttle for it must hold all the client's connections."""
        for quota_type, manager in self._managers.items():
            if quota_type == CONNECTION_CREATION_RATE or not manager.enabled:
                continue
            tags = self._metric_tags(quota_type, user, client_id)
            if manager.limit_for(tags) < NO_QUOTA_BOUND and manager.entry_policy(tags)[0] == "cluster":
                return True
        return False

    # -- byte rates (KIP-13) -------------------------------------------------------------------

    def record_produce(self, broker: str, user: str, client_id: str, nbytes: int, now_ms: float) -> int:
        """Produce: record the request size, then compute the (unbounded) throttle."""
        manager = self._produce
        if not manager.enabled:
            return 0
        t = int(now_ms)
        sensor = manager.cache.get((broker, user, client_id))
        if sensor is None or sensor.expired or manager.poll_reset:
            sensor = manager.sensor(broker, user, client_id, t)
        sensor.last_record_ms = t
        # Kafka narrows the long throttle to an int (l2i, wrapping); a negative one is no throttle.
        throttle = java_int(sensor.record_and_throttle(nbytes, t))
        if self._sharing:
            self._unshared_usage("producer_byte_rate", sensor, nbytes)
        if throttle <= 0:
            return 0
        return self._throttled("producer_byte_rate", sensor, throttle)

    def record_fetch(
        self,
        broker: str,
        user: str,
        client_id: str,
        nbytes: int,
        now_ms: float,
        request_throttle_ms: int = 0,
        *,
        delivered: bool = False,
    ) -> int:
        """Consumer fetch: record the response size, compute the throttle, and unrecord the
        bytes when the fetch is throttled by this quota or by the request quota (pass that
        throttle as `request_throttle_ms`), since the broker then sends an empty response.

        `delivered`: the data reaches the client anyway (a proxy that already has the
        broker's response), so the bytes stay recorded, as they were really consumed.
        """
        manager = self._fetch
        if not manager.enabled:
            return 0
        t = int(now_ms)
        sensor = manager.cache.get((broker, user, client_id))
        if sensor is None or sensor.expired or manager.poll_reset:
            sensor = manager.sensor(broker, user, client_id, t)
        sensor.last_record_ms = t
        remote = sensor.remote_instances
        sharers = self._live_sharers(remote, t - manager.samples * manager.window_ms) if remote else 0
        if sharers:
            # Other instances serve this client too, and what they served since their last
            # report is not known here yet. Consumers that come back from a throttle together
            # fetch together: until this instance's usage is reported, each other instance is
            # taken to have served as much, as one broker would have seen all of it.
            sensor.record(nbytes, t)
            throttle = java_int(sensor.throttle_with(sharers * (sensor.unshared + nbytes), t))
        else:
            throttle = java_int(sensor.record_and_throttle(nbytes, t))
        if throttle <= 0 and request_throttle_ms <= 0:
            if self._sharing:
                self._unshared_usage("consumer_byte_rate", sensor, nbytes)
            return 0
        # Throttled: the broker answers empty and unrecords, unless the data is delivered anyway.
        if not delivered and not sensor.identity.dry_run:
            sensor.record(-nbytes, t)
        elif self._sharing:
            self._unshared_usage("consumer_byte_rate", sensor, nbytes)
        if throttle <= 0:
            return 0
        return self._throttled("consumer_byte_rate", sensor, throttle)

    def fetch_max_bytes_cap(self, broker: str, user: str, client_id: str, now_ms: float) -> int | None:
        """getMaxValueInQuotaWindow as an int: limit x (samples - 1) x window_s, the largest
        response that is not throttled on an idle sensor; None when no consumer quota applies."""
        manager = self._fetch
        if not manager.enabled:
            return None
        sensor = manager.sensor(broker, user, client_id, int(now_ms))
        if sensor.bound == NO_QUOTA_BOUND:
            return None
        cap = sensor.bound * (manager.samples - 1) * (manager.window_ms // 1000)
        return int(cap) if cap < INT_MAX else INT_MAX

    # -- request time (KIP-124) ----------------------------------------------------------------

    def record_request_time(
        self,
        broker: str,
        user: str,
        client_id: str,
        api_key: int,
        request_ms: float,
        now_ms: float,
        *,
        exempt: bool = False,
    ) -> int:
        """Record the time a request took as percent of a thread; throttle bounded by the window.

        `exempt` is for requests the broker exempts beyond the API list: Produce with acks=0
        and follower fetches.
        """
        if exempt or api_key in EXEMPT_REQUEST_API_KEYS:
            return 0
        manager = self._request
        if not manager.enabled:
            return 0
        t = int(now_ms)
        sensor = manager.cache.get((broker, user, client_id))
        if sensor is None or sensor.expired or manager.poll_reset:
            sensor = manager.sensor(broker, user, client_id, t)
        sensor.last_record_ms = t
        percent = request_ms * 1_000_000 * NANOS_TO_PERCENT
        throttle = sensor.record_and_throttle(percent, t)
        if self._sharing:
            self._unshared_usage("request_percentage", sensor, percent)
        if throttle <= 0:
            return 0
        return self._throttled("request_percentage", sensor, min(throttle, self._request_max_throttle_ms))

    # -- controller mutations (KIP-599) --------------------------------------------------------

    def mutations(
        self,
        broker: str,
        user: str,
        client_id: str,
        api_key: int,
        api_version: int,
        topics: Sequence[tuple[str, int]],
        now_ms: float,
    ) -> MutationOutcome:
        """Charge each topic's partitions, in request order.

        Strict versions check the bucket before recording each topic: a topic that finds the
        bucket negative is rejected and not recorded, so one topic may overdraw and the next
        request pays. Older versions record every topic, then throttle by the deficit.
        """
        if api_key not in STRICT_MUTATION_SINCE:
            raise ValueError(f"API key {api_key} is not a controller mutation")
        manager = self._mutation
        if not manager.enabled:
            everything = [True] * len(topics)
            return MutationOutcome(everything, 0, list(everything))
        t = int(now_ms)
        sensor = manager.sensor(broker, user, client_id, t)
        sensor.last_record_ms = t
        bucket, dry_run = sensor.bucket, sensor.identity.dry_run
        strict = api_version >= STRICT_MUTATION_SINCE[api_key]
        verdicts: list[bool] = []
        last_throttle = 0
        recorded = 0
        for _topic, partitions in topics:
            if strict:
                tokens = bucket.measure(t)
                if tokens < 0:
                    verdicts.append(False)
                    last_throttle = token_bucket_throttle_time(tokens, bucket.bound)
                    if not dry_run:
                        continue
                else:
                    verdicts.append(True)
                sensor.record(partitions, t)
                recorded += partitions
            else:
                verdicts.append(True)
                sensor.record(partitions, t)
                recorded += partitions
                tokens = bucket.measure(t)
                if tokens < 0:
                    last_throttle = token_bucket_throttle_time(tokens, bucket.bound)
        if self._sharing and recorded and not self.mutations_claimed:
            self._unshared_usage("controller_mutation_rate", sensor, recorded)
        throttle = max(java_int(last_throttle), 0)  # AbstractControllerMutationQuota.throttleTime
        enforced = self._throttled("controller_mutation_rate", sensor, throttle) if throttle else 0
        accepted = [True] * len(verdicts) if dry_run else verdicts
        return MutationOutcome(accepted, enforced, verdicts, throttle, dry_run, t)

    # -- connections (KIP-612) -----------------------------------------------------------------

    def connection_created(self, ip: str, now_ms: float) -> int:
        """A new connection from `ip`: ms it must be held then closed (0 = accept).

        A throttled connection is unrecorded, as the broker closes it without serving it.
        """
        ip_quotas = self._ip
        limit = ip_quotas.limit_for(ip)
        if limit is None:
            return 0
        t = int(now_ms)
        sensor = ip_quotas.sensors.get(ip)
        if sensor is None:
            identity = _SensorIdentity(None, "cluster", "", "", {"ip": ip}, self.settings.dry_run)
            sensor = RateSensor(ip_quotas.samples, ip_quotas.window_ms, limit, t, identity)
            ip_quotas.sensors[ip] = sensor
        sensor.last_record_ms = t
        throttle = sensor.record_and_throttle(1.0, t)
        if throttle <= 0:
            return 0
        if not sensor.identity.dry_run:
            sensor.record(-1.0, t)
        return self._throttled(CONNECTION_CREATION_RATE, sensor, min(throttle, self._connection_max_throttle_ms))

    # -- fleet sharing (kqp.quotas.fleet) -------------------------------------------------------

    def share_usage(self, enabled: bool, *, mutations_claimed: bool = False) -> None:
        """Start (or stop) keeping what each sensor records until `take_local_usage` asks;
        `mutations_claimed`: partition mutations are shared as claims, not as usage."""
        self._sharing = enabled
        self.mutations_claimed = enabled and mutations_claimed
        if not enabled:
            self.take_local_usage()

    def _unshared_usage(self, quota_type: QuotaType, sensor: _Sensor, amount: float) -> None:
        if sensor.bound == NO_QUOTA_BOUND:
            return  # no quota limits this client: nobody's throttle depends on its usage
        if not sensor.unshared_listed:
            sensor.unshared_listed = True
            self._unshared.append((quota_type, sensor))
        sensor.unshared += amount

    def take_local_usage(self, now_ms: float = 0.0, quiet_below: float = 0.0) -> list[UsageDelta]:
        """What this instance recorded into each sensor since the last call: its usage report.

        `quiet_below` (a fraction of each quota) leaves out the byte-rate and request-time
        usage of a sensor whose rate, as this instance measures it at `now_ms` (its own usage
        plus what the others reported), is below that fraction of its bound: a client far from
        its quota cannot be throttled by that share of it. Given `quiet_below` = e / N for a fleet
        of N instances, what the fleet leaves unreported is less than e of the quota.
        """
        pending, self._unshared = self._unshared, []
        usage = []
        t = int(now_ms)
        for quota_type, sensor in pending:
            amount, sensor.unshared, sensor.unshared_listed = sensor.unshared, 0.0, False
            if not amount:
                continue
            if quiet_below > 0.0 and isinstance(sensor, RateSensor) and \
                    sensor.measure(t) < quiet_below * sensor.bound:
                self.deltas_kept_quiet += 1
                continue
            identity = sensor.identity
            usage.append(UsageDelta(quota_type, identity.broker, tuple(_tags(identity).items()), amount))
        return usage

    def record_remote_usage(self, usage: Iterable[UsageDelta], now_ms: float, instance: str | None = None) -> None:
        """Another instance's report: its usage counts against the same sensors as this one's.

        Nothing is throttled here; the next local request measures the fleet's rate. A quota
        type this instance does not enforce ignores the usage (its sensors would never be read).
        `instance` (the reporter; give it for heartbeats too) lets fetch sensors know how many
        live instances serve a client.
        """
        t = int(now_ms)
        managers = self._managers
        fetch = self._fetch
        if instance is not None:
            self._remote_report_ms[instance] = t
        for delta in usage:
            manager = managers[delta.quota_type]
            if not manager.enabled:
                continue
            sensor = manager.shared_sensor(delta.broker, dict(delta.tags), t)
            sensor.record(delta.amount, t)
            sensor.last_record_ms = t
            if manager is fetch and instance is not None:
                if sensor.remote_instances is None:
                    sensor.remote_instances = set()
                sensor.remote_instances.add(instance)

    def _live_sharers(self, instances: set[str], horizon_ms: int) -> int:
        """How many of `instances` (those that have served a client) reported since `horizon_ms`,
        forgetting the others; a throttled client's instance stays, as it sends heartbeats."""
        reported = self._remote_report_ms
        instances -= {i for i in instances if reported.get(i, horizon_ms - 1) < horizon_ms}
        return len(instances)

    def set_budget_share(self, share: float) -> None:
        """Enforce `share` of every client quota (the fleet's `share` policy); 1 restores them."""
        if share != self.budget_share:
            self.budget_share = share
            for manager in self._managers.values():
                manager.refresh_limits()

    # -- housekeeping and observability --------------------------------------------------------

    def _throttled(self, quota_type: str, sensor: _Sensor, throttle_ms: int) -> int:
        sensor.throttle_count += 1
        sensor.throttle_ms_total += throttle_ms
        enforced = not sensor.identity.dry_run
        if self.on_throttle is not None:
            self.on_throttle(quota_type, _tags(sensor.identity), throttle_ms, enforced)
        return throttle_ms if enforced else 0

    def expire_idle(self, now_ms: float) -> int:
        """Drop sensors idle for longer than sensor_expiry_s (Sensor.hasExpired); their history
        is lost, as in Kafka. Returns how many were dropped."""
        expiry_ms = self._expiry_ms
        dropped = sum(manager.expire(int(now_ms), expiry_ms) for manager in self._managers.values())
        idle_ips = [ip for ip, s in self._ip.sensors.items() if now_ms - s.last_record_ms > expiry_ms]
        for ip in idle_ips:
            self._ip.sensors.pop(ip).expired = True
        if self._rotated_at_ms is None:
            self._rotated_at_ms = now_ms
        elif now_ms - self._rotated_at_ms >= expiry_ms:
            # Client lookups unused for a whole period are forgotten at the next rotation.
            for manager in self._managers.values():
                manager.cache_previous = manager.cache
                manager.cache = {}
            self._rotated_at_ms = now_ms
        return dropped + len(idle_ips)

    def quota_enabled(self, quota_type: QuotaType) -> bool:
        """Whether any quota of this type applies (Kafka's quotaTypesEnabled != 0): when not,
        the proxy can skip the work of preparing to record it."""
        return bool(self._managers[quota_type].enabled)

    def tracked_clients(self) -> int:
        """Client lookups currently cached (all quota types)."""
        return sum(len(m.cache) + len(m.cache_previous) for m in self._managers.values())

    def tracked_sensors(self) -> int:
        return sum(len(m.sensors) for m in self._managers.values()) + len(self._ip.sensors)

    def snapshot(self, now_ms: float | None = None) -> Iterator[SensorSnapshot]:
        """Per-sensor figures at `now_ms` (default: the latest time any sensor recorded).

        Reading does not purge samples, so observing never changes what is enforced.
        """
        if now_ms is None:
            latest = [s.last_record_ms for m in self._managers.values() for s in m.sensors.values()]
            latest += [s.last_record_ms for s in self._ip.sensors.values()]
            now_ms = max(latest, default=0)
        t = int(now_ms)
        for quota_type, manager in self._managers.items():
            for sensor in list(manager.sensors.values()):
                yield self._sensor_snapshot(quota_type, sensor, t)
        for sensor in list(self._ip.sensors.values()):
            yield self._sensor_snapshot(CONNECTION_CREATION_RATE, sensor, t)

    @staticmethod
    def _sensor_snapshot(quota_type: str, sensor: _Sensor, t: int) -> SensorSnapshot:
        if isinstance(sensor, MutationSensor):
            value, tokens = sensor.rate.peek(t), sensor.bucket.peek(t)
        else:
            value, tokens = sensor.peek(t), None
        bound = sensor.bound
        identity = sensor.identity
        return SensorSnapshot(
            quota_type=quota_type,
            scope=identity.scope,
            broker=identity.broker,
            user=identity.user,
            client_id=identity.client_id,
            tags=_tags(identity),
            value=value,
            limit=None if bound == NO_QUOTA_BOUND else bound,
            tokens=tokens,
            throttle_count=sensor.throttle_count,
            throttle_ms_total=sensor.throttle_ms_total,
            dry_run=identity.dry_run,
        )

    def close(self) -> None:
        self.callback.close()
