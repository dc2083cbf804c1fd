"""advise, from a capture to the optimisation problem: the job's options, the capture
aggregated into per-bucket series (from analyze's traffic sums), each broker resource's
limit from the capacity file, and the `advice_math.Problem` that water-filling solves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kqp.quotas import capacity as cap
from kqp.quotas.settings import QuotaEntity, Scope
from kqp.spark_jobs.advice_math import (
    BYTE_RATE_TYPES,
    FETCH,
    PRODUCE,
    Flow,
    Granularity,
    Problem,
    Resource,
)
from kqp.spark_jobs.analyze_tables import RESOLUTIONS

SUMMARY_SCHEMA = "kqp.replay.advise/1"
# advise's default resolution: buckets as long as the quota window (docs/replay.md, advise).
WINDOW_RESOLUTION = "window"
ADVISE_RESOLUTIONS = (WINDOW_RESOLUTION, *RESOLUTIONS)
# Entity columns of the capture per granularity; "user" is the captured principal, the
# name the proxy's engine meters users under.
ENTITY_COLUMNS: dict[Granularity, tuple[str, ...]] = {
    "client-id": ("client_id",),
    "user": ("principal",),
    "user,client-id": ("principal", "client_id"),
}


@dataclass(frozen=True)
class AdviseOptions:
    capture: str
    capacity: str
    output: str
    current: str | None = None
    weights: Mapping[str, float] = field(default_factory=dict)
    protect: tuple[str, ...] = ()
    floor: float = 0.0
    entity: Granularity = "client-id"
    scope: Scope = "broker"
    replication_factor: int = 3
    nw_in_threshold: float = cap.DEFAULT_NETWORK_THRESHOLD
    nw_out_threshold: float = cap.DEFAULT_NETWORK_THRESHOLD
    headroom_stat: str = "p99"
    # "window": buckets of the quota window (window_num x window_size_seconds), the finest
    # resolution a Kafka quota holds a throttled client to its quota; "1s" / "1min" as analyze.
    headroom_resolution: str = WINDOW_RESOLUTION
    verify: bool = True
    rounds: int = 4
    window_num: int | None = None
    window_size_seconds: int | None = None
    # None: the quota window over the bucket (docs/replay.md, advise); 1 plans throttled clients at
    # their quota, as if they never burst within a bucket.
    burst_factor: float | None = None
    top_n: int = 20


def entity_of(granularity: Granularity, key: Sequence[str]) -> QuotaEntity:
    """The quota entity of a capture key (the values of ENTITY_COLUMNS[granularity])."""
    if granularity == "client-id":
        return QuotaEntity(client_id=key[0])
    if granularity == "user":
        return QuotaEntity(user=key[0])
    return QuotaEntity(user=key[0], client_id=key[1])


def entity_name(entity: QuotaEntity) -> str:
    """How --weight and --protect name an entity: CLIENT-ID, USER, or USER/CLIENT-ID."""
    if entity.user is not None and entity.client_id is not None:
        return f"{entity.user}/{entity.client_id}"
    return entity.user if entity.user is not None else str(entity.client_id)


@dataclass
class Series:
    """The capture as the optimiser sees it: per-bucket rates, bucket i = first_bucket + i."""

    brokers: tuple[int, ...]
    first_bucket: int
    unit: int
    covered: np.ndarray  # seconds of the capture window in each bucket
    broker_rates: dict[int, dict[str, np.ndarray]]  # broker -> bytes_in/bytes_out/produce_bytes/fetch_bytes
    demand: dict[tuple[QuotaEntity, str], np.ndarray]  # (entity, quota type) -> (brokers, buckets)
    pairs: pd.DataFrame  # every (principal, client_id) seen
    seconds: tuple[int, int]  # the capture's first and last second


def bucket_coverage(first_second: int, last_second: int, unit: int) -> tuple[int, np.ndarray]:
    """(first bucket, seconds of the capture inside each bucket) for buckets of `unit` seconds.

    The first and last buckets are usually partial; dividing their bytes by the seconds covered,
    not by `unit`, keeps a capture that starts mid-bucket from showing a falsely low rate there.
    """
    first_bucket, last_bucket = first_second // unit, last_second // unit
    starts = np.arange(first_bucket, last_bucket + 1) * unit
    covered = np.minimum(starts + unit - 1, last_second) - np.maximum(starts, first_second) + 1
    return first_bucket, covered.astype(np.float64)


def bucket_seconds(options: AdviseOptions, windows: Mapping[str, int]) -> int:
    """The judged bucket in seconds: the quota window for "window", else analyze's 1 s or 1 min."""
    if options.headroom_resolution == WINDOW_RESOLUTION:
        return windows["window_num"] * windows["window_size_seconds"]
    return RESOLUTIONS[options.headroom_resolution]


