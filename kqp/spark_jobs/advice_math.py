"""Quota advice arithmetic: the Kafka quota entries that carry max-min fair byte-rate quotas.

Pure Python and numpy, no Spark: `advise` aggregates a capture into per-second demand series and
hands them to `water_fill`, which lives in kqp/quotas/fair_share.py (the model and its fairness
are described there) so that the live cluster guard runs the same arithmetic. Its names are
re-exported here for advise and the tests. What stays here is advise's own part: writing the
advised quotas as the fewest KIP-55 entries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from kqp.quotas.fair_share import (
    BYTE_RATE_TYPES,
    FETCH,
    NW_IN,
    NW_OUT,
    PRODUCE,
    STAT_PERCENTILES,
    STATS,
    Advice,
    ByteRateType,
    Flow,
    FlowAdvice,
    Problem,
    Resource,
    ResourceLoad,
    replication_shares,
    statistic,
    trailing_mean,
    water_fill,
)
from kqp.quotas.settings import DEFAULT_ENTITY, QuotaEntity

__all__ = [
    "BYTE_RATE_TYPES",
    "FETCH",
    "GRANULARITIES",
    "NW_IN",
    "NW_OUT",
    "PRODUCE",
    "STATS",
    "STAT_PERCENTILES",
    "UNLIMITED_QUOTA",
    "Advice",
    "ByteRateType",
    "Entry",
    "Flow",
    "FlowAdvice",
    "Granularity",
    "Problem",
    "Resource",
    "ResourceLoad",
    "choose_entries",
    "default_entity",
    "replication_shares",
    "statistic",
    "trailing_mean",
    "water_fill",
]

Granularity = Literal["user", "client-id", "user,client-id"]
GRANULARITIES: tuple[Granularity, ...] = ("user", "client-id", "user,client-id")

# Kafka stores byte-rate quotas as Java longs; Long.MAX_VALUE is its own "no quota" value,
# so an explicit entry with it exempts an entity from a `<default>` entry.
UNLIMITED_QUOTA = 2**63 - 1


def default_entity(granularity: Granularity) -> QuotaEntity:
    """The `<default>` entity of a granularity (KIP-55 level 8, 6 or 5)."""
    if granularity == "client-id":
        return QuotaEntity(client_id=DEFAULT_ENTITY)
    if granularity == "user":
        return QuotaEntity(user=DEFAULT_ENTITY)
    return QuotaEntity(user=DEFAULT_ENTITY, client_id=DEFAULT_ENTITY)


# ---------------------------------------------------------------- entries (KIP-55)


@dataclass(frozen=True)
class Entry:
    """One quota entry to write: an entity and its byte-rate quotas."""

    entity: QuotaEntity
    limits: Mapping[ByteRateType, int]


def choose_entries(flows: Sequence[FlowAdvice], granularity: Granularity) -> list[Entry]:
    """The fewest entries that give every flow its advised quota, through Kafka's precedence.

    With a `<default>` entry of value v for a quota type, a flow needs an entry of its own
    when it is limited to something else than v, or when it is unlimited but its demand
    goes above v (it gets Long.MAX_VALUE, Kafka's "no quota"); a protected flow always needs
    one then. Without a default only the limited flows need entries. Every candidate
    default (none, or one of the advised values) of each quota type is tried and the set
    with the fewest entries kept; a tie keeps the one without the default entry, so that a
    client not in the capture stays unlimited unless a default saves entries.
    """
    # A default worth trying is one of the advised values (any other saves no entry), so the search
    # is over at most (limited produce values + 1) x (limited fetch values + 1) combinations.
    candidates: dict[ByteRateType, list[int | None]] = {}
    for quota_type in BYTE_RATE_TYPES:
        values = sorted({int(f.quota) for f in flows if f.quota_type == quota_type and f.quota is not None})
        candidates[quota_type] = [None, *values]
    best: tuple[int, int, list[Entry]] | None = None
    for produce_default in candidates[PRODUCE]:
        for fetch_default in candidates[FETCH]:
            defaults: dict[ByteRateType, int | None] = {PRODUCE: produce_default, FETCH: fetch_default}
            entries = _entries_with(flows, defaults, granularity)
            defaults_used = sum(value is not None for value in defaults.values())
            key = (len(entries), defaults_used)
            if best is None or key < best[:2]:
                best = (key[0], key[1], entries)
    assert best is not None
    return best[2]


def _entries_with(
    flows: Sequence[FlowAdvice], defaults: Mapping[ByteRateType, int | None], granularity: Granularity
) -> list[Entry]:
    """The entries for one choice of defaults (None: no `<default>` entry for that quota type).

    Precedence is KIP-55's: an entity's own entry wins over the `<default>` of its granularity,
    so an entity needs one only where the default would give it the wrong value. An unlimited flow
    whose peak stays at or below the default is never throttled by it and needs no entry; one
    whose peak goes above (or a protected one) gets Long.MAX_VALUE, which Kafka reads as no quota.
    Entries are sorted by user then client id so that the written file is stable between runs.
    """
    explicit: dict[QuotaEntity, dict[ByteRateType, int]] = {}
    for flow in flows:
        default = defaults[flow.quota_type]
        value: int | None = None
        if flow.quota is not None:
            if int(flow.quota) != default:
                value = int(flow.quota)
        elif default is not None and (flow.protected or flow.demand_peak > default):
            value = UNLIMITED_QUOTA
        if value is not None:
            explicit.setdefault(flow.entity, {})[flow.quota_type] = value
    entries = []
    default_limits = {t: v for t, v in defaults.items() if v is not None}
    if default_limits:
        entries.append(Entry(default_entity(granularity), default_limits))
    entries.extend(
        Entry(entity, limits)
        for entity, limits in sorted(explicit.items(), key=lambda item: (item[0].user or "", item[0].client_id or ""))
    )
    return entries


def next_planned_limit(planned: float, limit: float, worst_replayed: float, round_number: int) -> float:
    """The limit the round after `round_number` plans for, when the replays so far left the
    resource at most at `worst_replayed`, over its true `limit`.

    The first cut is in proportion: the replay's overshoot comes from bursts between throttles,
    which shrink with the quotas. A round that is still over after a cut shows that the
    overshoot did not shrink in proportion: a statistic over few buckets (the p99 of a short
    capture's 2 s buckets is its busiest one) moves by which bucket a burst lands in more than
    by a cut of a few tenths of a percent, and one closed loop on real Kafka stayed 0.2-0.5 %
    over through three proportional rounds (1,231,068, 1,230,461, then 1,235,526 B/s against
    1,228,800). So each further round doubles the cut, in the exponent: the rounds reach a
    cut of any size in a few steps instead of creeping, and an overshoot that does shrink in
    proportion is met as before.

    The cut is of the worst overshoot the rounds have seen, not the last one: a later round can
    land just over the limit by a burst's placement (1,228,804 B/s against 1,228,800, after
    1,230,780 twice, in a fresh clone on 2026-11-27), and doubling the exponent of a
    3-parts-per-million overshoot cuts 17 B/s, which moved nothing: the fourth round replayed
    the same 1,228,804 and the job failed."""
    cut: float = (limit / worst_replayed) ** (2 ** (round_number - 1))
    return planned * cut
