"""One quota budget for a fleet of proxies: the usage reports instances exchange, and what an
instance makes of them. Pure: times are arguments, the transport lives in kqp.proxy.fleet.

Each instance sends, every report interval, what it recorded into each quota sensor since its
previous report (a delta per sensor, `UsageDelta`). Every other instance records those deltas
into its own sensor for the same entity as they arrive, so the rate a sensor measures is the
fleet's rate, late by the exchange's lag, and the throttle computed from it is the fleet's
throttle. An instance that stops reporting stops adding: its past usage leaves every window
by itself, one quota window later.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, cast

from kqp.quotas.settings import QUOTA_TYPES, QuotaType

REPORT_FORMAT = 1

FailurePolicy = Literal["local", "share"]
ExchangeState = Literal["starting", "ok", "local", "share"]


class ReportError(ValueError):
    """A usage report that cannot be read (another version of kqp, or not a report at all)."""


@dataclass(frozen=True, slots=True)
class UsageDelta:
    """What one instance recorded into one sensor since its previous report.

    broker: the upstream broker label of a `scope: broker` budget, None for `scope: cluster`;
    tags: the sensor's metric tags in order ((user, ...), (client-id, ...) by default);
    amount: bytes, percent of a thread, or partitions; negative when a fetch was unrecorded.
    """

    quota_type: QuotaType
    broker: str | None
    tags: tuple[tuple[str, str], ...]
    amount: float


@dataclass(frozen=True, slots=True)
class UsageReport:
    instance: str
    seq: int
    usage: tuple[UsageDelta, ...] = ()


def encode_report(report: UsageReport) -> bytes:
    usage = [[d.quota_type, d.broker, [list(pair) for pair in d.tags], d.amount] for d in report.usage]
    body = {"format": REPORT_FORMAT, "instance": report.instance, "seq": report.seq, "usage": usage}
    return json.dumps(body, separators=(",", ":")).encode()


def decode_report(data: bytes) -> UsageReport:
    """The report in `data`; ReportError names what is wrong with it."""
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"not JSON: {exc}") from None
    if not isinstance(body, dict) or body.get("format") != REPORT_FORMAT:
        raise ReportError(f"not a format {REPORT_FORMAT} usage report")
    instance, seq, usage = body.get("instance"), body.get("seq"), body.get("usage")
    if not isinstance(instance, str) or not isinstance(seq, int) or not isinstance(usage, list):
        raise ReportError("instance, seq or usage missing or of the wrong type")
    deltas = []
    for item in usage:
        try:
            quota_type, broker, tags, amount = item
            pairs = tuple((str(k), str(v)) for k, v in tags)
        except (TypeError, ValueError):
            raise ReportError(f"malformed usage entry {item!r}") from None
        if quota_type not in QUOTA_TYPES or not (broker is None or isinstance(broker, str)):
            raise ReportError(f"malformed usage entry {item!r}")
        if not isinstance(amount, int | float):
            raise ReportError(f"malformed usage entry {item!r}")
        deltas.append(UsageDelta(cast(QuotaType, quota_type), broker, pairs, float(amount)))
    return UsageReport(instance, seq, tuple(deltas))


def split_usage(usage: Iterable[UsageDelta], per_report: int) -> list[tuple[UsageDelta, ...]]:
    """Usage in chunks of at most `per_report` deltas, so that no report outgrows a Kafka record
    (one instance with 100,000 active clients sends several records per interval)."""
    chunks: list[tuple[UsageDelta, ...]] = []
    batch: list[UsageDelta] = []
    for delta in usage:
        batch.append(delta)
        if len(batch) >= per_report:
            chunks.append(tuple(batch))
            batch = []
    if batch:
        chunks.append(tuple(batch))
    return chunks


@dataclass(slots=True)
class FleetView:
    """Who is in the fleet and whether the exchange works, as one instance sees it.

    Instances are known by their reports: one that has not reported for `member_timeout_ms`
    (one quota window) is gone. The exchange works while this instance's own reports come back
    to it through the topic; when its last one is older than `unreachable_after_ms`, the
    instance falls back to `policy`: `local` enforces its own budget alone, `share` enforces
    quota / (instances last seen), so a fleet of N that loses the exchange still admits about
    one quota in total, not N.
    """

    instance: str
    policy: FailurePolicy
    member_timeout_ms: float
    unreachable_after_ms: float
    started_ms: float
    last_seen_ms: dict[str, float] = field(default_factory=dict)
    own_report_seen_ms: float | None = None
    last_known_instances: int = 1

    def report_seen(self, instance: str, now_ms: float) -> None:
        self.last_seen_ms[instance] = now_ms
        if instance == self.instance:
            self.own_report_seen_ms = now_ms

    def instances(self, now_ms: float) -> int:
        """Instances alive (this one included); those silent for a quota window are forgotten."""
        gone = [name for name, seen in self.last_seen_ms.items() if now_ms - seen > self.member_timeout_ms]
        for name in gone:
            del self.last_seen_ms[name]
        alive = len(self.last_seen_ms.keys() | {self.instance})
        if self.reachable(now_ms):
            self.last_known_instances = alive
        return alive

    def reachable(self, now_ms: float) -> bool:
        since = self.own_report_seen_ms if self.own_report_seen_ms is not None else self.started_ms
        return now_ms - since <= self.unreachable_after_ms

    def state(self, now_ms: float) -> ExchangeState:
        if self.reachable(now_ms):
            return "ok" if self.own_report_seen_ms is not None else "starting"
        return self.policy

    def budget_share(self, now_ms: float) -> float:
        """The fraction of each quota this instance enforces alone: 1 while the exchange works."""
        if self.state(now_ms) == "share":
            return 1.0 / max(1, self.last_known_instances)
        return 1.0
