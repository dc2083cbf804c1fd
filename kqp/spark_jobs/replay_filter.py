"""Which replay tasks a quota file can provably never throttle, so they need no replay.

No Spark here: `whatif.simulate` aggregates, this module decides, and unit tests drive it.

A replay task is one fresh engine over one quota group (and one broker, when every budget is
per broker): its sensors see its own requests and nothing else. If no sensor of a task can
ever measure a rate above its bound, no request of the task is throttled; in deferral mode
nothing is then pushed back either, so every request stays at its recorded time (induction
over the replay's time order: the first throttle would have to come from a sensor that only
ever saw requests at their recorded times, and those stay under the bound). Such a task's
rows leave the replay exactly as they came in (`sim_ts_ms = ts_ms`, no throttle), and can
be passed through without the engine.

The bound, from Kafka's windowed Rate as kqp.quotas.stats.WindowedRate implements it, with
N = window_num samples of w ms (`window_size_s` x 1000):

  * the measured window is padded to at least N - 1 full samples (1 ms when N = 1), so the
    rate a check sees is at most (bytes retained) / ((N - 1) x w);
  * a retained sample had an event less than N x w ago (older ones are purged before the
    check), and holds only events from the w ms after its start (a record rolls to a new
    sample once the current one is w old), so every retained byte was recorded within the
    last (N + 1) x w - 1 ms: the N windows plus the overlapping one Kafka 3.8 keeps;
  * at whole-second resolution, such a span touches at most (N + 1) x window_size_s + 1
    consecutive seconds.

So if, in every run of that many consecutive seconds, the bytes charged to a task's sensors
of one quota type stay at or under the smallest quota of that type in the task times
(N - 1) x window_size_s, no sensor of that type can exceed its bound. The check is on an
upper bound of the charges (the raw request or response size, never less than what
kqp.quotas.recording charges) and on the task's total (at least any one sensor's share), so
it can only keep a task in the replay that would not have been throttled, never the reverse.

Not bounded here, so always replayed: request_percentage (request time is not a byte count
the capture bounds per second), controller mutations (a token bucket charged at request
time), and a quota callback (it may group and limit clients any way it likes).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

import numpy as np

from kqp.quotas import QuotaEngine
from kqp.quotas.settings import QuotaSettings
from kqp.quotas.stats import NO_QUOTA_BOUND

ByteQuotaType = Literal["producer_byte_rate", "consumer_byte_rate"]
BYTE_QUOTA_TYPES: tuple[ByteQuotaType, ...] = ("producer_byte_rate", "consumer_byte_rate")
# Quota types the byte bound cannot speak for: a task limited by one of them is replayed.
UNBOUNDED_QUOTA_TYPES = ("request_percentage", "controller_mutation_rate")
# The rate a check passes at is compared in doubles (bytes / seconds); keeping the bytes a
# hair under the exact allowance means no rounding can tip a sum at the boundary over it.
_ROUNDING_MARGIN = 1e-9

TaskKey = TypeVar("TaskKey", bound=Hashable)


def window_span_seconds(window_num: int, window_size_s: int) -> int:
    """Consecutive whole seconds a sensor's retained bytes can come from (see the module docstring)."""
    return (window_num + 1) * window_size_s + 1


def window_allowance_bytes(quota: float, window_num: int, window_size_s: int) -> float:
    """Bytes a sensor may hold without measuring over `quota`: the quota times the shortest
    window Kafka divides by, (window_num - 1) samples; with a single sample Rate pads nothing,
    so the window can be as short as 1 ms."""
    shortest_ms = max((window_num - 1) * window_size_s * 1000, 1)
    return quota * shortest_ms / 1000.0


