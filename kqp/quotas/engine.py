"""QuotaManagers: Kafka 4.3.1's client quotas for every upstream broker, in the broker's order.

Kafka's broker holds one manager per quota type (kafka.server.QuotaFactory.QuotaManagers)
and KafkaApis records into them in a fixed order: a Produce's size before its throttle is
computed, a Fetch's response size and then, if it is throttled, the bytes unrecorded again,
every request's thread time, a CreateTopics' partitions topic by topic. `QuotaManagers` is
that object here: one manager per quota type from kqp.quotas.managers (each names the Kafka
class and methods it follows) and the KafkaApis/ControllerApis order around them.

How a sensor turns records into a throttle is in kqp.quotas.sensors; the arithmetic itself
(Rate, TokenBucket, QuotaUtils) in kqp.quotas.stats. Every method takes the time in
milliseconds: the engine has no clock. Returned throttles are what to enforce; 0 means none
(or dry run). Several quotas on one request combine by max, never by sum.

Hot path: a client's sensor is found with one dict lookup keyed by (broker, user, client-id);
the KIP-55/KIP-257 resolution (tags, limit, scope, dry run) only runs on a miss. Those lookups
live in two generations that rotate once per sensor-expiry period, so a flood of one-off
client-ids cannot grow the cache without bound.

Beyond Kafka, an engine may share its quotas with other engines (several proxies enforcing
one quota). The engine knows that only through one seam, `UsageSharing`: it tells the seam
what it recorded, asks it how much more to count before throttling a fetch, and scales every
limit by its factor. The default shares nothing, and the engine is then Kafka's alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kqp.quotas.callbacks import (
    CLIENT_ID_TAG,
    USER_TAG,
    ClientQuotaCallback,
    ClusterMetadata,
    DefaultQuotaCallback,
    load_callback,
)
from kqp.quotas.guard_limits import GuardQuotas
from kqp.quotas.managers import (
    EXEMPT_REQUEST_API_KEYS,
    STRICT_MUTATION_SINCE,
    ClientQuotaManager,
    ClientRequestQuotaManager,
    ConnectionQuotas,
    ControllerMutationQuotaManager,
)
from kqp.quotas.sensors import MutationSensor, QuotaSensor, RateSensor, SensorSnapshot
from kqp.quotas.settings import QUOTA_TYPES, ByteRateType, QuotaEntity, QuotaEntry, QuotaSettings, QuotaType
from kqp.quotas.stats import NO_QUOTA_BOUND, java_int

CONNECTION_CREATION_RATE = "connection_creation_rate"

ThrottleObserver = Callable[[str, Mapping[str, str], int, bool], None]
"""on_throttle(quota_type, tags, throttle_ms, enforced): called only for throttles > 0; tags are
the sensor's metric tags ({"user", "client-id"} by default, {"ip"} for connections)."""


class UsageSharing(Protocol):
    """What the engine consults when its quotas are shared with other engines.

    `limit_scale`: the fraction of each configured quota this engine enforces (1 = all of it);
    call `QuotaManagers.refresh_limits` after changing it. `records_usage`: whether `recorded`
    wants to hear of this engine's records (the hot path skips the call when not).
    `consults_others`: whether `pending_elsewhere` can answer anything but None (the hot path
    skips that call when not: with no fleet, every byte charge would ask it for nothing).
    """

    @property
    def limit_scale(self) -> float: ...

    @property
    def records_usage(self) -> bool: ...

    @property
    def consults_others(self) -> bool: ...

    def recorded(self, quota_type: QuotaType, sensor: QuotaSensor, amount: float, now_ms: int) -> None:
        """This engine recorded `amount` into `sensor` at `now_ms` for one of its own clients' requests."""

    def pending_elsewhere(self, sensor: RateSensor, amount: float, now_ms: int) -> float | None:
        """How much to add to the sensor's total before throttling a fetch (or, when the seam
        asks for it, a produce) of `amount`: what the other engines serving this client may
        have served meanwhile. None: nobody else does, or the seam leaves this sensor alone."""

    @property
    def records_guard(self) -> bool: ...

    def guard_recorded(self, quota_type: ByteRateType, sensor: RateSensor, amount: float) -> None:
        """This engine recorded `amount` (net of an unrecorded fetch) into one of the cluster
        guard's sensors (kqp.quotas.guard_limits); called only while `records_guard`."""