def resolution_text(unit: int) -> str:
    """How a bucket length is named in the outputs: "1 s", "11 s", "1 min"."""
    return "1 min" if unit == 60 else f"{unit} s"


def guarantee(stat: str, unit: int, windows: Mapping[str, int], burst_factor: float) -> str:
    """The advice's promise in one sentence: what stays under which limit, at what resolution."""
    window = windows["window_num"] * windows["window_size_seconds"]
    window_text = f"{windows['window_num']} x {windows['window_size_seconds']} s"
    promise = (
        f"What this advice guarantees: every broker's NW_IN and NW_OUT stays under its limit at the {stat} "
        f"of {resolution_text(unit)} buckets"
    )
    if burst_factor > 1:
        return (
            f"{promise}, planning every throttled client at up to {burst_factor:g} x its quota within one bucket "
            f"(Kafka holds a client to its quota over the {window_text} quota window, not in every bucket)."
        )
    if unit <= window:
        # In words for someone who has never read Kafka's quota code: what the wire shows, and the
        # start of a run, which the replay's warm-up leaves out (docs/replay.md, the closed loop).
        return (
            f"{promise}, the quota window ({window_text}), as modelled and replayed. On the wire the load averaged "
            "over a run sits at the limit, but single buckets of the window's length can run over it: Kafka slows a "
            "client down only after it has gone over its quota, and lets a throttled client catch up whenever the "
            "oldest second of its window expires, so where a bucket starts moves its figure (one closed-loop run on "
            "real Kafka read 102.7 % or 126.2 % of the limit by that alone, averaged 99.4 %, every throttle exactly "
            "Kafka's). Not covered either: single seconds, and the first quota window after a client starts or has "
            "been idle, when Kafka lets it send a whole window's worth of its quota at once. For a bound on every "
            "bucket, advise at a resolution shorter than the window (--headroom-resolution 1s plans for the bursts)."
        )
    return f"{promise}, longer than the {window_text} quota window over which Kafka holds a client to its quota."


_METRICS = ("bytes_in", "bytes_out", "produce_bytes", "fetch_bytes")
# The columns of analyze_transform.aggregate_traffic's rows the series are made of.
TRAFFIC_COLUMNS = ("second", "broker", "principal", "client_id", *_METRICS)


