"""Max-min fair byte-rate quotas that keep every broker resource under its limit.

Pure Python and numpy: no IO, no clock. Two callers share this one copy: `kqp replay advise`
(kqp/spark_jobs/advice_math.py) hands it per-second demand series aggregated from a capture,
and the cluster guard (kqp/quotas/guard.py) hands it each entity's measured rate, one bucket
per control interval.

The model (docs/replay.md, "advise"):

* A *flow* is one entity's produce or fetch traffic: its bytes/s per broker and bucket
  (the demand). A quota q on it lets at most q through per bucket: per broker with scope
  `broker` (Kafka's way: every broker enforces the quota on its own), or in total over the
  brokers with scope `cluster` (the flow's brokers then keep their shares of it).
* A *resource* is one broker's NW_IN or NW_OUT, as `analyze` computes it: client request
  bytes (NW_IN) or response bytes (NW_OUT), plus modelled replication: every byte produced to
  a leader is fetched by RF-1 followers (its NW_OUT) spread evenly over the other brokers
  (their NW_IN). Traffic that no byte-rate quota charges (Metadata, offsets, ...) is the
  resource's *background*.
* The load judged is a statistic (default p99) of the resource's series, against its limit
  (capacity x threshold): exactly analyze's headroom rule, applied to the series as the quotas
  would shape it.
* A quota sees the flow's rate as Kafka measures it, the mean over the quota window
  (quota.window.num x quota.window.size.seconds) ending at each bucket. Where that rate is
  above the quota, the bucket is scaled down by quota / rate (the client is throttled in
  proportion); bursts shorter than the window pass, as they do through Kafka.

Fairness is max-min, by progressive filling (water-filling with several resources): every
flow not yet fixed gets quota `max(floor, weight x L)`, and the level L rises until some
resource reaches its limit. The flows through that resource whose demand is still above
their quota are fixed there (that resource is their *binding* one); the rest keep rising
until the next resource binds or they are below their fair share, in which case they stay
unlimited. A flow whose demand never exceeds the floor is never limited, and a protected
flow never is.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

# The names this model speaks of, defined below it (numpy-free, so the engine and the
# configuration can name them without loading numpy) and re-exported for its callers.
from kqp.quotas.capacity import NETWORK_RESOURCES as NETWORK_RESOURCES
from kqp.quotas.capacity import NW_IN as NW_IN
from kqp.quotas.capacity import NW_OUT as NW_OUT
from kqp.quotas.capacity import Resource as Resource
from kqp.quotas.settings import BYTE_RATE_TYPES as BYTE_RATE_TYPES
from kqp.quotas.settings import FETCH as FETCH
from kqp.quotas.settings import PRODUCE as PRODUCE
from kqp.quotas.settings import ByteRateType as ByteRateType
from kqp.quotas.settings import QuotaEntity, Scope, entity_text

# Statistics of a series, as analyze names them (exact, linear interpolation like Spark's `percentile`).
STAT_PERCENTILES = {"p50": 50.0, "p95": 95.0, "p99": 99.0, "p99_9": 99.9}
STATS = (*STAT_PERCENTILES, "max")
# Relative slack when comparing a load with its limit, so that floating-point sums do not flap.
_TOLERANCE = 1e-9
# Bisection steps per level search; each halves the bracket, so 100 is far past float resolution
# (the loop stops earlier, once the bracket is within 1e-9 relative).
_SEARCH_STEPS = 100


def statistic(series: np.ndarray, stat: str) -> float:
    """`stat` (p50, p95, p99, p99_9 or max) of a series; 0 for an empty one."""
    if series.size == 0:
        return 0.0
    if stat == "max":
        return float(series.max())
    return float(np.percentile(series, STAT_PERCENTILES[stat]))


def trailing_mean(series: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last `window` buckets along the last axis (fewer at the start), as Kafka's
    windowed rate: the sum of the samples kept over the time they span."""
    if window <= 1 or series.shape[-1] == 0:
        return series.astype(np.float64)
    # Prefix sums make every window sum one subtraction, O(buckets) instead of O(buckets x window).
    # The first buckets average over the buckets seen so far. Kafka's Rate differs there: it pads a
    # young sensor's elapsed time to (samples - 1) windows. Only the capture's first window is affected.
    cumulative = np.cumsum(series, axis=-1, dtype=np.float64)
    shifted = np.zeros_like(cumulative)
    shifted[..., window:] = cumulative[..., :-window]
    spans = np.minimum(np.arange(1, series.shape[-1] + 1), window)
    mean: np.ndarray = (cumulative - shifted) / spans
    return mean