class NoSharing:
    """The default seam: nothing shared, every limit whole."""

    limit_scale = 1.0
    records_usage = False
    consults_others = False
    records_guard = False

    def recorded(self, quota_type: QuotaType, sensor: QuotaSensor, amount: float, now_ms: int) -> None:
        return

    def guard_recorded(self, quota_type: ByteRateType, sensor: RateSensor, amount: float) -> None:
        return

    def pending_elsewhere(self, sensor: RateSensor, amount: float, now_ms: int) -> float | None:
        return None


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


def _limits_by_type(settings: QuotaSettings) -> dict[QuotaType, dict[QuotaEntity, float]]:
    limits: dict[QuotaType, dict[QuotaEntity, float]] = {t: {} for t in QUOTA_TYPES}
    for entry in settings.entries:
        for quota_type, value in entry.limits.items():
            limits[quota_type][entry.entity] = float(value)
    return limits


class QuotaManagers:
    """Kafka's client quotas for every upstream broker (or the whole cluster), time passed in:
    QuotaFactory.QuotaManagers, recording in KafkaApis' order.

    `sharing`: the seam through which other engines share these quotas (see UsageSharing).
    """

    def __init__(
        self,
        settings: QuotaSettings,
        callback: ClientQuotaCallback | None = None,
        on_throttle: ThrottleObserver | None = None,
        sharing: UsageSharing | None = None,
    ) -> None:
        if callback is None:
            callback = load_callback(settings.callback, settings.callback_options) if settings.callback else None
        self.callback: ClientQuotaCallback = callback if callback is not None else DefaultQuotaCallback()
        self.on_throttle = on_throttle
        self.sharing: UsageSharing = sharing if sharing is not None else NoSharing()
        self.settings = QuotaSettings()
        self.entries: dict[QuotaEntity, QuotaEntry] = {}
        self._limits: dict[QuotaType, dict[QuotaEntity, float]] = {t: {} for t in QUOTA_TYPES}
        callback = self.callback
        self._produce = ClientQuotaManager(self, "producer_byte_rate", callback, RateSensor)
        self._fetch = ClientQuotaManager(self, "consumer_byte_rate", callback, RateSensor)
        self._request = ClientRequestQuotaManager(self, "request_percentage", callback, RateSensor)
        self._mutation = ControllerMutationQuotaManager(self, "controller_mutation_rate", callback, MutationSensor)
        self._managers: dict[QuotaType, ClientQuotaManager[Any]] = {
            "producer_byte_rate": self._produce,
            "consumer_byte_rate": self._fetch,
            "request_percentage": self._request,
            "controller_mutation_rate": self._mutation,
        }
        self._ip = ConnectionQuotas()
        # The cluster guard's limits (kqp.quotas.guard_limits), when the proxy runs the guard.
        self.guard: GuardQuotas | None = None
        self._expiry_ms = 0.0
        self._rotated_at_ms: float | None = None
        self.update(settings)

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
        self.refresh_limits()
        self._ip.configure(settings)
        self._expiry_ms = settings.sensor_expiry_s * 1000.0
        if self.guard is not None:
            self.guard.configure()

    def set_guard(self, granularity: str | None, dry_run: bool = False) -> GuardQuotas | None:
        """Run the cluster guard's sensors at this granularity (None: no guard). A change of
        granularity starts them afresh; a change of dry run keeps their history."""
        if granularity is None:
            self.guard = None
        elif self.guard is None or self.guard.granularity != granularity:
            self.guard = GuardQuotas(self, granularity, dry_run)
        else:
            self.guard.configure(dry_run)
        return self.guard

    def refresh_limits(self) -> None:
        """Every client sensor gets its current limit (updateQuotaMetricConfigs on each manager)."""
        for manager in self._managers.values():
            manager.refresh_limits()

    def update_cluster_metadata(self, metadata: ClusterMetadata) -> bool:
        """KIP-257: pass cluster metadata to the callback; refresh every limit if it asks."""
        changed = self.callback.update_cluster_metadata(metadata)
        if changed:
            self.refresh_limits()
        return changed

    def manager(self, quota_type: QuotaType) -> ClientQuotaManager[Any]:
        return self._managers[quota_type]

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
            if not manager.enabled:
                continue
            tags = self._metric_tags(quota_type, user, client_id)
            if manager.limit_for(tags) < NO_QUOTA_BOUND and manager.entry_policy(tags)[0] == "cluster":
                return True
        return False

    # -- byte rates (KIP-13) -------------------------------------------------------------------

    def record_produce(self, broker: str, user: str, client_id: str, nbytes: int, now_ms: float) -> int:
        """Produce: record the request size, then compute the (unbounded) throttle
        (KafkaApis.handleProduceRequest: quotas.produce.maybeRecordAndGetThrottleTimeMs).

        Beyond Kafka, a fleet adds what its other instances serving the client may admit
        meanwhile to the total the throttle is computed from, as for a fetch (see
        kqp.quotas.fleet). With the cluster guard on, the guard's sensor records
        too, and the larger throttle is the answer (the lower of the two limits binds)."""
        manager = self._produce
        throttle = 0
        if manager.enabled:
            t = int(now_ms)
            sensor = manager.client_sensor(broker, user, client_id, t)
            throttle = self._record_bytes(manager, sensor, nbytes, t)
            if self.sharing.records_usage:
                self.sharing.recorded("producer_byte_rate", sensor, nbytes, t)
            throttle = self._throttled("producer_byte_rate", sensor, throttle) if throttle > 0 else 0
        # Without the guard (the default) that is the answer: no call more on the hot path.
        guard = self.guard
        if guard is None:
            return throttle
        # The guard's sensor as the configured one; fetch differs (an unrecord that needs the
        # guard's throttle before dry run zeroes it), so the two are not one helper.
        t = int(now_ms)
        guard_sensor = guard.sensor("producer_byte_rate", broker, user, client_id, t)
        guarded = guard.managers["producer_byte_rate"].record(guard_sensor, nbytes, t)
        if self.sharing.records_guard:
            self.sharing.guard_recorded("producer_byte_rate", guard_sensor, nbytes)
        if guarded > 0:
            guarded = self._throttled("producer_byte_rate", guard_sensor, guarded)
        return guarded if guarded > throttle else throttle

    def _record_bytes(
        self, manager: ClientQuotaManager[RateSensor], sensor: RateSensor, nbytes: int, t: int
    ) -> int:
        """Record a byte-rate charge and return its throttle: Kafka's (the manager's) alone, or,
        when the fleet shares the budget, computed with what other instances may admit meanwhile."""
        sharing = self.sharing
        elsewhere = sharing.pending_elsewhere(sensor, nbytes, t) if sharing.consults_others else None
        if elsewhere is None:
            return manager.record(sensor, nbytes, t)
        sensor.record(nbytes, t)
        return java_int(sensor.rate.throttle_with(elsewhere, t))

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
        throttle as `request_throttle_ms`), since the broker then sends an empty response
        (KafkaApis.handleFetchRequest: maybeRecordAndGetThrottleTimeMs, then
        unrecordQuotaSensor when max(fetch, request throttle) > 0).

        `delivered`: the data reaches the client anyway (a ShareFetch, whose records the
        broker has acquired for the member), so the bytes stay recorded, as they were really
        consumed. A Fetch is not: the proxy answers it empty, as Kafka does.

        With the cluster guard on, the guard's sensor records first and its throttle counts as
        one more reason to answer empty; the larger throttle is the answer.
        """
        guard = self.guard
        if guard is None:
            return self._record_configured_fetch(broker, user, client_id, nbytes, now_ms, request_throttle_ms,
                                                 delivered=delivered)
        t = int(now_ms)
        sensor = guard.sensor("consumer_byte_rate", broker, user, client_id, t)
        guarded = guard.managers["consumer_byte_rate"].record(sensor, nbytes, t)
        throttle = self._record_configured_fetch(broker, user, client_id, nbytes, now_ms,
                                                 max(request_throttle_ms, guarded), delivered=delivered)
        unrecorded = (guarded > 0 or throttle > 0 or request_throttle_ms > 0) and not delivered \
            and not sensor.identity.dry_run
        if unrecorded:
            sensor.record(-nbytes, t)
        if self.sharing.records_guard:
            self.sharing.guard_recorded("consumer_byte_rate", sensor, 0.0 if unrecorded else nbytes)
        if guarded > 0:
            guarded = self._throttled("consumer_byte_rate", sensor, guarded)
        return guarded if guarded > throttle else throttle

    def _record_configured_fetch(
        self,
        broker: str,
        user: str,
        client_id: str,
        nbytes: int,
        now_ms: float,
        request_throttle_ms: int,
        *,
        delivered: bool,
    ) -> int:
        manager = self._fetch
        if not manager.enabled:
            return 0
        t = int(now_ms)
        sensor = manager.client_sensor(broker, user, client_id, t)
        throttle = self._record_bytes(manager, sensor, nbytes, t)
        if throttle <= 0 and request_throttle_ms <= 0:
            if self.sharing.records_usage:
                self.sharing.recorded("consumer_byte_rate", sensor, nbytes, t)
            return 0
        # Throttled: the broker answers empty and unrecords, unless the data is delivered anyway.
        if not delivered and not sensor.identity.dry_run:
            sensor.record(-nbytes, t)
        elif self.sharing.records_usage:
            self.sharing.recorded("consumer_byte_rate", sensor, nbytes, t)
        if throttle <= 0:
            return 0
        return self._throttled("consumer_byte_rate", sensor, throttle)

    def fetch_max_bytes_cap(self, broker: str, user: str, client_id: str, now_ms: float) -> int | None:
        """The largest response that is not throttled on an idle sensor (KafkaApis caps a
        fetch's MaxBytes with quotas.fetch.maxValueInQuotaWindow); None without a consumer quota.
        With the cluster guard on, the lower of that and the guard limit's window."""
        manager = self._fetch
        cap = None
        if manager.enabled:
            cap = manager.max_value_in_window(manager.sensor(broker, user, client_id, int(now_ms)))
        guard = self.guard
        if guard is None:
            return cap
        guarded = guard.max_value_in_window(broker, user, client_id, int(now_ms))
        return guarded if cap is None or (guarded is not None and guarded < cap) else cap

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
        manager = self._request
        # Without a request quota (the common case) that is the answer, before the exemptions.
        if not manager.enabled or exempt or api_key in EXEMPT_REQUEST_API_KEYS:
            return 0
        t = int(now_ms)
        sensor = manager.client_sensor(broker, user, client_id, t)
        percent, throttle = manager.record_time(sensor, request_ms, t)
        if self.sharing.records_usage:
            self.sharing.recorded("request_percentage", sensor, percent, t)
        if throttle <= 0:
            return 0
        return self._throttled("request_percentage", sensor, throttle)

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
        """Charge each topic's partitions, in request order: ControllerApis takes
        ControllerMutationQuotaManager.newQuotaFor, and the controller charges it topic by topic
        (ControllerRequestContext.applyPartitionChangeQuota)."""
        if api_key not in STRICT_MUTATION_SINCE:
            raise ValueError(f"API key {api_key} is not a controller mutation")
        manager = self._mutation
        if not manager.enabled:
            everything = [True] * len(topics)
            return MutationOutcome(everything, 0, list(everything))
        t = int(now_ms)
        sensor = manager.client_sensor(broker, user, client_id, t)
        strict = api_version >= STRICT_MUTATION_SINCE[api_key]
        verdicts, throttle, recorded = manager.charge(sensor, strict, topics, t)
        if recorded and self.sharing.records_usage:
            self.sharing.recorded("controller_mutation_rate", sensor, recorded, t)
        enforced = self._throttled("controller_mutation_rate", sensor, throttle) if throttle else 0
        dry_run = sensor.identity.dry_run
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
        sensor = ip_quotas.sensor(ip, limit, self.settings.dry_run, t)
        throttle = sensor.rate.record_and_throttle(1.0, t)
        if throttle <= 0:
            return 0
        if not sensor.identity.dry_run:
            sensor.record(-1.0, t)
        return self._throttled(CONNECTION_CREATION_RATE, sensor, min(throttle, ip_quotas.window_ms))

    # -- housekeeping and observability --------------------------------------------------------

    def _throttled(self, quota_type: str, sensor: QuotaSensor, throttle_ms: int) -> int:
        sensor.throttle_count += 1
        sensor.throttle_ms_total += throttle_ms
        enforced = not sensor.identity.dry_run
        if self.on_throttle is not None:
            self.on_throttle(quota_type, sensor.identity.tags, throttle_ms, enforced)
        return throttle_ms if enforced else 0

    def expire_idle(self, now_ms: float) -> int:
        """Drop sensors idle for longer than sensor_expiry_s (Sensor.hasExpired); their history
        is lost, as in Kafka. Returns how many were dropped."""
        expiry_ms = self._expiry_ms
        dropped = sum(manager.expire(int(now_ms), expiry_ms) for manager in self._managers.values())
        if self.guard is not None:
            dropped += self.guard.expire(int(now_ms), expiry_ms)
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
        the proxy can skip the work of preparing to record it. The cluster guard's byte rates count."""
        if self.guard is not None and quota_type in ("producer_byte_rate", "consumer_byte_rate"):
            return True
        return bool(self._managers[quota_type].enabled)

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
                yield sensor.snapshot(quota_type, t)
        for ip_sensor in list(self._ip.sensors.values()):
            yield ip_sensor.snapshot(CONNECTION_CREATION_RATE, t)

    def close(self) -> None:
        self.callback.close()
