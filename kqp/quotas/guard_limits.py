"""The cluster guard's limits inside the engine: a KIP-257 callback and two byte-rate managers.

The guard (kqp.quotas.guard) decides a limit per entity at its own granularity (client-id,
user, or both). The engine enforces it the way Kafka enforces a custom ClientQuotaCallback's
limit: a sensor per broker and entity, named by the tags `GuardLimitsCallback` gives, whose
bound is the limit `quota_limit` returns; a produce or fetch records into it beside the
client's own sensor and the exchange's throttle is the larger of the two (a throttle falls as
the limit rises, so on one series the larger throttle is the one of the lower limit: the
effective quota is the lower of the configured quota and the guard limit). Its sensors are
also what the guard measures: each entity's windowed rate per broker, as Kafka measures it.

Guard sensors are always per broker (each Kafka broker enforces its quota alone) and take
the guard's `dry_run`, whatever the quota entries say; the fleet's sharing does not scale them.
With `guard.fleet_wide`, the other instances' use of them is added to them (`record_remote`), so
that they measure the fleet's rate, as the fleet's quotas do (kqp.quotas.fleet).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol
from urllib.parse import unquote

from kqp.quotas.callbacks import CLIENT_ID_TAG, USER_TAG, ClusterMetadata, sanitize_user
from kqp.quotas.guard_control import DEFAULT_DAMPING_SPAN_S
from kqp.quotas.guard_inputs import MeasuredFlow
from kqp.quotas.managers import ClientQuotaManager, QuotaHost
from kqp.quotas.sensors import RateSensor, SensorIdentity
from kqp.quotas.settings import BYTE_RATE_TYPES, ByteRateType, QuotaEntity, QuotaType, Scope
from kqp.quotas.stats import INT_MAX, NO_QUOTA_BOUND, WindowedRate, token_bucket_throttle_time

GRANULARITIES = ("client-id", "user", "user,client-id")


class GuardHost(QuotaHost, Protocol):
    """What the guard's sensors read of the engine that holds them (kqp.quotas.engine's
    QuotaManagers): its settings and its configured managers. Named here as a Protocol so
    that this module, which the engine imports, does not import the engine back."""

    def manager(self, quota_type: QuotaType) -> ClientQuotaManager[Any]: ...


class GuardLimitsCallback:
    """A ClientQuotaCallback whose tags are the guard's entities and whose limits are the guard's."""

    def __init__(self, granularity: str) -> None:
        if granularity not in GRANULARITIES:
            raise ValueError(f"guard granularity {granularity!r}: expected one of {', '.join(GRANULARITIES)}")
        self.granularity = granularity
        self.limits: dict[tuple[QuotaType, QuotaEntity], float] = {}

    def quota_metric_tags(self, quota_type: QuotaType, user: str, client_id: str) -> Mapping[str, str]:
        if self.granularity == "client-id":
            return {USER_TAG: "", CLIENT_ID_TAG: client_id}
        if self.granularity == "user":
            return {USER_TAG: sanitize_user(user), CLIENT_ID_TAG: ""}
        return {USER_TAG: sanitize_user(user), CLIENT_ID_TAG: client_id}

    def entity(self, tags: Mapping[str, str]) -> QuotaEntity:
        """The guard entity a sensor with these tags meters."""
        if self.granularity == "client-id":
            return QuotaEntity(client_id=tags.get(CLIENT_ID_TAG, ""))
        user = unquote(tags.get(USER_TAG, ""))
        if self.granularity == "user":
            return QuotaEntity(user=user)
        return QuotaEntity(user=user, client_id=tags.get(CLIENT_ID_TAG, ""))

    def quota_limit(self, quota_type: QuotaType, tags: Mapping[str, str]) -> float | None:
        return self.limits.get((quota_type, self.entity(tags)))

    def update_quota(self, quota_type: QuotaType, entity: QuotaEntity, value: float) -> None:
        return  # the quota entries go to the engine's own callback, never here

    def remove_quota(self, quota_type: QuotaType, entity: QuotaEntity) -> None:
        return

    def quota_reset_required(self, quota_type: QuotaType) -> bool:
        return False  # GuardQuotas.set_limits refreshes the sensors itself

    def update_cluster_metadata(self, metadata: ClusterMetadata) -> bool:
        return False

    def close(self) -> None:
        return


# Spreading held-back clients' admissions (GuardQuotas.spread_admissions): only clients whose
# request is at least this many seconds of their guard limit (a request is then over 1/11 of
# their share of a quota window, and a window's load moves by whole requests), ...
SPREAD_MIN_PERIOD_S = 1.0
# ... spread among those whose periods (request / limit) are within this ratio of each other
# (the same limit and the same request size: the clients that lock in phase; clients of other
# periods drift through each other instead, and holding them apart would cost the faster one
# its difference at every pass) ...
SAME_PERIOD = 1.05
# ... when one's admission comes less than this share of the even spacing (period / n) from
# another's; the one due later is then delayed to the even spacing after the other.
SPREAD_TOLERANCE = 0.75
# Another instance's client (guard.fleet_wide) is known by its last throttled request in that
# instance's report, which comes a report interval (0.05 s by default, longer where the topic's
# round trip is: kqp.quotas.fleet.ReportPacer) and the topic's round trip after the request at
# most; the instances' limits for it differ by a few per cent of its period
# besides. Its admission is taken as early as that allows: this much before the report's time +
# request / limit. Two instances then see each other's clients early, never late, and where
# they disagree on which of a pair is due first both move it rather than neither (GuardQuotas.
# spread_admissions); a pair that neither moved would stay together for as long as it runs.
REMOTE_REPORT_DELAY_S = 0.2
# Of two clients due within this many seconds of each other, one of them another instance's,
# which is due first is not known alike on both instances: the one whose entity sorts later by
# name yields. More than what the estimate may be off by (REMOTE_REPORT_DELAY_S and the limits'
# difference), so that two started together never both move.
REMOTE_UNCERTAINTY_S = 0.3
# A client of another instance is counted as due until this long after its estimated admission
# (its next request is on its way through the exchange), no longer: it stopped.
REMOTE_ADMISSION_GRACE_S = 0.5

# The resolution of a guard sensor's count of its recent bytes (GuardRate.recent_total).
RECENT_SLOT_MS = 100


class GuardRate(WindowedRate):
    """A guard sensor's stat: Kafka's windowed Rate measures, a token bucket throttles.

    The window is what the guard measures (each entity's rate as Kafka's quota would see it,
    kqp.quotas.guard_limits.GuardQuotas.measured). The throttle is KIP-599's TokenBucket's
    (stats.token_bucket_throttle_time: a deficit D mutes for D / limit), refilled at the guard
    limit up to Kafka's burst (samples x window x limit). Why not the window's throttle: a
    backlogged client whose requests are a large part of its limit (librdkafka's 1 MB batches
    against a 450 kB/s share) is muted by the window's formula until old samples leave it, and
    then sends again at once, so each request's place in the window echoes a window later: with
    a constant limit of 440 kB/s one such client put 3 to 7 requests into successive 11 s
    windows, and two of them held a broker's 11 s load between 0.71x and 1.16x of its limit
    (docs/quotas.md, "Why the guard throttles with a token bucket"). The bucket mutes each
    request for its own size over the limit, so the client sends one request every
    request / limit seconds, whatever came before.

    The bucket starts when a limit first applies, at the room the window had left under it
    (limit x window size - bytes in the window, negative if over): the flow is throttled for
    its excess at once, as the window would have. It is dropped when the limit goes.
    """

    __slots__ = ("_slot_bytes", "_slot_numbers", "last_request", "remote_request", "remote_request_at_ms",
                 "request_at_ms", "tokens", "tokens_at_ms")

    def __init__(self, samples: int, window_ms: int, bound: float = NO_QUOTA_BOUND) -> None:
        super().__init__(samples, window_ms, bound)
        self.tokens: float | None = None  # None: no guard limit, nothing to throttle with
        self.tokens_at_ms = 0
        self.last_request = 0.0  # the size of the last request this instance throttled on (not the fleet's reports)
        self.request_at_ms = 0  # ... and when
        # The last request another instance reported it throttled on (guard.fleet_wide), and when the report came.
        self.remote_request = 0.0
        self.remote_request_at_ms = 0
        # What was recorded in each RECENT_SLOT_MS of the last quota window (and one slot more),
        # by slot number (time // RECENT_SLOT_MS): `recent_total`'s exact count.
        slots = samples * window_ms // RECENT_SLOT_MS + 2
        self._slot_bytes = [0.0] * slots
        self._slot_numbers = [-1] * slots

    def _refill(self, now_ms: int) -> float | None:
        bound = self.bound
        if bound == NO_QUOTA_BOUND:
            self.tokens = None
            return None
        tokens = self.tokens
        if tokens is None:
            tokens = bound * (self.window_size(now_ms) / 1000.0) - self.total(now_ms)
        else:
            burst = self.samples * (self.window_ms / 1000.0) * bound
            tokens = min(burst, tokens + bound * ((now_ms - self.tokens_at_ms) / 1000.0))
        self.tokens = tokens
        self.tokens_at_ms = now_ms
        return tokens

    def record(self, value: float, now_ms: int) -> None:
        tokens = self._refill(now_ms)
        super().record(value, now_ms)
        if tokens is not None:
            self.tokens = tokens - value
        number = now_ms // RECENT_SLOT_MS
        index = number % len(self._slot_numbers)
        if self._slot_numbers[index] != number:
            self._slot_numbers[index] = number
            self._slot_bytes[index] = 0.0
        self._slot_bytes[index] += value

    def recent_total(self, now_ms: int, span_ms: int) -> float:
        """The bytes recorded over the last `span_ms` (at most the quota window), counted in slots of
        RECENT_SLOT_MS, the one that straddles the span's start prorated: the load the guard's
        feedback closes on. The window's samples cannot give it exactly: a sample starts at its
        first record and spans a second, and prorating the one the span cuts over its events' time
        read a throttled client's bursts 1 % high or low at a step (0.3 % low on average in the
        closed-loop test, which left the load that much over the limit)."""
        cut = now_ms - span_ms
        total = 0.0
        for number, value in zip(self._slot_numbers, self._slot_bytes, strict=True):
            start = number * RECENT_SLOT_MS
            if number < 0 or start > now_ms:
                continue
            if start >= cut:
                total += value
            elif start + RECENT_SLOT_MS > cut:
                total += value * (start + RECENT_SLOT_MS - cut) / RECENT_SLOT_MS
        return total

    def record_and_throttle(self, value: float, now_ms: int) -> int:
        self.record(value, now_ms)
        self.last_request = value
        self.request_at_ms = now_ms
        tokens = self.tokens
        if tokens is None or tokens >= 0:
            return 0
        return token_bucket_throttle_time(tokens, self.bound)


    def admission_in_s(self, now_ms: int) -> float | None:
        """Seconds until the bucket is back at zero, when a muted backlogged client sends its next
        request (the mute of its last request ends then); None without a deficit (no limit, or
        under it: the client sends when it has something to send)."""
        tokens, bound = self.tokens, self.bound
        if tokens is None or bound == NO_QUOTA_BOUND or bound <= 0:
            return None
        burst = self.samples * (self.window_ms / 1000.0) * bound
        now = min(burst, tokens + bound * ((now_ms - self.tokens_at_ms) / 1000.0))
        return -now / bound if now < 0 else None

    def remote_admission_in_s(self, now_ms: int) -> float | None:
        """For a client another instance forwards (its last throttled request came in a report,
        after any of this instance's own): seconds until that instance's bucket is back at zero,
        estimated as a backlogged client's, whose request left its bucket that request in
        deficit, as early as the report's delay allows: the report's time - REMOTE_REPORT_DELAY_S
        + request / limit. Blind to a delay the other instance gave it, until its next request
        reports its new phase. None: no such request, no limit, or due more than
        REMOTE_ADMISSION_GRACE_S ago (it stopped)."""
        bound = self.bound
        local_since = self.last_request > 0 and self.request_at_ms >= self.remote_request_at_ms
        if self.remote_request <= 0 or local_since or bound == NO_QUOTA_BOUND or bound <= 0:
            return None
        waiting = (self.remote_request_at_ms - now_ms) / 1000.0 - REMOTE_REPORT_DELAY_S + self.remote_request / bound
        return waiting if waiting > -REMOTE_ADMISSION_GRACE_S else None

    def delay_admission(self, seconds: float) -> None:
        """Move the client's next admission `seconds` later: its bucket owes that much more (the
        mute in force is not lengthened; the next request's is)."""
        if self.tokens is not None and self.bound != NO_QUOTA_BOUND:
            self.tokens -= seconds * self.bound


class GuardSensor(RateSensor):
    """A guard sensor: a RateSensor whose stat is a GuardRate."""

    __slots__ = ()

    def __init__(self, samples: int, window_ms: int, bound: float, now_ms: int, identity: SensorIdentity) -> None:
        super().__init__(samples, window_ms, bound, now_ms, identity)
        self.rate = GuardRate(samples, window_ms, bound)


class GuardQuotaManager(ClientQuotaManager[RateSensor]):
    """ClientQuotaManager for the guard's sensors: scope broker, the guard's dry run, no fleet scaling."""

    __slots__ = ("dry_run",)

    def __init__(self, engine: GuardHost, quota_type: QuotaType, callback: GuardLimitsCallback,
                 dry_run: bool) -> None:
        super().__init__(engine, quota_type, callback, GuardSensor)
        self.dry_run = dry_run

    def entry_policy(self, tags: Mapping[str, str]) -> tuple[Scope, bool]:
        return "broker", self.dry_run

    def limit_for(self, tags: Mapping[str, str]) -> float:
        limit = self.callback.quota_limit(self.quota_type, tags)
        return NO_QUOTA_BOUND if limit is None else float(limit)


class GuardQuotas:
    """The guard's produce and fetch managers, its callback, and what it measures."""

    def __init__(self, engine: GuardHost, granularity: str, dry_run: bool) -> None:
        self.engine = engine
        self.callback = GuardLimitsCallback(granularity)
        self.managers: dict[ByteRateType, GuardQuotaManager] = {
            quota_type: GuardQuotaManager(engine, quota_type, self.callback, dry_run) for quota_type in BYTE_RATE_TYPES
        }
        for manager in self.managers.values():
            manager.refresh_enabled()
        # Per sensor, the throttle count seen at the last measurement; per flow, when a throttle was
        # last seen (ms): what tells the guard a flow wants more than its limit.
        self._throttle_counts: dict[RateSensor, int] = {}
        self._throttled_at: dict[tuple[QuotaEntity, ByteRateType, int | None], int] = {}
        self.configure()

    @property
    def granularity(self) -> str:
        return self.callback.granularity

    @property
    def dry_run(self) -> bool:
        return self.managers["producer_byte_rate"].dry_run

    def configure(self, dry_run: bool | None = None) -> None:
        """Take the engine's quota windows (and a new dry run); keeps every sensor when nothing changed."""
        settings = self.engine.settings
        for manager in self.managers.values():
            manager.configure(settings.window_num, settings.window_size_s * 1000)
            if dry_run is not None and dry_run != manager.dry_run:
                manager.dry_run = dry_run
                manager.refresh_limits()

    def set_limits(self, limits: Mapping[tuple[QuotaEntity, ByteRateType], float]) -> None:
        """The guard limits in force from now on (bytes/s per broker); every sensor takes its new bound."""
        new: dict[tuple[QuotaType, QuotaEntity], float] = {
            (quota_type, entity): float(value) for (entity, quota_type), value in limits.items()
        }
        if new == self.callback.limits:
            return
        self.callback.limits = new
        for manager in self.managers.values():
            manager.refresh_limits()

    def sensor(self, quota_type: ByteRateType, broker: str, user: str, client_id: str, now_ms: int) -> RateSensor:
        return self.managers[quota_type].client_sensor(broker, user, client_id, now_ms)

    def max_value_in_window(self, broker: str, user: str, client_id: str, now_ms: int) -> int | None:
        manager = self.managers["consumer_byte_rate"]
        sensor = manager.sensor(broker, user, client_id, now_ms)
        if sensor.bound == NO_QUOTA_BOUND:
            return None
        cap = sensor.bound * (manager.samples - 1) * (manager.window_ms // 1000)
        return int(cap) if cap < INT_MAX else INT_MAX

    def record_remote(self, quota_type: ByteRateType, broker: str | None, tags: Mapping[str, str], amount: float,
                      throttles: int, now_ms: int) -> None:
        """Another instance's use of one guard sensor (guard.fleet_wide: kqp.quotas.fleet.GuardDelta): its
        bytes go into this instance's sensor for the same entity and broker, so that every instance
        measures, and throttles on, the fleet's rate; its throttles mark the flow held back here too,
        so that every instance's step sees the same flows held back and computes the same limits."""
        sensor = self.managers[quota_type].sensor_for_tags(broker, tags, now_ms)
        if amount:
            sensor.record(amount, now_ms)
        sensor.last_record_ms = now_ms
        if throttles > 0:
            node = int(broker) if broker is not None and broker.isdigit() else None
            self._throttled_at[(self.callback.entity(tags), quota_type, node)] = now_ms
            rate = sensor.rate
            if amount > 0 and isinstance(rate, GuardRate):
                # Its phase, for spreading held-back clients across the fleet (spread_admissions): a report
                # interval holds at most one large request of a held-back client, and each is throttled.
                rate.remote_request = amount / throttles
                rate.remote_request_at_ms = now_ms

    def spread_admissions(self, now_ms: int) -> int:
        """Spread the admissions of backlogged clients held back on one broker whose requests are
        large against their limits; returns how many of this instance's were delayed.

        The token bucket sends each such client one request every request / limit seconds, so
        two with the same limit and request size (two library-default producers given the same
        share) keep the phase they started in, and started together they send together: each
        quota window then holds a whole number of requests from each, and the two run over or
        under together (with 1 MB requests against two 450 kB/s shares, 8 or 10 of them per
        11 s window, 0.85x or 1.00x of the broker's limit on the wire, where evenly spaced they
        give 9 or 10). Here each group of clients of about one period on a broker, with when
        their buckets are next back at zero, is held at least SPREAD_TOLERANCE x period / n
        apart: of two that come closer, the one due later is delayed to period / n after the
        other. A delay costs that client its length x its limit once (about half a request when
        two start together); spaced evenly, nothing moves them.

        Across a fleet (guard.fleet_wide) the group also holds the clients other instances
        forward, known by their last throttled request in the exchange (GuardRate.
        remote_admission_in_s), and each instance delays only the clients it forwards. Of two
        due within REMOTE_UNCERTAINTY_S of each other the one whose entity sorts later by name
        yields (`_yields`), so that two instances that see the pair a report apart agree on
        which of the two moves."""
        delayed = 0
        for manager in self.managers.values():
            groups: dict[str | None, list[_Admission]] = {}
            for sensor in manager.sensors.values():
                rate = sensor.rate
                if not isinstance(rate, GuardRate):
                    continue
                admission = _admission(sensor, rate, now_ms)
                if admission is not None and admission.period >= SPREAD_MIN_PERIOD_S:
                    groups.setdefault(sensor.identity.broker, []).append(admission)
            for members in groups.values():
                for same in _same_period(members):
                    delayed += _spread(same)
        return delayed

    def expire(self, now_ms: int, expiry_ms: float) -> int:
        return sum(manager.expire(now_ms, expiry_ms) for manager in self.managers.values())

    def measured(self, now_ms: int, recent: bool = True) -> list[MeasuredFlow]:
        """Each entity's windowed rate per broker (bytes/s), read without purging, with the
        configured quota that applies to it (the highest bound among its clients' own sensors)
        and whether its guard limit throttled it within the last quota window. `recent`: also
        what each put on each broker over the last DEFAULT_DAMPING_SPAN_S, which only the
        damping reads (off by default: a count over every slot of every sensor saved)."""
        configured = self._configured_bounds()
        rates: dict[tuple[QuotaEntity, ByteRateType], dict[int, float]] = {}
        carried: dict[tuple[QuotaEntity, ByteRateType], dict[int, float]] = {}
        lately_by_key: dict[tuple[QuotaEntity, ByteRateType], dict[int, float]] = {}
        recent_ms = int(DEFAULT_DAMPING_SPAN_S * 1000)
        counts: dict[RateSensor, int] = {}
        window_s = self.engine.settings.window_num * self.engine.settings.window_size_s
        window_ms = window_s * 1000
        for quota_type, manager in self.managers.items():
            for sensor in list(manager.sensors.values()):
                key = (self.callback.entity(sensor.identity.tags), quota_type)
                broker = sensor.identity.broker
                node = int(broker) if broker is not None and broker.isdigit() else None
                counts[sensor] = sensor.throttle_count
                if sensor.throttle_count > self._throttle_counts.get(sensor, 0):
                    self._throttled_at[(*key, node)] = now_ms
                if broker is None or not broker.isdigit():
                    continue  # `bootstrap`: before the proxy knew the node; not a broker to judge
                per_broker = rates.setdefault(key, {})
                per_broker[int(broker)] = per_broker.get(int(broker), 0.0) + sensor.rate.peek(now_ms)
                over_window = carried.setdefault(key, {})
                over_window[int(broker)] = (over_window.get(int(broker), 0.0)
                                            + sensor.rate.recent_total(now_ms, window_ms) / window_s)
                if recent:
                    lately = lately_by_key.setdefault(key, {})
                    lately[int(broker)] = (lately.get(int(broker), 0.0)
                                           + sensor.rate.recent_total(now_ms, recent_ms) / DEFAULT_DAMPING_SPAN_S)
        self._throttle_counts = counts  # live sensors only: an expired one is forgotten here
        self._throttled_at = {key: at for key, at in self._throttled_at.items() if now_ms - at <= window_ms}
        throttled_on: dict[tuple[QuotaEntity, ByteRateType], set[int | None]] = {}
        for entity, quota_type, node in self._throttled_at:
            throttled_on.setdefault((entity, quota_type), set()).add(node)
        return [
            MeasuredFlow(entity, quota_type, per_broker, configured.get((entity, quota_type)),
                         throttled=(entity, quota_type) in throttled_on,
                         carried=carried.get((entity, quota_type)),
                         recent=lately_by_key.get((entity, quota_type)),
                         throttled_brokers=frozenset(
                             node for node in throttled_on.get((entity, quota_type), ()) if node is not None))
            for (entity, quota_type), per_broker in rates.items()
        ]

    def _configured_bounds(self) -> dict[tuple[QuotaEntity, ByteRateType], float]:
        bounds: dict[tuple[QuotaEntity, ByteRateType], float] = {}
        for quota_type in BYTE_RATE_TYPES:
            manager = self.engine.manager(quota_type)
            if not manager.enabled:
                continue
            for sensor in _client_sensors(manager):
                if sensor.bound == NO_QUOTA_BOUND:
                    continue
                key = (self.callback.entity(self.callback.quota_metric_tags(
                    quota_type, unquote(sensor.identity.user), sensor.identity.client_id)), quota_type)
                bounds[key] = max(bounds.get(key, 0.0), sensor.bound)
        return bounds


class _Admission:
    """One held-back client's next admission on one broker, as spread_admissions judges it."""

    __slots__ = ("local", "name", "period", "rate", "waiting")

    def __init__(self, name: tuple[tuple[str, str], ...], period: float, waiting: float, rate: GuardRate,
                 local: bool) -> None:
        self.name = name  # the sensor's tags: the same on every instance of a fleet
        self.period = period  # request / limit: seconds between its requests
        self.waiting = waiting  # seconds until its bucket is back at zero
        self.rate = rate
        self.local = local  # forwarded by this instance (only those are moved here)


def _admission(sensor: RateSensor, rate: GuardRate, now_ms: int) -> _Admission | None:
    """The sensor's client as a member of a spreading group: backlogged and held back by its guard
    limit, through this instance (its bucket) or another (its last reported request); else None."""
    name = tuple(sorted(sensor.identity.tags.items()))
    remote = rate.remote_admission_in_s(now_ms)
    if remote is not None:
        return _Admission(name, rate.remote_request / rate.bound, remote, rate, False)
    waiting = rate.admission_in_s(now_ms) if rate.last_request > 0 else None
    if waiting is None:
        return None
    return _Admission(name, rate.last_request / rate.bound, waiting, rate, True)


def _same_period(members: list[_Admission]) -> Iterator[list[_Admission]]:
    """The members in groups of about one period (each within SAME_PERIOD of its group's shortest)."""
    group: list[_Admission] = []
    for member in sorted(members, key=lambda m: m.period):
        if group and member.period > group[0].period * SAME_PERIOD:
            yield group
            group = []
        group.append(member)
    if group:
        yield group


def _spread(group: list[_Admission]) -> int:
    """Delay this instance's members of one group that are due too close after another member
    (`_yields`), to period / n after the latest of those; returns how many were delayed. In order
    of admission, so that each settles against members that are due before it."""
    if len(group) < 2:
        return 0
    period = sum(member.period for member in group) / len(group)
    even = period / len(group)
    close = SPREAD_TOLERANCE * even
    order = sorted(group, key=lambda m: (m.waiting, m.name))
    times = [member.waiting for member in order]
    delayed = 0
    for index, member in enumerate(order):
        if not member.local:
            continue  # the instance that forwards it moves it, if it must
        delay = 0.0
        for _ in range(len(order)):  # each pass moves it past one more: at most once past each
            # Where each other member is due relative to this one, on the circle of one period.
            offsets = [(other, _circular(times[other] - times[index], period))
                       for other in range(len(order)) if other != index]
            near = [offset for other, offset in offsets
                    if abs(offset) < close and _yields(member, order[other], offset)]
            if not near:
                break
            shift = max(near) + even
            times[index] += shift
            delay += shift
        if delay > 0:
            member.rate.delay_admission(delay)
            delayed += 1
    return delayed


def _yields(member: _Admission, other: _Admission, offset: float) -> bool:
    """Whether `member` gives way to `other`, due `offset` seconds after it (before: negative):
    the later of the two yields, as it moves least (period / n less their distance); the later
    name when their times are within what is known of them (exact here, REMOTE_UNCERTAINTY_S
    apart for another instance's), so that two instances that each see the other's client a
    report late agree on which of the two moves (by time both could take their own for the
    later one, move both, and be together again)."""
    uncertain = 0.0 if member.local and other.local else REMOTE_UNCERTAINTY_S
    if abs(offset) <= uncertain:
        return member.name > other.name
    return offset < 0


def _circular(offset: float, period: float) -> float:
    """`offset` seconds on a circle of `period`: within [-period / 2, period / 2)."""
    return (offset + period / 2) % period - period / 2


def _client_sensors(manager: ClientQuotaManager[RateSensor]) -> Iterator[RateSensor]:
    yield from list(manager.sensors.values())