def replication_shares(replication_factor: int, brokers: int) -> tuple[int, float]:
    """(followers per partition, share of another broker's produce each broker replicates in).

    As analyze models replication (capacity.replication_load): RF capped at the broker count,
    followers spread evenly over the other brokers.
    """
    # A topic cannot have more replicas than brokers, so RF is capped before taking the leader off.
    followers = max(0, min(replication_factor, brokers) - 1)
    spread = followers / (brokers - 1) if brokers > 1 and followers > 0 else 0.0
    return followers, spread


@dataclass(frozen=True)
class Flow:
    """One entity's produce or fetch demand.

    Attributes:
        entity: the quota entity (at the granularity asked for).
        quota_type: producer_byte_rate (Produce bytes, NW_IN) or consumer_byte_rate (Fetch, NW_OUT).
        demand: bytes/s, shape (brokers, buckets), brokers in the order of Problem.brokers.
        weight: its share of a binding resource relative to the others (--weight).
        protected: never limited (--protect).
    """

    entity: QuotaEntity
    quota_type: ByteRateType
    demand: np.ndarray
    weight: float = 1.0
    protected: bool = False


@dataclass(frozen=True)
class Problem:
    """Everything the water-filling needs.

    Attributes:
        brokers: broker ids, the row order of every demand matrix.
        limits: capacity x threshold per (broker, NW_IN|NW_OUT), bytes/s.
        background: per resource, the load no byte-rate quota charges, shape (buckets,).
        flows: the entities' demand.
        replication_factor: as analyze (capped at the broker count).
        scope: "broker" (each broker enforces the quota) or "cluster" (one budget over brokers).
        stat: the statistic of a resource's series judged against its limit.
        floor: no quota below this many bytes/s.
        window_buckets: the quota window (Kafka's quota.window.num x quota.window.size.seconds)
            in buckets: the rate a quota is compared with is the mean over that many buckets.
        burst_factor: how far above its quota a throttled flow can go within one bucket. Kafka
            throttles after the fact, over the whole window: a client held back sends again once
            the window's mean has fallen to the quota, and can then put up to the window's
            allowance (quota x window) into one bucket before it is held back again. With
            buckets shorter than the window that is quota x window / bucket (advise sets it to
            max(1, window seconds / bucket seconds)); 1 keeps a throttled bucket at the quota.
    """

    brokers: tuple[int, ...]
    limits: Mapping[Resource, float]
    background: Mapping[Resource, np.ndarray]
    flows: Sequence[Flow]
    replication_factor: int = 1
    scope: Scope = "broker"
    stat: str = "p99"
    floor: float = 0.0
    window_buckets: int = 1
    burst_factor: float = 1.0

    @property
    # Every series in a Problem has the same length; the background is there even without flows.
    def buckets(self) -> int:
        for series in self.background.values():
            return int(series.shape[0])
        return int(self.flows[0].demand.shape[1]) if self.flows else 0


@dataclass(frozen=True)
class FlowAdvice:
    """The quota proposed for one flow, and why.

    `demand_peak` is the highest rate the quota would see (the mean over its window, per
    broker or over the cluster as the scope says): a quota at or above it never throttles the
    flow. `demand_stat` is the statistic (Problem.stat) of that same rate, per bucket (its
    busiest broker with scope broker), so it never exceeds `demand_peak`. `quota` is None when
    the flow is left unlimited. `fair_share` is weight x the level at which its binding resource
    filled; `reason` is one of: protected, under its floor, under its fair share, fair share of
    <resource>, floor (the fair share would be below the floor).
    """

    entity: QuotaEntity
    quota_type: ByteRateType
    weight: float
    protected: bool
    demand_peak: float
    demand_stat: float
    quota: float | None
    fair_share: float | None
    binding: Resource | None
    reason: str

    @property
    def limited(self) -> bool:
        return self.quota is not None


@dataclass(frozen=True)
class ResourceLoad:
    """A resource's limit and its load (the statistic) before and after the quotas, as modelled."""

    broker: int
    resource: str
    limit: float
    before: float
    after: float
    background: float
    protected: float

    @property
    def fits(self) -> bool:
        return self.after <= self.limit * (1 + _TOLERANCE) + 1e-6


@dataclass(frozen=True)
class Advice:
    flows: list[FlowAdvice]
    loads: list[ResourceLoad]
    # One sentence per resource that no quota can bring under its limit.
    unmet: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.unmet