def max_span_bytes(seconds: np.ndarray, nbytes: np.ndarray, span: int) -> float:
    """The most bytes in any run of `span` consecutive seconds.

    `seconds` need not be sorted or distinct; a second absent from it carried nothing. The
    maximum is reached by a run that ends at a second with bytes, so only those are tried.
    """
    if len(seconds) == 0:
        return 0.0
    order = np.argsort(seconds, kind="stable")
    ordered = np.asarray(seconds, dtype=np.int64)[order]
    cumulative = np.concatenate([[0.0], np.cumsum(np.asarray(nbytes, dtype=np.float64)[order])])
    # For the run ending at each second s: everything up to s, less everything before s - span + 1.
    ends = np.searchsorted(ordered, ordered, side="right")
    starts = np.searchsorted(ordered, ordered - (span - 1), side="left")
    return float(np.max(cumulative[ends] - cumulative[starts]))


@dataclass(frozen=True)
class TaskQuotas:
    """The byte quotas a task's clients resolve to: the smallest finite one per type (None:
    no client of the task has one), or `bounded=False` when some client has a quota this
    module cannot bound."""

    bounded: bool
    smallest: Mapping[ByteQuotaType, float | None]


def task_quotas(engine: QuotaEngine, settings: QuotaSettings, pairs: Iterable[tuple[str, str]]) -> TaskQuotas:
    """Resolve each (principal, client-id) of a task through the engine, as the replay's engine will."""
    if settings.callback is not None:
        return TaskQuotas(bounded=False, smallest={})
    smallest: dict[ByteQuotaType, float | None] = dict.fromkeys(BYTE_QUOTA_TYPES)
    for principal, client_id in pairs:
        for unbounded in UNBOUNDED_QUOTA_TYPES:
            if _finite(engine.quota(unbounded, principal, client_id)) is not None:  # type: ignore[arg-type]
                return TaskQuotas(bounded=False, smallest={})
        for quota_type in BYTE_QUOTA_TYPES:
            quota = _finite(engine.quota(quota_type, principal, client_id))
            current = smallest[quota_type]
            if quota is not None and (current is None or quota < current):
                smallest[quota_type] = quota
    return TaskQuotas(bounded=True, smallest=smallest)


def _finite(quota: float | None) -> float | None:
    # Long.MAX_VALUE (an exemption from a <default> entry) is Kafka's "no quota".
    return None if quota is None or quota >= NO_QUOTA_BOUND else float(quota)


def never_throttled(
    quotas: TaskQuotas,
    charged: Mapping[ByteQuotaType, tuple[np.ndarray, np.ndarray]],
    window_num: int,
    window_size_s: int,
) -> bool:
    """Whether a task's sensors provably stay within their bounds for the whole capture.

    Args:
        quotas: the task's resolved quotas (task_quotas).
        charged: per byte quota type, (second, bytes) of an upper bound of what the task's
            requests charge to that type, by the second of the engine's clock (recorded ts_ms).
        window_num / window_size_s: the quota window of the settings replayed.
    """
    if not quotas.bounded:
        return False
    span = window_span_seconds(window_num, window_size_s)
    for quota_type in BYTE_QUOTA_TYPES:
        quota = quotas.smallest.get(quota_type)
        if quota is None:
            continue
        seconds, nbytes = charged.get(quota_type, (np.zeros(0, dtype=np.int64), np.zeros(0)))
        allowance = window_allowance_bytes(quota, window_num, window_size_s)
        if max_span_bytes(seconds, nbytes, span) > allowance * (1 - _ROUNDING_MARGIN):
            return False
    return True


def passthrough_tasks(
    settings: QuotaSettings,
    task_pairs: Mapping[TaskKey, Iterable[tuple[str, str]]],
    charged: Mapping[tuple[TaskKey, ByteQuotaType], tuple[np.ndarray, np.ndarray]],
) -> set[TaskKey]:
    """The tasks whose rows the replay would return unchanged (never throttled, never deferred)."""
    engine = QuotaEngine(settings)
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0))
    result = set()
    for key, pairs in task_pairs.items():
        quotas = task_quotas(engine, settings, pairs)
        per_type = {quota_type: charged.get((key, quota_type), empty) for quota_type in BYTE_QUOTA_TYPES}
        if never_throttled(quotas, per_type, settings.window_num, settings.window_size_s):
            result.add(key)
    return result
