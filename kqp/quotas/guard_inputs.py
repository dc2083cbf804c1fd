"""What the cluster guard's control step (kqp.quotas.guard) takes in: its settings and each
entity's measured rate.

Kept apart from the step because the step runs numpy and these records do not: the
configuration (kqp.config builds `GuardSettings`) and the engine's guard sensors
(kqp.quotas.guard_limits measure `MeasuredFlow`s) name them whether or not the guard runs, and
`kqp serve` with the guard off must not load numpy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kqp.quotas.capacity import Resource
from kqp.quotas.guard_control import TrimGains
from kqp.quotas.settings import ByteRateType, QuotaEntity

FlowKey = tuple[QuotaEntity, ByteRateType]

# Defaults, each a documented setting of the `guard` section (docs/configuration.md).
DEFAULT_RELEASE_MARGIN = 0.1
DEFAULT_RAISE_PER_S = 0.05
DEFAULT_FALL_PER_S = 0.1
# A flow whose measured rate is at least this share of its guard limit is held back by it.
# Under 1 because the windowed rate of a throttled client sits just under its quota.
DEFAULT_SATURATION = 0.95
# Kafka's default quota window (quota.window.num 11 x quota.window.size.seconds 1): the proxy
# sets the engine's own.
DEFAULT_RELEASE_AFTER_S = 11.0


@dataclass(frozen=True)
class GuardSettings:
    """What the control step needs from the `guard` section (kqp.config builds it).

    Attributes:
        limits: capacity x threshold per (broker, NW_IN | NW_OUT), bytes/s. A broker not
            listed is not guarded.
        replication_factor: models follower traffic, as analyze (capped at the broker count).
        weights: an entity's share of a binding resource relative to the others (default 1).
        protected: entities never limited.
        floor: no guard limit below this many bytes/s.
        release_margin: a resource releases at load <= limit x (1 - release_margin).
        raise_per_s: a guard limit rises by at most this share of itself per second.
        fall_per_s: a guard limit falls by at most this share of itself per second (a new
            one from the flow's rate); 0: at once.
        saturation: a flow at >= this share of its guard limit is held back by it.
        release_after_s: while clients on an engaged resource are held back, it releases only
            once its load has stayed at or under its release level this long (the quota window).
        trim: how the feedback on the carried load moves (kqp.quotas.guard_control).
        feedback: close the loop on the carried load (the trim). Off in dry run: the limits are
            not enforced, so the load does not answer them and the trim would only wind up.
    """

    limits: Mapping[Resource, float]
    replication_factor: int = 1
    weights: Mapping[QuotaEntity, float] = field(default_factory=dict)
    protected: frozenset[QuotaEntity] = frozenset()
    floor: float = 0.0
    release_margin: float = DEFAULT_RELEASE_MARGIN
    raise_per_s: float = DEFAULT_RAISE_PER_S
    saturation: float = DEFAULT_SATURATION
    release_after_s: float = DEFAULT_RELEASE_AFTER_S
    fall_per_s: float = DEFAULT_FALL_PER_S
    trim: TrimGains = field(default_factory=TrimGains)
    feedback: bool = True

    @property
    def brokers(self) -> tuple[int, ...]:
        return tuple(sorted({broker for broker, _ in self.limits}))


@dataclass(frozen=True)
class MeasuredFlow:
    """One entity's produce or fetch rate, as Kafka measures it (the windowed rate), per broker.

    `configured_quota` is the quota the entity already has from the quota entries (per broker,
    bytes/s), None without one: the guard never gives a limit at or above it. `throttled`: its
    guard limit throttled it within the last quota window (dry run: would have), the sign that
    it wants more than its limit. `carried`: per broker, the bytes recorded over the last quota
    window divided by the window's length (None: as `rates`): what the flow put on the broker,
    which the guard's feedback closes on. Kafka's rate divides by the time since the oldest
    sample's start, which for a client sending a large request every few seconds counts the
    first request's bytes over less than their span and reads up to a request high.
    `throttled_brokers`: the brokers on which its guard limit throttled it within the window.
    `recent`: per broker, the bytes recorded over the last DEFAULT_DAMPING_SPAN_S divided by that
    span (None: as `carried`), what the guard's damping compares with `carried`.
    """

    entity: QuotaEntity
    quota_type: ByteRateType
    rates: Mapping[int, float]
    configured_quota: float | None = None
    throttled: bool = False
    carried: Mapping[int, float] | None = None
    throttled_brokers: frozenset[int] = frozenset()
    recent: Mapping[int, float] | None = None

    @property
    def key(self) -> FlowKey:
        return (self.entity, self.quota_type)

    @property
    def peak(self) -> float:
        return max(self.rates.values(), default=0.0)
