"""The cluster guard's feedback: a trim per broker resource that closes the loop on the load carried.

Pure: no clock (the step's span is an argument), no numpy.

The guard's targets are max-min fair shares of each resource's limit (kqp.quotas.guard). Held at
those shares by Kafka's after-the-fact throttle, backlogged clients do not carry exactly their
share: a throttled client is muted until its windowed rate is back at its quota, then sends one
whole request (librdkafka's default `batch.size` is 1 MB, two seconds of a 450 kB/s share), so
each held-back client runs a request over or under in any quota window, and on average short of
its share (the mute ends after the window has already slid on). On the wire that left a broker at
0.92x its limit with the guard's limits held still.

The trim is the loop's integral term: the water-filling shares `limit x trim` instead of `limit`,
and the trim moves by `gain_per_s x (limit - load) / limit` per second of the step's span, the load
being what the guard forwarded to that resource over the quota window. So a resource held under
its limit by the throttle's granularity has its held-back clients' shares raised until the load
they carry is at the limit, and one held over it has them lowered. docs/quotas.md ("Why the loop
is stable") argues the gains.

The damping is the loop's fast term, beside the trim, off by default since the guard's limits
throttle with a token bucket (DEFAULT_DAMPING): the shares are of `limit x (trim + damping)`,
the damping being `damping x (carried - recent) / limit`, `recent` the load carried over the last
few seconds. Kafka's windowed throttle echoes: a client muted until its window has room sends at
its full rate as soon as old samples leave the window, which is again a window later, so the
burst of the first throttled seconds repeats about every quota window (a little later each time:
a sample restarts at the first record after a mute), and the load over the quota window swings
by up to a tenth of the limit at that period. The damping lowers the shares while the held-back
clients burst (the last seconds above the window's mean), so that they meet their limit sooner,
and raises them while the clients are muted, spreading each burst over the window; over a window
its mean is zero, so it moves neither the load's mean nor the trim, as long as a request is small
against what the clients send over the span (with 1 MB requests against a 450 kB/s share it sees
single requests, and in the simulator moved the mean up to 1.058x the limit).
"""

from __future__ import annotations

from dataclasses import dataclass

# The trim's defaults, argued in docs/quotas.md ("Why the loop is stable").
DEFAULT_GAIN_PER_S = 0.1
DEFAULT_MAX_TRIM_CHANGE_PER_S = 0.01
DEFAULT_TRIM_BOUNDS = (0.85, 1.15)
DEFAULT_LEAK_PER_S = 0.01  # argued at TrimGains.leak_per_s
# The damping's defaults, argued in docs/quotas.md ("Why the loop is stable"). Off: it countered
# the echo of Kafka's windowed throttle, and the guard throttles with a token bucket instead
# (kqp.quotas.guard_limits.GuardRate), which has none; in the simulator's guard rows 54 of the 70
# scenario-seeds meet acceptance 1 without it, 49 with a gain of 0.1.
DEFAULT_DAMPING = 0.0
DEFAULT_DAMPING_SPAN_S = 4.0
DEFAULT_MAX_DAMPING = 0.1


@dataclass(frozen=True)
class TrimGains:
    """How the trim moves.

    Attributes:
        gain_per_s: the integral gain: the share of the relative error (limit - load) / limit
            added to the trim per second.
        max_change_per_s: the trim moves by at most this much per second, whatever the error
            (one window's swing of large requests must not move the shares by its whole size).
        bounds: the lowest and highest trim: the feedback corrects the throttle's granularity,
            never more than this share of the limit whatever it measures.
        damping: the proportional gain on (carried - recent) / limit added to the trim, where
            `recent` is the load over the last DEFAULT_DAMPING_SPAN_S (the span the guard's
            sensors measure it over: kqp.quotas.guard_limits).
        max_damping: the damping adds or takes at most this share of the limit.
        leak_per_s: while the loop closes, the trim also moves back toward 1 by this share of
            (trim - 1) per second. Each instance of a fleet runs its own trim on the load all
            of them carry, a report apart: integrators on one load with slightly different views
            of it drift apart without bound (the load does not tell them apart), which in the
            simulator's fleet rows took two instances' limits 5.5 % apart over a minute. The leak
            pulls every instance's trim toward the same 1 and costs a steady error of
            leak x (trim - 1) / gain: 0.2 % of the limit at a trim of 1.02.
    """

    gain_per_s: float = DEFAULT_GAIN_PER_S
    max_change_per_s: float = DEFAULT_MAX_TRIM_CHANGE_PER_S
    bounds: tuple[float, float] = DEFAULT_TRIM_BOUNDS
    damping: float = DEFAULT_DAMPING
    max_damping: float = DEFAULT_MAX_DAMPING
    leak_per_s: float = DEFAULT_LEAK_PER_S


def next_trim(trim: float, limit: float, load: float, closing: bool, span_s: float, gains: TrimGains) -> float:
    """The resource's trim after a step of `span_s` seconds.

    Args:
        trim: the trim in force (1.0 when the loop has never closed on this resource).
        limit: the resource's limit, bytes/s.
        load: what the guard forwarded to the resource over the quota window, bytes/s.
        closing: whether the loop closes on this resource now: it has been engaged for a quota
            window and clients on it are held back by their guard limits, so their shares decide
            its load. Otherwise the
            trim returns toward 1 at the rate limit (nothing to correct, and no windup while the
            load is under the limit because the demand is).
        span_s: seconds since the previous step.
        gains: how the trim moves.
    """
    if limit <= 0 or span_s <= 0:
        return trim
    if closing:
        wanted = (gains.gain_per_s * (limit - load) / limit - gains.leak_per_s * (trim - 1.0)) * span_s
    else:
        wanted = 1.0 - trim
    step_cap = gains.max_change_per_s * span_s
    change = min(max(wanted, -step_cap), step_cap)
    low, high = gains.bounds
    return min(max(trim + change, low), high)


def damping(limit: float, carried: float, recent: float, closing: bool, gains: TrimGains) -> float:
    """What the damping adds to the resource's trim this step (0 unless the loop closes on it).

    Args:
        limit: the resource's limit, bytes/s.
        carried: what the guard forwarded to the resource over the quota window, bytes/s.
        recent: what it forwarded over the last DEFAULT_DAMPING_SPAN_S, bytes/s.
        closing: as for next_trim: held-back clients decide the resource's load.
        gains: how the loop moves.
    """
    if not closing or limit <= 0:
        return 0.0
    wanted = gains.damping * (carried - recent) / limit
    return min(max(wanted, -gains.max_damping), gains.max_damping)