def aggregate(traffic: pd.DataFrame, options: AdviseOptions, unit: int) -> Series:
    """Broker series and each entity's Produce/Fetch bytes per broker and bucket of `unit` s, from
    the traffic sums (aggregate_traffic's rows, TRAFFIC_COLUMNS of them, collected: about a
    twentieth of the capture's rows). Every sum is of whole bytes, exact in doubles in any order,
    so these are the sums Spark's aggregations of the same rows gave; each is divided by the
    seconds of the capture in its bucket, so that partial first and last buckets are not
    under-counted."""
    if not len(traffic):
        raise ValueError(f"capture {options.capture} holds no requests")
    first, last = int(traffic["second"].min()), int(traffic["second"].max())
    brokers = tuple(sorted(int(b) for b in traffic["broker"].unique()))
    first_bucket, covered = bucket_coverage(first, last, unit)
    buckets = len(covered)
    bucketed = traffic.assign(bucket=traffic["second"] // unit)
    per_broker = bucketed.groupby(["broker", "bucket"])[list(_METRICS)].sum()
    broker_rates: dict[int, dict[str, np.ndarray]] = {}
    for broker in brokers:
        rows = per_broker.loc[broker]
        index = (rows.index.to_numpy() - first_bucket).astype(int)
        broker_rates[broker] = {}
        for metric in _METRICS:
            values = np.zeros(buckets)
            values[index] = rows[metric].to_numpy(dtype=np.float64) / covered[index]
            broker_rates[broker][metric] = values

    keys = ENTITY_COLUMNS[options.entity]
    moving = bucketed[(bucketed["produce_bytes"] > 0) | (bucketed["fetch_bytes"] > 0)]
    per_entity = (
        moving.groupby([*keys, "broker", "bucket"])[["produce_bytes", "fetch_bytes"]]
        .sum()
        .rename(columns={"produce_bytes": PRODUCE, "fetch_bytes": FETCH})
        .reset_index()
    )
    demand: dict[tuple[QuotaEntity, str], np.ndarray] = {}
    broker_row = {broker: i for i, broker in enumerate(brokers)}
    for key, rows in per_entity.groupby(list(keys)):
        entity = entity_of(options.entity, key if isinstance(key, tuple) else (key,))
        bucket = (rows["bucket"].to_numpy() - first_bucket).astype(int)
        broker = rows["broker"].map(broker_row).to_numpy().astype(int)
        for quota_type in BYTE_RATE_TYPES:
            values = rows[quota_type].to_numpy(dtype=np.float64)
            if values.sum() <= 0:
                continue
            matrix = np.zeros((len(brokers), buckets))
            np.add.at(matrix, (broker, bucket), values / covered[bucket])
            demand[(entity, quota_type)] = matrix
    pairs = traffic[["principal", "client_id"]].drop_duplicates().reset_index(drop=True)
    return Series(brokers, first_bucket, unit, covered, broker_rates, demand, pairs, (first, last))


def limits_of(capacity_file: cap.CapacityFile, brokers: Sequence[int], options: AdviseOptions) -> dict[Resource, float]:
    """Each broker's NW_IN / NW_OUT limit in bytes/s: its capacity x the threshold, as analyze's headroom."""
    thresholds = {cap.NW_IN: options.nw_in_threshold, cap.NW_OUT: options.nw_out_threshold}
    return {
        (broker, resource): capacity_file.for_broker(broker).network_bytes_per_s(resource) * thresholds[resource]
        for broker in brokers
        for resource in cap.NETWORK_RESOURCES
    }


def build_problem(
    series: Series, limits: Mapping[Resource, float], options: AdviseOptions, windows: Mapping[str, int]
) -> Problem:
    """The water-filling problem: quotable flows, and everything else as background."""
    window_seconds = windows["window_num"] * windows["window_size_seconds"]
    # Kafka's Rate divides the retained samples by at least (window_num - 1) windows, and the
    # current sample has barely begun just after a window boundary: there the rate it measures
    # is the mean of the last (num - 1) windows alone, once every window. The model compares
    # quotas with that mean, so a client Kafka would throttle at a boundary is seen as throttled.
    measured_seconds = max(windows["window_num"] - 1, 1) * windows["window_size_seconds"]
    # Background: what the broker carried beyond the Produce/Fetch bytes a byte-rate quota charges
    # (other APIs, headers, ...). It is not quotable, so it is carried through every trial unchanged.
    background = {}
    for broker in series.brokers:
        rates = series.broker_rates[broker]
        background[(broker, cap.NW_IN)] = np.maximum(rates["bytes_in"] - rates["produce_bytes"], 0.0)
        background[(broker, cap.NW_OUT)] = np.maximum(rates["bytes_out"] - rates["fetch_bytes"], 0.0)
    names = {entity_name(entity) for entity, _ in series.demand}
    unknown = [name for name in (*options.weights, *options.protect) if name not in names]
    if unknown:
        raise ValueError(f"--weight/--protect name entities the capture does not have: {', '.join(sorted(unknown))}")
    flows = [
        Flow(
            entity=entity,
            quota_type=quota_type,  # type: ignore[arg-type]
            demand=matrix,
            weight=options.weights.get(entity_name(entity), 1.0),
            protected=entity_name(entity) in options.protect,
        )
        for (entity, quota_type), matrix in sorted(
            series.demand.items(), key=lambda item: (entity_name(item[0][0]), item[0][1])
        )
    ]
    return Problem(
        brokers=series.brokers,
        limits=limits,
        background=background,
        flows=flows,
        replication_factor=options.replication_factor,
        scope=options.scope,
        stat=options.headroom_stat,
        floor=options.floor,
        # The measured window in buckets: 11 x 1 s windows at 1 s buckets average 10 buckets, at 10 s 1.
        window_buckets=max(1, round(measured_seconds / series.unit)),
        # At buckets shorter than the quota window a throttled client bursts above its quota
        # (up to the window's allowance in one bucket); advice_math plans for that burst.
        burst_factor=max(
            1.0, options.burst_factor if options.burst_factor is not None else window_seconds / series.unit
        ),
    )
