"""One quota budget for a fleet of proxies: the usage reports instances exchange, and what an
instance makes of them. Pure: times are arguments, the transport lives in kqp.proxy.fleet.

Theory of operation, for a reader who knows the broker
------------------------------------------------------
Kafka meters a client on each broker alone; a fleet of N proxies in front of one cluster
must meter it once, whichever proxy its connections reach (`scope: cluster`), or once per
upstream broker (`scope: broker`). No instance forwards requests to another: each keeps
Kafka's sensors for every client (kqp.quotas.engine) and adds to them what the others report.

Each instance sends, every report interval, what it recorded into each quota sensor since its
previous report (a delta per sensor, `UsageDelta`). Every other instance records those deltas
into its own sensor for the same entity as they arrive, so the rate a sensor measures is the
fleet's rate, late by the exchange's lag, and the throttle computed from it is the fleet's
throttle. An instance that stops reporting stops adding: its past usage leaves every window
by itself, one quota window later. `FleetSharing` is that bookkeeping, behind the engine's
`UsageSharing` seam; `QuotaEngine` (kqp.quotas.quota_engine) is the engine with it attached.

How far a fleet's figure can be from one broker's:

* Lag. A delta reaches the others one report interval I plus the topic's round trip L after
  the usage happened, so the rate an instance measures misses at most the fraction
  (I + L) / W of the fleet's usage, W being the quota window (samples x sample size): under
  1% with the defaults (50 ms against 11 s), and the fleet admits about that much over one
  broker. That holds for traffic spread over time. Throttled clients come back together when
  their burst leaves the window, and every instance would see room the others are taking at
  that moment; so an instance that knows other live instances serve a client counts, before
  throttling a produce or a fetch, its own usage of that client that the others may not have
  matched in their reports yet, once for each of them (`FleetSharing.pending_elsewhere`): what
  it recorded since its last report, and what its last report carried for an instance whose
  report has not arrived since; a client nobody has reported yet, first seen here within two
  report intervals, counts every live instance. That covers the others' unknown usage while
  the topic's round trip L stays under one report interval I, so an instance reports every
  `report_interval_seconds` or every 2 L, whichever is longer (`ReportPacer`); docs/scaling.md
  gives the measured figures and where they stop holding.
* When the others' usage leaves the window. One broker keeps a sample until a window after its
  last event, so usage recorded on its arrival would stay up to I + L longer on the other
  instances than on its own, and their throttles would end that much later. Each delta says
  how long before its report its sensor last recorded (`UsageDelta.age_ms`), and the others
  date it by that and the round trip (`FleetSharing.record_remote_usage`), while I + L is
  shorter than a sample; beyond, it is recorded on arrival (docs/quotas.md, findings f and h).
* Quiet clients. A client far from its quota costs the exchange nothing: a sensor whose rate,
  as this instance measures it, is below `quiet_below` x quota is left out of the report
  (byte rates and request time). With `quiet_below` = e / N (fleet option
  `max_unreported_share` = e), an instance leaves a client's usage out only while the rate it
  measures, its own usage included, is below e / N of the quota; N instances thus leave out
  less than e of the quota between them. A left-out delta is dropped, not held back: from the
  interval the client's rate reaches the threshold, its usage is reported again.
* Losing the exchange. An instance whose own reports stop coming back falls back to `policy`
  (`FleetView`): `local` enforces its whole quota alone (up to N quotas in total), `share`
  enforces quota / N for the N instances it last saw (`FleetSharing.limit_scale`), about one
  quota in total.

The workers of one host (`kqp serve --workers N`) share the same deltas through their
supervisor instead, at a loop turn's lag rather than an interval and a topic's round trip
(kqp.proxy.host_exchange): lag is what lets every worker fill, on its own, the room that
opens for all of them when a burst leaves the window (docs/scaling.md). FleetSharing keeps
their deltas apart from the topic's (`share_with_host`, `take_host_usage`), so a worker of a
fleet reports to both.

Partition mutations (KIP-599) cannot work that way: a CreateTopics is admitted or refused per
topic the moment it arrives, and two instances that each see a full bucket would both admit.
So an instance does not decide a mutation alone: it writes a `MutationClaim` to the same
one-partition topic and waits for it to come back. Every instance applies every claim in the
topic's order to its own controller-mutation bucket, at times derived from the claims alone
(`ClaimClock`), so every instance computes the same verdict for each claim, the one a single
controller would give the requests in that order. Claims are the sharing for mutations, so
they are not reported as usage as well (`mutations_claimed`).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from kqp.protocol.api_keys import MUTATION_API_KEYS
from kqp.quotas.engine import QuotaManagers
from kqp.quotas.sensors import QuotaSensor, RateSensor
from kqp.quotas.settings import ByteRateType, QuotaType
from kqp.quotas.stats import NO_QUOTA_BOUND

REPORT_FORMAT = 1

# Entries FleetSharing keeps for fetch sensors before it first looks for dropped ones.
_MIN_SERVING_ENTRIES = 1024
# Quota types whose throttle counts what the other instances serving the client may have
# admitted meanwhile (FleetSharing.pending_elsewhere): byte rates, produce as well as fetch.
# Without produce, throttled producers that come back together when their burst leaves the
# window are each admitted into the whole room by their own instance (docs/scaling.md).
_COUNTED: frozenset[QuotaType] = frozenset({"consumer_byte_rate", "producer_byte_rate"})

FailurePolicy = Literal["local", "share"]
ExchangeState = Literal["starting", "ok", "local", "share"]


class ReportError(ValueError):
    """A usage report that cannot be read (another version of kqp, or not a report at all)."""


@dataclass(frozen=True, slots=True)
class UsageDelta:
    """What one instance recorded into one sensor since its previous report.

    broker: the upstream broker label of a `scope: broker` budget, None for `scope: cluster`;
    tags: the sensor's metric tags in order ((user, ...), (client-id, ...) by default);
    amount: bytes, percent of a thread, or partitions; negative when a fetch was unrecorded;
    age_ms: how long before the report was taken the reporter last recorded into the sensor,
    on its own clock (0 from a kqp that does not say): with the report's round trip, when the
    usage happened, which is where the others put it in their windows (`record_remote_usage`).
    """

    quota_type: QuotaType
    broker: str | None
    tags: tuple[tuple[str, str], ...]
    amount: float
    age_ms: int = 0


@dataclass(frozen=True, slots=True)
class GuardDelta:
    """What one instance recorded into one of the cluster guard's sensors since its previous
    report (`guard.fleet_wide`; kqp.quotas.guard_limits): the tags are the guard's entity at its
    granularity, the broker the upstream broker, the amount bytes (net of unrecorded fetches),
    and `throttles` how many times the guard limit throttled that flow there meanwhile."""

    quota_type: ByteRateType
    broker: str | None
    tags: tuple[tuple[str, str], ...]
    amount: float
    throttles: int = 0


@dataclass(frozen=True, slots=True)
class UsageReport:
    instance: str
    seq: int
    usage: tuple[UsageDelta, ...] = ()
    guard: tuple[GuardDelta, ...] = ()


def encode_report(report: UsageReport) -> bytes:
    usage = [[d.quota_type, d.broker, [list(pair) for pair in d.tags], d.amount] for d in report.usage]
    body: dict[str, object] = {"format": REPORT_FORMAT, "instance": report.instance, "seq": report.seq,
                               "usage": usage}
    if any(d.age_ms for d in report.usage):
        # A key of its own, one age per usage entry, which an older kqp ignores (extra keys are):
        # it then dates the usage at its arrival, as before.
        body["age_ms"] = [d.age_ms for d in report.usage]
    if report.guard:
        # A key of its own, which a kqp without the fleet's guard ignores (extra keys are).
        body["guard"] = [[d.quota_type, d.broker, [list(pair) for pair in d.tags], d.amount, d.throttles]
                         for d in report.guard]
    return json.dumps(body, separators=(",", ":")).encode()


# The records as they travel (JSON), checked by pydantic in strict mode: a field of the wrong
# type is refused, never coerced. Extra keys are ignored, so a later kqp may add some.
_WIRE = ConfigDict(strict=True, frozen=True)


class _ReportWire(BaseModel):
    model_config = _WIRE

    format: Literal[1]  # REPORT_FORMAT
    instance: str
    seq: int
    # Each delta as [quota type, broker or null, [[tag, value], ...], amount].
    usage: list[tuple[QuotaType, str | None, tuple[tuple[str, str], ...], float]]
    # The cluster guard's deltas (guard.fleet_wide), each as [byte-rate type, broker or null, [[tag, value], ...],
    # amount, throttles]; absent from a report without them.
    guard: list[tuple[ByteRateType, str | None, tuple[tuple[str, str], ...], float, int]] = []
    # UsageDelta.age_ms of each usage entry, in order; absent when every age is 0.
    age_ms: list[int] = []

    @field_validator("age_ms")
    @classmethod
    def _one_age_per_delta(cls, ages: list[int], info: ValidationInfo) -> list[int]:
        usage = info.data.get("usage")
        if ages and usage is not None and len(ages) != len(usage):
            raise ValueError(f"{len(ages)} ages for {len(usage)} usage entries")
        if any(age < 0 for age in ages):
            raise ValueError("a negative age")
        return ages

    def report(self) -> UsageReport:
        ages = self.age_ms or [0] * len(self.usage)
        return UsageReport(self.instance, self.seq,
                           tuple(UsageDelta(*delta, age) for delta, age in zip(self.usage, ages, strict=True)),
                           tuple(GuardDelta(*delta) for delta in self.guard))


def _report_error(error: ValidationError, within: int = 0) -> ReportError:
    """What is wrong with a usage report, in words an operator can act on (`within`: how many
    leading parts of the error's location name where the report sits, not its fields)."""
    first = error.errors()[0]
    where = first["loc"][within:]
    if first["type"] == "json_invalid":
        return ReportError(f"not JSON: {first['msg'].removeprefix('Invalid JSON: ')}")
    if not where or where[0] == "format":
        return ReportError(f"not a format {REPORT_FORMAT} usage report")
    if where[0] in ("usage", "guard") and len(where) > 1:
        return ReportError(f"malformed {where[0]} entry {where[1]}: {first['msg']}")
    if where[0] == "age_ms":
        return ReportError(f"malformed usage ages: {first['msg'].removeprefix('Value error, ')}")
    return ReportError(f"instance, seq or usage missing or of the wrong type ({where[0]}: {first['msg']})")


def decode_report(data: bytes) -> UsageReport:
    """The report in `data`; ReportError names what is wrong with it."""
    try:
        return _ReportWire.model_validate_json(data).report()
    except ValidationError as error:
        raise _report_error(error) from None


@dataclass(frozen=True, slots=True)
class MutationClaim:
    """A mutation request one instance received, for every instance to charge in topic order.

    claim_id: unique per instance (with `instance`, it names the claim when it comes back);
    wall_ms: the claimer's wall clock when it sent the claim (the only time every instance shares);
    broker, user, client_id: whose controller-mutation sensor pays (a broker label, as in
    kqp.quotas.recording.QuotaClient); topics: (label, partitions) in request order.
    """

    instance: str
    claim_id: int
    wall_ms: float
    broker: str
    user: str
    client_id: str
    api_key: int
    api_version: int
    topics: tuple[tuple[str, int], ...]


def encode_claim(claim: MutationClaim) -> bytes:
    body = {
        "format": REPORT_FORMAT, "claim": claim.claim_id, "instance": claim.instance, "wall_ms": claim.wall_ms,
        "broker": claim.broker, "user": claim.user, "client_id": claim.client_id, "api_key": claim.api_key,
        "api_version": claim.api_version, "topics": [list(topic) for topic in claim.topics],
    }
    return json.dumps(body, separators=(",", ":")).encode()


class _ClaimWire(BaseModel):
    model_config = _WIRE

    format: Literal[1]  # REPORT_FORMAT
    claim: int
    instance: str
    wall_ms: float
    broker: str
    user: str
    client_id: str
    api_key: int
    api_version: int
    topics: list[tuple[str, int]]  # [[label, partitions], ...] in request order

    @field_validator("api_key")
    @classmethod
    def _partition_mutation(cls, api_key: int) -> int:
        if api_key not in MUTATION_API_KEYS:
            raise ValueError(f"API key {api_key}, not a partition mutation")
        return api_key

    def mutation_claim(self) -> MutationClaim:
        return MutationClaim(self.instance, self.claim, self.wall_ms, self.broker, self.user, self.client_id,
                             self.api_key, self.api_version, tuple(self.topics))


def _record_kind(body: Any) -> str:
    # A claim is the record with a `claim` key; anything else is read as a usage report.
    return "claim" if isinstance(body, dict) and "claim" in body else "report"


_RECORD = TypeAdapter[_ClaimWire | _ReportWire](Annotated[
    Annotated[_ClaimWire, Tag("claim")] | Annotated[_ReportWire, Tag("report")], Discriminator(_record_kind)
])


def decode_record(data: bytes) -> UsageReport | MutationClaim:
    """A record of the usage topic: a usage report or a mutation claim; ReportError otherwise."""
    try:
        record = _RECORD.validate_json(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = first["loc"]
        if not where or where[0] == "report":
            raise _report_error(error, within=1) from None
        field = where[1] if len(where) > 1 else None
        if field == "api_key":
            raise ReportError(f"a mutation claim for {first['msg'].removeprefix('Value error, ')}") from None
        if field == "topics":
            raise ReportError(f"a mutation claim with malformed topics ({first['msg']})") from None
        raise ReportError(f"a mutation claim with fields missing or of the wrong type ({field}: {first['msg']})"
                          ) from None
    return record.mutation_claim() if isinstance(record, _ClaimWire) else record.report()


@dataclass(slots=True)
class ClaimClock:
    """The engine time at which an instance charges each claim.

    A claim's time is its claimer's wall clock moved onto this instance's engine clock by a
    fixed offset, and never earlier than the previous claim's: times go forward, as a token
    bucket needs, and the gaps between claims (all a bucket's refills depend on) are the same
    on every instance, whatever its own clock reads.
    """

    wall_minus_engine_ms: float
    last_ms: float | None = None

    def engine_time(self, claim: MutationClaim) -> float:
        t = claim.wall_ms - self.wall_minus_engine_ms
        if self.last_ms is not None and t < self.last_ms:
            t = self.last_ms
        self.last_ms = t
        return t


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


def worker_instance_id(base: str, index: int) -> str:
    """The name of worker `index` of `kqp serve --workers` whose host's instance name is `base`."""
    return f"{base}:w{index}"


def budget_holder(instance: str) -> str:
    """Who holds a budget share under the `share` fallback: a worker's host (its workers share
    one budget through their supervisor, exchange or no exchange), any other instance itself."""
    base, sep, index = instance.rpartition(":w")
    return base if sep and index.isdigit() else instance


# How many of its own reports' round trips an instance paces its reports by (ReportPacer), and
# how many sent reports it waits for at most (a report lost on the way never comes back).
_ROUND_TRIPS_KEPT = 16
_UNECHOED_KEPT = 256
# The longest an instance stays silent, idle or pacing its reports by a slow topic.
_LONGEST_SILENCE_S = 1.0


def longest_silence_s(unreachable_after_s: float) -> float:
    """The longest an instance goes without sending a report (a heartbeat when it has no usage):
    at most a third of `fleet.unreachable_after_seconds`, so that its own reports coming back keep
    it out of the fallback."""
    return min(_LONGEST_SILENCE_S, unreachable_after_s / 3)


class ReportPacer:
    """How long an instance waits between its usage reports: `shortest_ms`
    (`fleet.report_interval_seconds`), or twice the longest round trip its last reports took
    through the topic (sent to seen back) when that is longer, never longer than `longest_ms`
    (`longest_silence_s`).

    Why not a fixed interval: `FleetSharing.pending_elsewhere` counts the others' unreported
    usage as what this instance admitted since its own last report, and over the interval before
    as well for an instance whose report has not arrived since. That covers what they admitted
    meanwhile while at most one report of each is crossing the topic, that is while the round
    trip L stays under the interval I; from L = I on the fleet admits a burst once per instance
    again (a 500 ms round trip with reports every 100 ms: 0.84-1.17x where one broker admits
    0.94x, docs/quotas.md finding f). And any I longer than needed costs accuracy: the estimate
    stands for up to I + L of the others' usage, taken to be what this instance admitted (while
    the others were muted too), so throttles end later than one broker's by up to that much (3
    instances, L = 2 ms, I = 100 ms: 0.93x where one broker admits 1.005x; I = 50 ms: within
    1 %, finding g; until the others' usage was dated when it happened, its arrival held it in
    the window up to I + L longer as well, finding h). Twice L keeps one report at most in
    flight while round trips vary by as much again.

    Pure: times are arguments. Before any report has come back the interval is `shortest_ms`.
    """

    __slots__ = ("_round_trips", "_unechoed", "interval_ms", "longest_ms", "shortest_ms")

    def __init__(self, shortest_ms: float, longest_ms: float) -> None:
        self.shortest_ms = shortest_ms
        self.longest_ms = max(shortest_ms, longest_ms)
        self.interval_ms = shortest_ms
        # Reports sent and not seen back yet, in the order sent (one partition keeps it): seq -> time.
        self._unechoed: dict[int, float] = {}
        self._round_trips: deque[float] = deque(maxlen=_ROUND_TRIPS_KEPT)

    @classmethod
    def for_settings(cls, report_interval_s: float, unreachable_after_s: float) -> ReportPacer:
        """The pacer of the `fleet` section's `report_interval_seconds` and `unreachable_after_seconds`."""
        return cls(report_interval_s * 1000.0, longest_silence_s(unreachable_after_s) * 1000.0)

    @property
    def round_trip_ms(self) -> float | None:
        """The longest round trip of the reports kept, None before one came back."""
        return max(self._round_trips) if self._round_trips else None

    @property
    def least_round_trip_ms(self) -> float:
        """The shortest round trip of the reports kept (0 before one came back): how long before
        its arrival another instance's report is taken to have been sent, to date its usage
        (FleetSharing.record_remote_usage). The shortest, so that usage is not dated earlier than
        it happened, which would let it leave the window early and admit more than one broker."""
        return min(self._round_trips) if self._round_trips else 0.0

    def sent(self, seq: int, now_ms: float) -> None:
        unechoed = self._unechoed
        unechoed[seq] = now_ms
        if len(unechoed) > _UNECHOED_KEPT:
            del unechoed[next(iter(unechoed))]

    def echoed(self, seq: int, now_ms: float) -> None:
        """This instance's own report `seq` was read back from the topic at `now_ms`."""
        unechoed = self._unechoed
        sent_ms = unechoed.get(seq)
        if sent_ms is None:
            return  # not sent by this process, or already forgotten
        # The topic keeps one producer's order: every report sent before this one came back first or was lost.
        for earlier in [s for s in unechoed if s <= seq]:
            del unechoed[earlier]
        # To the microsecond: a clock's float noise would otherwise pace reports 100.00000000000001 ms
        # apart where the round trip is 50 ms, moving each report a little on every one.
        self._round_trips.append(round(now_ms - sent_ms, 3))
        self.interval_ms = min(self.longest_ms, max(self.shortest_ms, 2.0 * max(self._round_trips)))


@dataclass(frozen=True, slots=True)
class Departure:
    """An instance the view stopped counting: how long it had been silent then, and how long
    since the view's previous membership check, both on the view's own clock. It left at the
    first check after a member timeout of silence when `silent_ms - member_timeout_ms` is at most
    `since_previous_check_ms`."""

    instance: str
    silent_ms: float
    since_previous_check_ms: float


@dataclass(slots=True)
class FleetView:
    """Who is in the fleet and whether the exchange works, as one instance sees it.

    Instances are known by their reports: one that has not reported for `member_timeout_ms`
    (one quota window) is gone. The exchange works while this instance's own reports come back
    to it through the topic; when its last one is older than `unreachable_after_ms`, the
    instance falls back to `policy`: `local` enforces its own budget alone, `share` enforces
    quota / (instances last seen), so a fleet of N that loses the exchange still admits about
    one quota in total, not N. The workers of one host count as one there (`budget_holder`):
    their supervisor still shares their usage among them.
    """

    instance: str
    policy: FailurePolicy
    member_timeout_ms: float
    unreachable_after_ms: float
    started_ms: float
    last_seen_ms: dict[str, float] = field(default_factory=dict)
    own_report_seen_ms: float | None = None
    last_known_instances: int = 1
    last_known_holders: int = 1
    # The instances forgotten since the exchange last took them (`take_departures`), for its log.
    departures: list[Departure] = field(default_factory=list)
    last_checked_ms: float | None = None

    def report_seen(self, instance: str, now_ms: float) -> None:
        self.last_seen_ms[instance] = now_ms
        if instance == self.instance:
            self.own_report_seen_ms = now_ms

    def instances(self, now_ms: float) -> int:
        """Instances alive (this one included); those silent for a quota window are forgotten."""
        gone = [name for name, seen in self.last_seen_ms.items() if now_ms - seen > self.member_timeout_ms]
        previous_check_ms = self.started_ms if self.last_checked_ms is None else self.last_checked_ms
        for name in gone:
            silent_ms = now_ms - self.last_seen_ms.pop(name)
            self.departures.append(Departure(name, silent_ms, now_ms - previous_check_ms))
        self.last_checked_ms = now_ms
        names = self.last_seen_ms.keys() | {self.instance}
        alive = len(names)
        if self.reachable(now_ms):
            self.last_known_instances = alive
            self.last_known_holders = len({budget_holder(name) for name in names})
        return alive

    def take_departures(self) -> list[Departure]:
        """The instances forgotten since the last call, oldest first."""
        departures, self.departures = self.departures, []
        return departures

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
            return 1.0 / max(1, self.last_known_holders)
        return 1.0


class FleetSharing:
    """The engine's `UsageSharing` seam for a fleet: what this instance recorded since its last
    report, which other instances serve each consumer, and the share of each quota enforced.

    No Kafka counterpart (brokers never share a quota). Per-sensor state is kept here, keyed by
    the engine's sensor objects, so the sensors stay Kafka's; a sensor the engine drops
    (expiry, a window change) is forgotten here as well.
    """

    __slots__ = (
        "_before_last_report_ms",
        "_claimed_on_host",
        "_claimed_on_topic",
        "_first_seen",
        "_for_topic",
        "_forget_above",
        "_guard_throttles",
        "_host_instances",
        "_last_report_ms",
        "_pending",
        "_pending_guard",
        "_pending_host",
        "_previous_report",
        "_report_ms",
        "_serving",
        "consults_others",
        "kept_quiet",
        "limit_scale",
        "mutations_claimed",
        "on_host_pending",
        "records_guard",
        "records_host_usage",
        "records_usage",
    )

    def __init__(self) -> None:
        # Keep local usage for an exchange: the engine's one test on its hot path. For the topic's
        # reports (share_usage), for the host's other workers (share_with_host), or both.
        self.records_usage = False
        self._for_topic = False
        self.mutations_claimed = False
        self._claimed_on_topic = self._claimed_on_host = False
        # The workers of one host (`--workers N`) share usage through their supervisor at a loop
        # tick's lag, apart from the topic's reports: their own accumulator, taken every tick
        # (`take_host_usage`), and a call when it gets its first entry so that the IO layer can
        # schedule that tick (`share_with_host`).
        self.records_host_usage = False
        self.on_host_pending: Callable[[], None] | None = None
        self._pending_host: dict[QuotaSensor, tuple[QuotaType, float]] = {}
        # The other instances whose usage comes through the host (siblings), not the topic.
        self._host_instances: set[str] = set()
        self.limit_scale = 1.0
        # Deltas `take_local_usage` left out because their client was far from its quota.
        self.kept_quiet = 0
        # What each sensor recorded since the last report, in the order sensors first recorded,
        # and when it last recorded (the report's age of it, UsageDelta.age_ms).
        self._pending: dict[QuotaSensor, tuple[QuotaType, float, int]] = {}
        # What the last report carried per sensor, quiet deltas included, and when it was
        # taken: what an instance whose report has not come back since then has not matched.
        self._previous_report: dict[QuotaSensor, float] = {}
        self._last_report_ms = 0
        self._before_last_report_ms = 0
        # When this instance first throttled each client no other instance has reported yet
        # (the time of its last report then): a client new to the fleet.
        self._first_seen: dict[RateSensor, int] = {}
        # When each other instance last reported (heartbeats included).
        self._report_ms: dict[str, int] = {}
        # pending_elsewhere answers None while no other instance ever reported and the topic's
        # reports are off (it then knows no instance, nor dates a client's first use): the
        # engine skips the call until then.
        self.consults_others = False
        # Fetch and produce sensors: the other instances that reported this client's usage.
        self._serving: dict[RateSensor, set[str]] = {}
        self._forget_above = _MIN_SERVING_ENTRIES
        # The cluster guard's sensors (guard.fleet_wide): what each recorded since the last report, and
        # each one's throttle count at the last report.
        self.records_guard = False
        self._pending_guard: dict[RateSensor, tuple[ByteRateType, float]] = {}
        self._guard_throttles: dict[RateSensor, int] = {}

    def share_usage(self, enabled: bool, *, mutations_claimed: bool = False) -> None:
        self._for_topic = enabled
        self.consults_others = enabled or bool(self._report_ms)
        self.records_usage = enabled or self.records_host_usage
        self._claimed_on_topic = enabled and mutations_claimed
        self.mutations_claimed = self._claimed_on_topic or self._claimed_on_host
        if not enabled:
            self.take_local_usage()

    def share_with_host(self, enabled: bool, on_pending: Callable[[], None] | None = None, *,
                        mutations_claimed: bool = False) -> None:
        """Keep what each sensor records for the host's other workers too (`take_host_usage`);
        `on_pending` is called when that usage goes from nothing to something (once per batch),
        `mutations_claimed`: partition mutations are ordered through the host, not shared as usage."""
        self.records_host_usage = enabled
        self.records_usage = enabled or self._for_topic
        self.on_host_pending = on_pending if enabled else None
        self._claimed_on_host = enabled and mutations_claimed
        self.mutations_claimed = self._claimed_on_topic or self._claimed_on_host
        if not enabled:
            self._pending_host = {}

    # -- the UsageSharing seam ----------------------------------------------------------------

    def recorded(self, quota_type: QuotaType, sensor: QuotaSensor, amount: float, now_ms: int) -> None:
        if not self.records_usage or sensor.bound == NO_QUOTA_BOUND:
            return  # no quota limits this client: nobody's throttle depends on its usage
        if self.mutations_claimed and quota_type == "controller_mutation_rate":
            return
        if self._for_topic:
            pending = self._pending.get(sensor)
            self._pending[sensor] = (quota_type, (0.0 if pending is None else pending[1]) + amount, now_ms)
        if self.records_host_usage:
            host = self._pending_host
            if not host and self.on_host_pending is not None:
                self.on_host_pending()
            on_host = host.get(sensor)
            host[sensor] = (quota_type, (0.0 if on_host is None else on_host[1]) + amount)

    def pending_elsewhere(self, sensor: RateSensor, amount: float, now_ms: int) -> float | None:
        """Other instances serve this client too, and what they admitted since the last report
        of theirs that reached here is not known yet: each live one is taken to have admitted
        as much as this instance did over the same span, as one broker would have seen all of it.

        That span is this instance's current report interval for an instance whose report came
        back after this instance's last one (their reports cross the topic alike), and the last
        interval too for one whose report has not: while the exchange lag stays under a report
        interval, that is what the other had admitted before the report now on its way."""
        # Live: reported within the sensor's whole window; a throttled client's instance
        # stays, as it sends heartbeats.
        horizon_ms = now_ms - sensor.rate.samples * sensor.rate.window_ms
        reported = self._report_ms
        instances = self._serving.get(sensor)
        if instances:
            instances -= {i for i in instances if reported.get(i, horizon_ms - 1) < horizon_ms}
        elif self._for_topic and self._new_to_the_fleet(sensor):
            # A client that appears on every instance at once (a fleet starting, clients
            # reconnecting) is served by instances that cannot know of each other before a
            # report has crossed the topic: each live instance is taken to serve it until then.
            # (Only with the topic: its report intervals date a client's first use here.)
            instances = {i for i, at in reported.items() if at >= horizon_ms}
        if not instances:
            return None
        # A sibling on this host has seen this instance's usage up to the last loop tick; an
        # instance elsewhere, up to the last topic report.
        siblings = instances & self._host_instances
        pending = self._pending.get(sensor)
        pending_host = self._pending_host.get(sensor)
        elsewhere = (len(instances) - len(siblings)) * ((0.0 if pending is None else pending[1]) + amount)
        previous = self._previous_report.get(sensor)
        if previous:
            last_report_ms = self._last_report_ms
            elsewhere += previous * sum(1 for i in instances - siblings if reported[i] < last_report_ms)
        return len(siblings) * ((0.0 if pending_host is None else pending_host[1]) + amount) + elsewhere

    def _new_to_the_fleet(self, sensor: RateSensor) -> bool:
        """No other instance has reported this client yet, and this instance began throttling it
        within its last two report intervals: too soon for another's usage to have come back."""
        first = self._first_seen.get(sensor)
        if first is None:
            first = self._first_seen[sensor] = self._last_report_ms
            if len(self._first_seen) > self._forget_above:
                self._forget_dropped_sensors()
        return first >= self._before_last_report_ms

    def share_guard(self, enabled: bool) -> None:
        """Keep what the cluster guard's sensors record for the fleet's reports (`guard.fleet_wide`)."""
        self.records_guard = enabled
        if not enabled:
            self._pending_guard, self._guard_throttles = {}, {}

    def guard_recorded(self, quota_type: ByteRateType, sensor: RateSensor, amount: float) -> None:
        # Every guard sensor, limited or not: the guard must see the fleet's load before it
        # limits anyone, which is when it decides whether to.
        pending = self._pending_guard.get(sensor)
        self._pending_guard[sensor] = (quota_type, amount + (0.0 if pending is None else pending[1]))

    # -- the exchange's side ------------------------------------------------------------------

    def take_guard_usage(self) -> list[GuardDelta]:
        """What this instance recorded into each of the guard's sensors since the last call, with
        the throttles its guard limits gave meanwhile: the report's `guard` part."""
        pending, self._pending_guard = self._pending_guard, {}
        counts = self._guard_throttles
        deltas = []
        for sensor, (quota_type, amount) in pending.items():
            throttles = sensor.throttle_count - counts.get(sensor, 0)
            counts[sensor] = sensor.throttle_count
            if amount or throttles:
                identity = sensor.identity
                deltas.append(GuardDelta(quota_type, identity.broker, tuple(identity.tags.items()), amount,
                                         throttles))
        if len(counts) > 2 * len(pending) + _MIN_SERVING_ENTRIES:
            self._guard_throttles = {sensor: count for sensor, count in counts.items() if not sensor.expired}
        return deltas

    def record_remote_guard(self, engine: QuotaManagers, deltas: Iterable[GuardDelta], now_ms: float) -> None:
        """Another instance's guard deltas into `engine`'s guard sensors (none without the guard)."""
        guard = engine.guard
        if guard is None:
            return
        t = int(now_ms)
        for delta in deltas:
            guard.record_remote(delta.quota_type, delta.broker, dict(delta.tags), delta.amount, delta.throttles, t)


    def take_local_usage(self, now_ms: float = 0.0, quiet_below: float = 0.0) -> list[UsageDelta]:
        """What this instance recorded into each sensor since the last call: its usage report.

        `quiet_below` (a fraction of each quota) leaves out the byte-rate and request-time
        usage of a sensor whose rate, as this instance measures it at `now_ms` (its own usage
        plus what the others reported), is below that fraction of its bound (see the module
        header for the error bound this gives).
        """
        pending, self._pending = self._pending, {}
        t = int(now_ms)
        self._previous_report = {sensor: amount for sensor, (_, amount, _) in pending.items()}
        self._before_last_report_ms, self._last_report_ms = self._last_report_ms, t
        usage = []
        for sensor, (quota_type, amount, last_ms) in pending.items():
            if not amount:
                continue
            if quiet_below > 0.0 and isinstance(sensor, RateSensor) and \
                    sensor.rate.measure(t) < quiet_below * sensor.bound:
                self.kept_quiet += 1
                continue
            identity = sensor.identity
            usage.append(UsageDelta(quota_type, identity.broker, tuple(identity.tags.items()), amount,
                                    max(0, t - last_ms)))
        return usage

    def take_host_usage(self) -> list[UsageDelta]:
        """What this worker recorded into each sensor since the last call, for the other workers
        of its host. Nothing is left out as quiet: on one host a delta costs microseconds, not a
        record on a topic."""
        pending, self._pending_host = self._pending_host, {}
        usage = []
        for sensor, (quota_type, amount) in pending.items():
            if amount:
                identity = sensor.identity
                usage.append(UsageDelta(quota_type, identity.broker, tuple(identity.tags.items()), amount))
        return usage

    def record_remote_usage(
        self, engine: QuotaManagers, usage: Iterable[UsageDelta], now_ms: float, instance: str | None,
        via_host: bool = False, round_trip_ms: float = 0.0, interval_ms: float = 0.0,
    ) -> None:
        """Another instance's report into `engine`'s sensors (see QuotaEngine.record_remote_usage).

        Each delta is dated when its reporter last recorded it: the report's arrival less the
        topic's round trip (`round_trip_ms`, sent to read back, as this instance measures its own
        reports') and the delta's age. One broker's sample keeps a value until a window after its
        last event (SampledStat.purgeObsoleteSamples), so a value dated at its arrival would hold
        the room a burst leaves for up to a report interval plus the round trip longer on every
        other instance than on its own: throttles ending that much later than one broker's
        (docs/quotas.md, finding h).

        Only while that span, `interval_ms` (this instance's report interval, the others' alike)
        plus the round trip, is shorter than a sample: beyond it one instance can admit a whole
        burst before another hears of it, which pending_elsewhere's estimate cannot foresee, and
        dating it back would open the room it leaves on every instance at once. There the usage
        is recorded at its arrival, which holds that room for the others until they can know who
        took it (finding f: a 500 ms round trip admits over one broker on 8 seeds of 24 dated, 3
        at arrival)."""
        t = int(now_ms)
        blind_ms = interval_ms + round_trip_ms
        sent = now_ms - round_trip_ms
        if instance is not None:
            self._report_ms[instance] = t
            self.consults_others = True
            if via_host:
                self._host_instances.add(instance)
        for delta in usage:
            manager = engine.manager(delta.quota_type)
            if not manager.enabled:
                continue
            sensor = manager.sensor_for_tags(delta.broker, dict(delta.tags), t)
            if blind_ms < sensor.rate.window_ms:
                sensor.record_at(delta.amount, int(sent - delta.age_ms), t)
            else:
                sensor.record(delta.amount, t)
            sensor.last_record_ms = t
            if delta.quota_type in _COUNTED and instance is not None:
                serving = self._serving.get(sensor)
                if serving is None:
                    serving = self._serving[sensor] = set()
                    if len(self._serving) > self._forget_above:
                        self._forget_dropped_sensors()
                serving.add(instance)

    def _forget_dropped_sensors(self) -> None:
        # A sensor the engine dropped is never looked up again (the engine makes a new one), so
        # its entry is forgotten when the map has doubled since it was last cleaned: amortised,
        # a constant cost per new entry rather than a scan per report.
        for dropped in [sensor for sensor in self._serving if sensor.expired]:
            del self._serving[dropped]
        for dropped in [sensor for sensor in self._first_seen if sensor.expired]:
            del self._first_seen[dropped]
        self._forget_above = 2 * max(len(self._serving), len(self._first_seen)) + _MIN_SERVING_ENTRIES
