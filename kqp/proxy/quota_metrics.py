"""The quota engine's figures as metric families, read from the engine at scrape time.

The engine is asked for its samples (`QuotaStatsSource`) only when Prometheus scrapes; the
samples' (user, client-id) pairs are folded into the same bounded labels as the per-request
figures (kqp.proxy.traffic_metrics), and figures of entities that share a label are added up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric


@dataclass(frozen=True, slots=True)
class QuotaStatSample:
    """One quota entity's current figures, as the quota engine reports them.

    Units follow Kafka per quota type: produce/fetch bytes per second, request percent of
    one thread, controller_mutation partitions per second. The collector only reads these
    attributes, so any object with the same attribute names works.
    """

    quota_type: str
    user: str
    client_id: str
    value: float
    limit: float | None
    tokens: float | None = None


class QuotaStatLike(Protocol):
    @property
    def quota_type(self) -> str: ...
    @property
    def user(self) -> str: ...
    @property
    def client_id(self) -> str: ...
    @property
    def value(self) -> float: ...
    @property
    def limit(self) -> float | None: ...
    @property
    def tokens(self) -> float | None: ...


QuotaStatsSource = Callable[[], Iterable[QuotaStatLike]]


def quota_families(
    source: QuotaStatsSource | None, labels_for: Callable[[str, str], tuple[str, str]]
) -> Iterator[Metric]:
    """The engine's samples as gauges, their (user, client-id) folded by `labels_for`; the
    families without samples when `source` is None (as when only their names are wanted)."""
    labels = ["quota_type", "user", "client_id"]
    usage = GaugeMetricFamily(
        "kqp_quota_usage",
        "Measured quota usage: bytes/s (produce, fetch), percent of a thread (request), "
        "partitions/s (controller_mutation).",
        labels=labels,
    )
    limit = GaugeMetricFamily(
        "kqp_quota_limit", "Configured quota limit, in the unit of kqp_quota_usage.", labels=labels
    )
    tokens = GaugeMetricFamily(
        "kqp_quota_tokens", "Controller mutation tokens left (negative while in debt).", labels=labels
    )
    ratio_max = GaugeMetricFamily(
        "kqp_quota_usage_ratio_max",
        "Highest usage/limit among all entities of a quota type, labelled or not.",
        labels=["quota_type"],
    )
    entities = GaugeMetricFamily(
        "kqp_quota_entities", "Quota entities the engine currently tracks.", labels=["quota_type"]
    )
    if source is not None:
        grouped: dict[tuple[str, str, str], _QuotaGroup] = {}
        highest: dict[str, float] = {}
        counts: dict[str, int] = {}
        for sample in source():
            quota_type = sample.quota_type
            counts[quota_type] = counts.get(quota_type, 0) + 1
            if sample.limit:
                highest[quota_type] = max(highest.get(quota_type, 0.0), sample.value / sample.limit)
            user, client_id = labels_for(sample.user, sample.client_id)
            key = (quota_type, user, client_id)
            group = grouped.get(key)
            if group is None:
                grouped[key] = _QuotaGroup(sample.value, sample.limit, sample.tokens)
            else:
                group.add(sample.value)
        for key, group in grouped.items():
            usage.add_metric(list(key), group.usage)
            # A limit or token count only means something for one entity, not for a sum.
            if group.samples == 1:
                if group.limit is not None:
                    limit.add_metric(list(key), group.limit)
                if group.tokens is not None:
                    tokens.add_metric(list(key), group.tokens)
        for quota_type, ratio in highest.items():
            ratio_max.add_metric([quota_type], ratio)
        for quota_type, count in counts.items():
            entities.add_metric([quota_type], count)
    yield from (usage, limit, tokens, ratio_max, entities)


class _QuotaGroup:
    __slots__ = ("limit", "samples", "tokens", "usage")

    def __init__(self, usage: float, limit: float | None, tokens: float | None) -> None:
        self.usage = usage
        self.limit = limit
        self.tokens = tokens
        self.samples = 1

    def add(self, usage: float) -> None:
        self.usage += usage
        self.samples += 1

