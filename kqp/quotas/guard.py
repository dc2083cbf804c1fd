"""The cluster guard's control step: work-conserving quotas, limited only while a broker is near its limit.

Pure: no IO, no clock (the time of the step is an argument). The proxy calls `step` every control
interval with what it measured; the simulator and the unit tests call it with made-up figures.

Every interval, per broker and network resource (NW_IN, NW_OUT):

* The *load* is modelled from each entity's measured rate exactly as `analyze` and `advise` model a
  capture (kqp.quotas.fair_share): produce on a leader is its NW_IN, and its RF-1 followers fetch
  it (the leader's NW_OUT, the followers' NW_IN, spread evenly over the other brokers); fetches
  are the broker's NW_OUT; traffic no byte-rate quota charges is the resource's background.
* The *limit* is capacity x threshold (the Cruise Control capacity file, as analyze reads it).
* A resource *engages* when its load is above its limit and *releases* when its load is at or
  under limit x (1 - release_margin): between the two it keeps its state (hysteresis). While
  clients on it are held back by their guard limits, it releases only after a quota window
  there: their windowed rates dip by a whole request between throttles.
* Each resource has a *trim* (kqp.quotas.guard_control): the integral of how far the load it
  carried was from its limit while held-back clients decided it, and a *damping*, proportional
  to how far the load of the last few seconds is from the window's. The shares are of
  limit x (trim + damping): the trim keeps the throttle's granularity (one large request per
  client per window) from leaving the broker short of, or over, its limit on average; the
  damping spreads the bursts Kafka's windowed throttle repeats every window.
* While any resource is engaged, or any guard limit is still in force, the *target* of every
  flow (one entity's produce or fetch) is its max-min fair share from `water_fill`, the same
  function `advise` uses, with weights, protected entities and the floor. A flow whose measured
  rate is at its guard limit is held back by it, so its rate says nothing of what it wants: it
  is modelled as wanting more than any limit (it takes whatever share the others leave). A flow
  under its limit is modelled at its measured rate, capped by its configured quota.
* A guard limit falls to its target at once (what keeps a broker under its limit), and rises by
  at most `raise_per_s` of itself per second (what keeps the loop from overshooting when demand
  falls). A limit whose flow no longer uses it disappears once no resource is engaged; one still
  in use rises at that bounded rate and disappears when it no longer bounds anything (above every
  resource's limit).

Why this does not oscillate (docs/quotas.md, "Why the loop is stable"): with demand constant, the
target depends only on the flows' rates under their limits, on which flows are held back and on
the trim, not on how far the held-back ones are over; the trim, the only term that integrates the
load, moves by at most 1 % of the limit per second with a gain that makes it slower than a quota
window, the lag through which a change of the shares shows in the load.

The guard limit is per broker (each broker's sensor enforces it, as Kafka's quotas do). The
entity's effective quota is the lower of its configured quota and its guard limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kqp.quotas.fair_share import (
    FETCH,
    NETWORK_RESOURCES,
    NW_IN,
    NW_OUT,
    ByteRateType,
    Flow,
    Problem,
    Resource,
    unquoted_loads,
    water_fill,
)
from kqp.quotas.guard_control import damping, next_trim
from kqp.quotas.guard_inputs import FlowKey, GuardSettings, MeasuredFlow
from kqp.quotas.settings import QuotaEntity

# The longest time one raise step accounts for: a step after a long pause (the proxy was busy,
# the interval was reloaded) must not lift every limit at once.
_MAX_RAISE_SPAN_S = 60.0
@dataclass(frozen=True)
class GuardState:
    """What the guard carries from one step to the next: the engaged resources (with the time
    each engaged), the guard limits in force, the time of the last step, each resource's trim
    (kqp.quotas.guard_control; 1.0 when absent) and, for an engaged resource whose load is under
    its release level while clients on it are still held back, since when it has been."""

    engaged: Mapping[Resource, float] = field(default_factory=dict)
    limits: Mapping[FlowKey, float] = field(default_factory=dict)
    last_step_s: float | None = None
    trims: Mapping[Resource, float] = field(default_factory=dict)
    below_since: Mapping[Resource, float] = field(default_factory=dict)
    rising: frozenset[FlowKey] = frozenset()  # limits the raise rate held under their target


@dataclass(frozen=True)
class ResourceStatus:
    broker: int
    resource: str
    load: float
    limit: float
    engaged: bool
    trim: float = 1.0  # the water-filling shares limit x (trim + damping) (kqp.quotas.guard_control)
    carried: float = 0.0  # what the flows put on it over the quota window, bytes/s (the feedback's load)
    damping: float = 0.0  # the loop's fast term this step (kqp.quotas.guard_control)


@dataclass(frozen=True)
class FlowStatus:
    """One flow after the step: its usage, its fair share (the target) and the limits in force."""

    entity: QuotaEntity
    quota_type: ByteRateType
    usage: float  # its busiest broker's measured rate, bytes/s
    held_back: bool  # its rate was at its guard limit (modelled as wanting more)
    target: float | None  # its max-min fair share this step, None when it needs no limit
    guard_limit: float | None  # the guard limit in force after the step
    configured_quota: float | None

    @property
    def effective_quota(self) -> float | None:
        """The lower of the configured quota and the guard limit: what the engine enforces."""
        limits = [limit for limit in (self.configured_quota, self.guard_limit) if limit is not None]
        return min(limits) if limits else None


@dataclass(frozen=True)
class GuardDecision:
    state: GuardState
    resources: list[ResourceStatus]
    flows: list[FlowStatus]
    engaged_now: list[Resource]  # resources that engaged at this step
    released_now: list[Resource]  # resources that released at this step

    @property
    def limits(self) -> Mapping[FlowKey, float]:
        return self.state.limits


def step(
    settings: GuardSettings,
    state: GuardState,
    measured: Sequence[MeasuredFlow],
    now_s: float,
    background: Mapping[Resource, float] | None = None,
) -> GuardDecision:
    """One control step at time `now_s` (seconds, any origin): the guard limits for the next interval.

    Args:
        settings: the guard's configuration.
        state: what the previous step returned (GuardState() at the start).
        measured: every flow's windowed rate per broker; rates on brokers without a limit are ignored.
        now_s: the time of the step.
        background: per resource, traffic no byte-rate quota charges, bytes/s.
    """
    brokers = settings.brokers
    background = background or {}
    flows = [flow for flow in measured if any(broker in flow.rates for broker in brokers)]

    # 1. The load each resource carries now, modelled from the measured rates.
    as_measured = [_flow(settings, flow, _rates(flow, brokers)) for flow in flows]
    loads = unquoted_loads(_problem(settings, background, as_measured))
    # The load the feedback closes on: what the flows put on each resource over the quota window.
    as_carried = [_flow(settings, flow, _rates(flow, brokers, carried=True)) for flow in flows]
    carried = unquoted_loads(_problem(settings, background, as_carried))
    # The damping's: what they put on it over the last few seconds (kqp.quotas.guard_control).
    as_recent = [_flow(settings, flow, _rates(flow, brokers, recent=True)) for flow in flows]
    recent = unquoted_loads(_problem(settings, background, as_recent))

    # 2. Hysteresis: engage above the limit; release at or under limit x (1 - margin), and while
    # clients on the resource are still held back by their guard limits, only once the load has
    # stayed there for `release_after_s` (a quota window): a held-back client's windowed rate
    # dips by a whole request between throttles, which is no sign that the demand fell.
    held_back = {flow.key: _held_back(settings, state, flow) for flow in flows}
    holding = {resource for flow in flows if held_back[flow.key] for resource in _touched(settings, flow)}
    # Resources whose held-back clients' limits are still rising to their targets: their load is
    # under the limit because of that bounded rise, which the trim must not integrate (windup).
    settling = {resource for flow in flows if held_back[flow.key] and flow.key in state.rising
                for resource in _touched(settings, flow)}
    engaged: dict[Resource, float] = {}
    below_since: dict[Resource, float] = {}
    for resource, limit in settings.limits.items():
        load = loads.get(resource, 0.0)
        if resource not in state.engaged:
            if load > limit:
                engaged[resource] = now_s
        elif load > limit * (1 - settings.release_margin):
            engaged[resource] = state.engaged[resource]
        elif resource in holding:
            since = state.below_since.get(resource, now_s)
            if now_s - since < settings.release_after_s:
                engaged[resource] = state.engaged[resource]
                below_since[resource] = since

    # 3. The feedback: each resource's trim, from the load it carried (kqp.quotas.guard_control).
    span = 0.0 if state.last_step_s is None else min(max(now_s - state.last_step_s, 0.0), _MAX_RAISE_SPAN_S)
    trims: dict[Resource, float] = {}
    dampings: dict[Resource, float] = {}
    for resource, limit in settings.limits.items():
        # Only once the quota window holds no time from before the engagement: until then the carried
        # load is the overload the limits have not decided yet, and integrating it winds the trim
        # down (to 0.93 in the closed-loop test) for the loop to climb back over the next windows.
        closing = (settings.feedback and resource in holding and resource not in settling
                   and now_s - engaged.get(resource, now_s) >= settings.release_after_s)
        trim = next_trim(state.trims.get(resource, 1.0), limit, carried.get(resource, 0.0), closing, span,
                         settings.trim)
        if trim != 1.0:
            trims[resource] = trim
        dampings[resource] = damping(limit, carried.get(resource, 0.0), recent.get(resource, 0.0), closing,
                                     settings.trim)
    shared = {resource: limit * (trims.get(resource, 1.0) + dampings[resource])
              for resource, limit in settings.limits.items()}

    # 4. Targets: every flow's max-min fair share of the trimmed limits, while there is anything to guard.
    targets: dict[FlowKey, float | None] = dict.fromkeys((flow.key for flow in flows), None)
    if engaged or state.limits:
        ceiling = max(shared.values(), default=0.0)
        demand = [_flow(settings, flow, _demand(settings, state, flow, held_back[flow.key], ceiling))
                  for flow in flows]
        advice = water_fill(_problem(settings, background, demand, shared))
        for flow, advised in zip(flows, advice.flows, strict=True):
            quota = advised.quota
            if quota is not None and flow.configured_quota is not None and quota >= flow.configured_quota:
                quota = None  # the configured quota already holds the flow at or under its share
            targets[flow.key] = quota

    # 5. Bounded rate of change: down at once, up by at most raise_per_s of the limit per second.
    raise_factor = 1.0 + settings.raise_per_s * span
    fall_factor = max(0.0, 1.0 - settings.fall_per_s * max(span, 1.0 if state.last_step_s is None else span))
    ceiling = max(shared.values(), default=0.0)
    usage = {flow.key: flow.peak for flow in flows}
    limits: dict[FlowKey, float] = {}
    rising: set[FlowKey] = set()
    for key in sorted({*targets, *state.limits}, key=_order):
        current = state.limits.get(key)
        target = targets.get(key)
        if current is None or (target is not None and target <= current):
            if target is not None:
                # Down by at most fall_per_s of itself per second, from the flow's own rate for
                # a new limit: a limit far under the windowed rate mutes the client for most of
                # a window (Kafka's throttle is (rate - limit) / limit x window), after which it
                # sends at full rate for as long, a sawtooth Kafka's windowed throttle keeps up.
                start = current if current is not None else max(usage.get(key, 0.0), target)
                limits[key] = max(target, start * fall_factor) if settings.fall_per_s > 0 else target
            continue
        raised = current * raise_factor
        if target is not None:
            limits[key] = min(target, raised)
            if raised < target:
                rising.add(key)
        elif not held_back.get(key, False) and not engaged:
            continue  # its flow is under the limit and no broker is near its own: it goes
        elif raised < ceiling:
            limits[key] = raised
            rising.add(key)
        # else: a limit above every resource's limit bounds nothing: it goes

    resources = [
        ResourceStatus(broker, resource, loads.get((broker, resource), 0.0), limit, (broker, resource) in engaged,
                       trims.get((broker, resource), 1.0), carried.get((broker, resource), 0.0),
                       dampings[(broker, resource)])
        for (broker, resource), limit in sorted(settings.limits.items())
    ]
    by_key = {flow.key: flow for flow in flows}
    statuses = [
        FlowStatus(
            entity=key[0],
            quota_type=key[1],
            usage=usage.get(key, 0.0),
            held_back=held_back.get(key, False),
            target=targets.get(key),
            guard_limit=limits.get(key),
            configured_quota=by_key[key].configured_quota if key in by_key else None,
        )
        for key in sorted({*targets, *limits}, key=_order)
    ]
    return GuardDecision(
        state=GuardState(engaged=engaged, limits=limits, last_step_s=now_s, trims=trims, below_since=below_since,
                         rising=frozenset(rising)),
        resources=resources,
        flows=statuses,
        engaged_now=sorted(set(engaged) - set(state.engaged)),
        released_now=sorted(set(state.engaged) - set(engaged)),
    )


def _order(key: FlowKey) -> tuple[str, str, str]:
    entity, quota_type = key
    return (entity.user or "", entity.client_id or "", quota_type)


def _rates(flow: MeasuredFlow, brokers: Sequence[int], carried: bool = False, recent: bool = False) -> np.ndarray:
    """The flow's measured rate per broker of the problem, as a (brokers, 1) demand matrix
    (`carried`: what it carried over the window, its `carried` when measured; `recent`: over the
    last few seconds, its `recent` when measured, else as `carried`)."""
    rates = flow.rates
    if recent and flow.recent is not None:
        rates = flow.recent
    elif (carried or recent) and flow.carried is not None:
        rates = flow.carried
    return np.array([[max(rates.get(broker, 0.0), 0.0)] for broker in brokers], dtype=np.float64)


def _held_back(settings: GuardSettings, state: GuardState, flow: MeasuredFlow) -> bool:
    """The flow wants more than its guard limit (and the guard limit is what binds, not its configured quota).

    Its guard limit throttled it within the last quota window, or its rate is at the limit. The
    throttle is the signal that counts: Kafka's throttle mutes a client for (rate - limit) / limit
    x window, so the windowed rate of a held-back client swings under its limit between
    throttles, while a client whose demand fell under its limit is not throttled again.
    """
    limit = state.limits.get(flow.key)
    if limit is None or (flow.configured_quota is not None and flow.configured_quota <= limit):
        return False
    return flow.throttled or flow.peak >= settings.saturation * limit


def _touched(settings: GuardSettings, flow: MeasuredFlow) -> set[Resource]:
    """The resources a flow's traffic loads, as the load model counts it: a fetch its brokers'
    NW_OUT; a produce its brokers' NW_IN and, replicated, their NW_OUT and the others' NW_IN."""
    brokers = [broker for broker, rate in flow.rates.items() if rate > 0 and broker in settings.brokers]
    if flow.quota_type == FETCH:
        return {(broker, NW_OUT) for broker in brokers}
    touched = {(broker, NW_IN) for broker in brokers}
    if settings.replication_factor > 1 and brokers:
        touched |= {(broker, NW_OUT) for broker in brokers}
        touched |= {(broker, NW_IN) for broker in settings.brokers}
    return touched


def _demand(settings: GuardSettings, state: GuardState, flow: MeasuredFlow, held_back: bool,
            ceiling: float) -> np.ndarray:
    """What the water-filling is told the flow wants, per broker.

    Under its limit, its measured rate (capped by its configured quota, which holds it there
    anyway). Held back, more than any resource can take (`ceiling`, or its configured quota if
    lower) on the brokers where its limit holds it back (throttled there within the window, or
    its rate there at the limit), so it takes whatever share the others leave; on its other
    brokers it is under its limit, and wants what it sends there. When no broker is named
    (a flow measured without them), on every broker, in proportion to its traffic.
    """
    brokers = settings.brokers
    rates = _rates(flow, brokers)
    cap = math.inf if flow.configured_quota is None else flow.configured_quota
    peak = float(rates.max()) if rates.size else 0.0
    if held_back and peak > 0:
        limit = state.limits.get(flow.key, math.inf)
        held = [index for index, broker in enumerate(brokers)
                if broker in flow.throttled_brokers or rates[index, 0] >= settings.saturation * limit]
        if held:
            rates = rates.copy()
            rates[held, :] = min(ceiling, cap)
        else:
            rates = rates * (min(ceiling, cap) / peak)
    capped: np.ndarray = np.minimum(rates, cap)
    return capped


def _flow(settings: GuardSettings, flow: MeasuredFlow, demand: np.ndarray) -> Flow:
    return Flow(
        entity=flow.entity,
        quota_type=flow.quota_type,
        demand=demand,
        weight=settings.weights.get(flow.entity, 1.0),
        protected=flow.entity in settings.protected,
    )


def _problem(settings: GuardSettings, background: Mapping[Resource, float], flows: Sequence[Flow],
             limits: Mapping[Resource, float] | None = None) -> Problem:
    """One bucket (this interval), judged at its value: the measured rates are already windowed.

    `limits`: what each resource may carry (the trimmed limits), settings.limits if None.
    """
    brokers = settings.brokers
    limits = settings.limits if limits is None else limits
    return Problem(
        brokers=brokers,
        # Both resources of every guarded broker: one the file leaves out is never judged (no limit).
        limits={
            (broker, resource): limits.get((broker, resource), math.inf)
            for broker in brokers
            for resource in NETWORK_RESOURCES
        },
        background={
            (broker, resource): np.array([background.get((broker, resource), 0.0)], dtype=np.float64)
            for broker in brokers
            for resource in NETWORK_RESOURCES
        },
        flows=list(flows),
        replication_factor=settings.replication_factor,
        scope="broker",
        stat="max",
        floor=settings.floor,
    )