class _Model:
    """The flows as one array, and the resource loads any vector of quotas gives."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        brokers = len(problem.brokers)
        buckets = problem.buckets
        self.demand = (
            np.stack([flow.demand for flow in problem.flows]).astype(np.float64)
            if problem.flows
            else np.zeros((0, brokers, buckets))
        )
        self.is_produce = np.array([flow.quota_type == PRODUCE for flow in problem.flows], dtype=bool)
        self.weights = np.array([flow.weight for flow in problem.flows], dtype=np.float64)
        self.protected = np.array([flow.protected for flow in problem.flows], dtype=bool)
        # What a quota is compared with: the rate Kafka measures, the flow's mean over the quota
        # window ending at each bucket, per broker (scope broker) or summed over brokers (cluster).
        window = max(1, problem.window_buckets)
        if problem.scope == "cluster":
            self.rate = trailing_mean(self.demand.sum(axis=1), window)  # (flows, buckets)
        else:
            self.rate = trailing_mean(self.demand, window)  # (flows, brokers, buckets)
        # peaks[f]: the highest windowed rate flow f shows anywhere. A quota at or above it never throttles
        # the flow, so it is also the top of the level search for that flow (level = peak / weight).
        # No flows (an idle proxy's guard step): nothing to reshape, and numpy cannot reshape an empty array to (0, -1).
        self.peaks = (
            self.rate.reshape(len(problem.flows), -1).max(axis=1) if buckets and problem.flows
            else np.zeros(len(problem.flows))
        )
        # cut_below[f]: the quota under which flow f loses bytes in some bucket (its peak, or its
        # peak / burst_factor where a throttled bucket keeps a burst above the quota). A quota at or
        # above it changes nothing in any bucket, so the flow is left unlimited rather than given it.
        self.cut_below = self.peaks / max(1.0, problem.burst_factor)
        self.followers, self.spread = replication_shares(problem.replication_factor, brokers)
        self.resources: list[Resource] = [(b, r) for b in problem.brokers for r in (NW_IN, NW_OUT)]
        zero = np.zeros(buckets)
        self.background = {res: problem.background.get(res, zero).astype(np.float64) for res in self.resources}
        self.touches = self._touches()

    def passed(self, quotas: np.ndarray) -> np.ndarray:
        """What each flow lets through under `quotas` (inf = unlimited), shape (flows, brokers, buckets).

        A bucket whose measured rate is above the quota is scaled down to the quota's share of
        it: the client is throttled in proportion, and its bursts inside the window (which
        Kafka's windowed rate lets through) keep their shape. A throttled bucket keeps up to
        burst_factor x the quota (Problem.burst_factor): the burst a throttled client still
        sends at this resolution, counted in every throttled bucket, as if the throttled
        clients' bursts all fell into the same buckets.
        """
        limit = quotas[:, None, None] if self.rate.ndim == 3 else quotas[:, None]
        burst = max(1.0, self.problem.burst_factor)
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(self.rate > limit, np.minimum(burst * limit / self.rate, 1.0), 1.0)
        if scale.ndim == 2:
            scale = scale[:, None, :]
        passed: np.ndarray = self.demand * scale
        return passed

    def series(self, quotas: np.ndarray) -> dict[Resource, np.ndarray]:
        """Each resource's per-bucket load (bytes/s) under `quotas`, replication included.

        A leader's NW_IN is its clients' produce plus its share (spread) of what the other brokers'
        leaders take in, which it replicates as a follower; its NW_OUT is its clients' fetches plus
        one copy of its own produce per follower. Throttling a producer therefore also lowers the
        followers' NW_IN and the leader's NW_OUT, which is why a produce flow can bind on a resource
        of another broker.
        """
        passed = self.passed(quotas)
        produce = passed[self.is_produce].sum(axis=0) if self.is_produce.any() else 0.0 * passed.sum(axis=0)
        fetch = passed[~self.is_produce].sum(axis=0) if (~self.is_produce).any() else 0.0 * passed.sum(axis=0)
        cluster_produce = produce.sum(axis=0)
        result: dict[Resource, np.ndarray] = {}
        for row, broker in enumerate(self.problem.brokers):
            nw_in = produce[row] + self.spread * (cluster_produce - produce[row])
            nw_out = fetch[row] + self.followers * produce[row]
            result[(broker, NW_IN)] = self.background[(broker, NW_IN)] + nw_in
            result[(broker, NW_OUT)] = self.background[(broker, NW_OUT)] + nw_out
        return result

    def loads(self, quotas: np.ndarray) -> dict[Resource, float]:
        """The statistic (problem.stat) of each resource's series: the number judged against its limit."""
        return {res: statistic(series, self.problem.stat) for res, series in self.series(quotas).items()}

    def over(self, quotas: np.ndarray) -> list[Resource]:
        """The resources whose load is above their limit under `quotas` (with the float tolerance)."""
        loads = self.loads(quotas)
        return [res for res in self.resources if loads[res] > self.problem.limits[res] * (1 + _TOLERANCE) + 1e-6]

    def _touches(self) -> np.ndarray:
        """touches[f, r]: flow f puts bytes on resource r (directly or through replication)."""
        on_broker = self.demand.max(axis=2) > 0 if self.demand.size else np.zeros(self.demand.shape[:2], bool)
        touches = np.zeros((len(self.problem.flows), len(self.resources)), dtype=bool)
        for column, (broker, resource) in enumerate(self.resources):
            row = self.problem.brokers.index(broker)
            if resource == NW_IN:
                direct = self.is_produce & on_broker[:, row]
                if self.spread > 0:
                    elsewhere = np.delete(on_broker, row, axis=1).any(axis=1)
                    direct = direct | (self.is_produce & elsewhere)
            else:
                direct = (~self.is_produce & on_broker[:, row]) | (
                    self.is_produce & on_broker[:, row] & (self.followers > 0)
                )
            touches[:, column] = direct
        return touches


def unquoted_loads(problem: Problem) -> dict[Resource, float]:
    """Each resource's load (the problem's statistic) with no quota on any flow: the demand as
    modelled, replication included. The guard judges a broker's measured traffic with it."""
    model = _Model(problem)
    return model.loads(np.full(len(problem.flows), np.inf))


def water_fill(problem: Problem) -> Advice:
    """Max-min fair quotas (progressive filling) that keep every resource's statistic at its limit."""
    model = _Model(problem)
    flows = problem.flows
    count = len(flows)
    floor = max(problem.floor, 0.0)
    quotas = np.full(count, np.inf)
    # Invariants of the loop below: a fixed flow's quota never changes again (inf for the protected
    # and those under the floor), the free flows all sit at max(floor, weight x level),
    # and raising the level only ever raises loads (passed() is monotone in the quota), which is what
    # makes the bisection on the level sound.
    fixed = model.protected | (model.peaks <= floor)
    binding: list[Resource | None] = [None] * count
    fair: list[float | None] = [None] * count

    def at_level(level: float) -> np.ndarray:
        trial = quotas.copy()
        free = ~fixed
        trial[free] = np.maximum(floor, model.weights[free] * level)
        return trial

    unmet = _unmet(model, at_level(0.0), fixed, floor)
    if unmet:
        # Even with every limitable flow at its floor some resource is over: advise the floor
        # for every limitable flow and say which resource cannot be met.
        quotas = at_level(0.0)
        quotas[model.protected | (model.peaks <= floor)] = np.inf
        return _advice(model, quotas, binding, fair, unmet)

    while not fixed.all():
        free = ~fixed
        # The level at which every free flow's quota reaches its peak and stops throttling: nothing
        # above it changes the loads, so it is the upper end of the search.
        top = float((model.cut_below[free] / model.weights[free]).max())
        if not model.over(at_level(top)):
            break  # every remaining flow fits with its whole demand: unlimited
        # Bisect for the highest level at which no resource is over: `low` always fits, `high` is over.
        low, high = 0.0, top
        for _ in range(_SEARCH_STEPS):
            middle = (low + high) / 2
            if model.over(at_level(middle)):
                high = middle
            else:
                low = middle
            if high - low <= max(1e-9 * high, 1e-9):
                break
        # The resources over at `high` are the ones that bind at this level. Only the free flows that put
        # bytes on them and are still throttled at `low` are fixed; a flow whose quota at this level is
        # already at or above its peak is not throttled by it, and stays free.
        level_quotas = at_level(low)
        newly_fixed = False
        for res in model.over(at_level(high)):
            column = model.resources.index(res)
            for index in np.flatnonzero(free & model.touches[:, column] & (level_quotas < model.cut_below)):
                if fixed[index]:
                    continue
                fixed[index] = True
                quotas[index] = level_quotas[index]
                binding[index] = res
                fair[index] = float(model.weights[index] * low)
                newly_fixed = True
        if not newly_fixed:  # only rounding left between the bounds: fix what is still limited
            for index in np.flatnonzero(free & (level_quotas < model.cut_below)):
                fixed[index] = True
                quotas[index] = level_quotas[index]
                fair[index] = float(model.weights[index] * low)
            break
    return _advice(model, quotas, binding, fair, [])


def _unmet(model: _Model, quotas: np.ndarray, fixed: np.ndarray, floor: float) -> list[str]:
    """Why each over-limit resource stays over with every limitable flow at its floor."""
    problem = model.problem
    reasons = []
    loads = model.loads(quotas)
    for res in model.over(quotas):
        broker, resource = res
        protected_only = np.where(model.protected, np.inf, 0.0)
        with_protected = statistic(model.series(protected_only)[res], problem.stat)
        background = statistic(model.background[res], problem.stat)
        column = model.resources.index(res)
        protected_names = [
            entity_text(flows.entity)
            for flows, hit in zip(problem.flows, model.protected & model.touches[:, column], strict=True)
            if hit
        ]
        parts = [f"traffic no byte-rate quota charges: {background:,.0f} B/s"]
        if protected_names:
            parts.append(f"with the protected {', '.join(protected_names)}: {with_protected:,.0f} B/s")
        if floor > 0:
            parts.append(f"with every other entity at the floor of {floor:,.0f} B/s: {loads[res]:,.0f} B/s")
        unquotable = [
            entity_text(flow.entity)
            for flow, hit, never in zip(problem.flows, model.touches[:, column], fixed & ~model.protected, strict=True)
            if hit and never
        ]
        if unquotable and floor > 0:
            parts.append(f"under the floor, so never limited: {', '.join(unquotable)}")
        reasons.append(
            f"broker {broker} {resource}: the {problem.stat} load cannot be brought to the limit of "
            f"{problem.limits[res]:,.0f} B/s ({'; '.join(parts)})"
        )
    return reasons


def _advice(
    model: _Model,
    quotas: np.ndarray,
    binding: list[Resource | None],
    fair: list[float | None],
    unmet: list[str],
) -> Advice:
    """Turn the quotas into FlowAdvice and ResourceLoad rows: loads before (no quota), after (the
    whole-bytes quotas) and with only the protected flows, and each flow's reason in words.
    """
    problem = model.problem
    before = model.loads(np.full(len(problem.flows), np.inf))
    # Quotas are whole bytes/s (Kafka stores them as longs): round down, so the loads only fall.
    whole = np.where(np.isfinite(quotas), np.maximum(np.floor(quotas), 1.0), np.inf)
    after = model.loads(whole)
    protected_quotas = np.where(model.protected, np.inf, 0.0)
    protected_loads = model.loads(protected_quotas)
    loads = [
        ResourceLoad(
            broker=broker,
            resource=resource,
            limit=float(problem.limits[(broker, resource)]),
            before=before[(broker, resource)],
            after=after[(broker, resource)],
            background=statistic(model.background[(broker, resource)], problem.stat),
            protected=protected_loads[(broker, resource)],
        )
        for broker, resource in model.resources
    ]
    advice = []
    floor = max(problem.floor, 0.0)
    highest_share = max((share for share in fair if share is not None), default=math.inf)
    for index, flow in enumerate(problem.flows):
        limited = math.isfinite(whole[index])
        peak = float(model.peaks[index])
        if flow.protected:
            reason = "protected"
        elif peak <= floor:
            reason = "under its floor"
        elif not limited and peak > highest_share:
            # Above the fair share, but never more than a throttled flow's burst at this resolution
            # (Problem.burst_factor): a quota would throttle it without lowering any bucket.
            reason = "within the burst a quota at its fair share lets through"
        elif not limited:
            reason = "under its fair share"
        elif (bound := binding[index]) is not None and (share := fair[index]) is not None and share < floor:
            reason = f"floor (the fair share of broker {bound[0]} {bound[1]} is lower)"
        elif bound is not None:
            reason = f"fair share of broker {bound[0]} {bound[1]}"
        else:
            reason = "floor (no quota brings the resource under its limit)" if unmet else "fair share"
        # The rate the quota sees, in the scope's terms: over the cluster for one cluster budget, else
        # its busiest broker in each bucket (the one a per-broker quota throttles first). The same
        # series as demand_peak, so the statistic and the peak in a comment never contradict.
        rate = model.rate[index]
        demand = rate if rate.ndim == 1 else rate.max(axis=0)
        advice.append(
            FlowAdvice(
                entity=flow.entity,
                quota_type=flow.quota_type,
                weight=flow.weight,
                protected=flow.protected,
                demand_peak=peak,
                demand_stat=statistic(demand, problem.stat),
                quota=float(whole[index]) if limited else None,
                fair_share=fair[index],
                binding=binding[index],
                reason=reason,
            )
        )
    return Advice(flows=advice, loads=loads, unmet=list(unmet))
