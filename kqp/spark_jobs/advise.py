"""`advise`: the quotas to set so that no broker runs past its capacity, from a capture.

Run locally::

    kqp replay advise CAPTURE_DIR --capacity capacity.json --output OUT \
        [--current quotas.yaml] [--weight ENTITY=W] [--protect ENTITY] [--floor BYTES_PER_S] \
        [--entity client-id|user|user,client-id] [--scope broker|cluster] [--burst-factor X]

On a cluster::

    kqp replay --package /tmp/kqp.zip
    spark-submit --master yarn --py-files /tmp/kqp.zip --files capacity.json \
        kqp/spark_jobs/advise.py hdfs:///captures/kqp --capacity capacity.json --output /shared/out/advise

Steps: Spark aggregates the capture into per-bucket series (analyze's transforms: every
broker's client bytes in and out, and each entity's Produce and Fetch bytes per broker);
`advice_math.water_fill` (pure) proposes max-min fair byte-rate quotas that bring every
broker's NW_IN and NW_OUT, at analyze's headroom statistic and resolution with replication
modelled the same way, to capacity x threshold; `advice_math.choose_entries` writes them as
the fewest KIP-55 entries. The advised file is then loaded exactly as the proxy loads it
and replayed through the proxy's own quota engine and recording rules in deferral mode
(whatif's `simulate`), which gives each broker's load after throttling and each entity's
throttled share. Exit 3 when the advice cannot meet a limit, or the replay shows a broker
over its limit.

Outputs: quotas.yaml (kqp's own config format, a comment per entry saying why),
summary.json, report.html / report.md with plots, tables/*.parquet and csv/*.csv.
"""

from __future__ import annotations

import argparse
import functools
import io
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from kqp.config.models import entity_text as entity_label
from kqp.protocol.api_keys import ApiKey
from kqp.quotas import capacity as cap
from kqp.quotas.settings import DEFAULT_ENTITY, QuotaEntity, QuotaSettings, Scope
from kqp.spark_jobs.advice_math import (
    BYTE_RATE_TYPES,
    FETCH,
    GRANULARITIES,
    PRODUCE,
    STATS,
    UNLIMITED_QUOTA,
    Advice,
    Entry,
    Flow,
    FlowAdvice,
    Granularity,
    Problem,
    Resource,
    choose_entries,
    replication_shares,
    statistic,
    water_fill,
)
from kqp.spark_jobs.analyze_transform import RESOLUTIONS, aggregate_traffic, prepare_requests, throughput_series
from kqp.spark_jobs.capture_source import read_capture
from kqp.spark_jobs.common import BUDGET_EXIT_CODE, HelpFormatter, Progress
from kqp.spark_jobs.session import fit_shuffle_partitions, to_pandas

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
    rounds: int = 3
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


def _covered(first_second: int, last_second: int, unit: int) -> tuple[int, np.ndarray]:
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
            f"{promise}, the quota window ({window_text}), as modelled and replayed. On the wire expect up to "
            "about 10 % over the limit: Kafka slows a client down only after it has gone over its quota, so a "
            "throttled client runs a few % over it on average. Not covered: single seconds, and the first quota "
            "window after a client starts or has been idle, when Kafka lets it send a whole window's worth of "
            "its quota at once (one closed-loop run on real Kafka read 108 % of the limit past that first window, "
            "123 % with it)."
        )
    return f"{promise}, longer than the {window_text} quota window over which Kafka holds a client to its quota."


def aggregate(spark: SparkSession, traffic: DataFrame, options: AdviseOptions, unit: int) -> Series:
    """Spark's part: broker series and each entity's Produce/Fetch bytes per broker and bucket of `unit` s."""
    row = traffic.agg(
        F.min("second").alias("first"), F.max("second").alias("last"), F.collect_set("broker").alias("brokers")
    ).first()
    if row is None or row["first"] is None:
        raise ValueError(f"capture {options.capture} holds no requests")
    brokers = tuple(sorted(int(b) for b in row["brokers"]))
    first_bucket, covered = _covered(int(row["first"]), int(row["last"]), unit)
    buckets = len(covered)
    series = to_pandas(
        throughput_series(spark, traffic, unit, (int(row["first"]), int(row["last"])), brokers).select(
            "broker", "bucket", "bytes_in", "bytes_out", "produce_bytes", "fetch_bytes"
        )
    )
    broker_rates: dict[int, dict[str, np.ndarray]] = {}
    for broker in brokers:
        rows = series[series["broker"] == broker].sort_values("bucket")
        index = (rows["bucket"].to_numpy() - first_bucket).astype(int)
        broker_rates[broker] = {}
        for metric in ("bytes_in", "bytes_out", "produce_bytes", "fetch_bytes"):
            values = np.zeros(buckets)
            values[index] = rows[metric].to_numpy(dtype=np.float64)
            broker_rates[broker][metric] = values

    keys = ENTITY_COLUMNS[options.entity]
    per_entity = to_pandas(
        traffic.where((F.col("produce_bytes") > 0) | (F.col("fetch_bytes") > 0))
        .groupBy(*keys, "broker", F.floor(F.col("second") / unit).cast("long").alias("bucket"))
        .agg(F.sum("produce_bytes").alias(PRODUCE), F.sum("fetch_bytes").alias(FETCH))
    )
    # Bytes -> bytes/s per (broker row, bucket), dividing by the seconds of the capture in the
    # bucket so that partial first and last buckets are not under-counted.
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
    pairs = to_pandas(traffic.select("principal", "client_id").distinct())
    return Series(
        brokers, first_bucket, unit, covered, broker_rates, demand, pairs, (int(row["first"]), int(row["last"]))
    )


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


# ---------------------------------------------------------------- quotas.yaml


def _rate(value: float) -> str:
    """A rate for the comments of quotas.yaml, in decimal units (1 MB/s = 10^6 B/s)."""
    for unit, size in (("MB/s", 1e6), ("KB/s", 1e3)):
        if value >= size:
            return f"{value / size:,.2f} {unit}"
    return f"{value:,.0f} B/s"


def _why(flow: FlowAdvice, throttled: Mapping[QuotaEntity, float], stat: str) -> str:
    """The one-line reason written above a flow's entry: demand, the rule that set the quota, replay outcome.

    Both demand figures are of the rate the quota measures (advice_math.FlowAdvice), so the
    statistic never reads above the peak.
    """
    kind = "produce" if flow.quota_type == PRODUCE else "fetch"
    text = f"{kind} {_rate(flow.demand_stat)} at the {stat}, {_rate(flow.demand_peak)} at the peak; {flow.reason}"
    if flow.quota is not None and flow.fair_share is not None:
        text += f" ({_rate(flow.fair_share)})"
    share = throttled.get(flow.entity)
    if share is not None:
        text += f"; throttled {share:.1%} of requests in the replay"
    return text


def _yaml_entity(entity: QuotaEntity) -> CommentedMap:
    # Double-quoted, in flow style ({user: "...", client-id: "..."}): any name survives, quotes included.
    names = CommentedMap()
    if entity.user is not None:
        names["user"] = DoubleQuotedScalarString(entity.user)
    if entity.client_id is not None:
        names["client-id"] = DoubleQuotedScalarString(entity.client_id)
    names.fa.set_flow_style()
    return names


def _entry_comments(
    entry: Entry, flows: Sequence[FlowAdvice], by_entity: Mapping[QuotaEntity, list[FlowAdvice]],
    explicit: set[QuotaEntity], throttled: Mapping[QuotaEntity, float], stat: str,
) -> list[str]:
    """The comment lines above an entry: why each of its quotas is what it is."""
    if DEFAULT_ENTITY not in (entry.entity.user, entry.entity.client_id):
        return [f"{entity_label(flow.entity)}: {_why(flow, throttled, stat)}"
                for flow in by_entity.get(entry.entity, [])]
    # A <default> entry covers every entity without an entry of its own (KIP-55), so its comment
    # names those entities rather than one flow.
    lines = []
    for quota_type, value in entry.limits.items():
        covered = [f for f in flows if f.quota_type == quota_type and f.entity not in explicit and f.quota is not None]
        below = [f for f in flows if f.quota_type == quota_type and f.entity not in explicit and f.quota is None]
        names = ", ".join(entity_label(f.entity) for f in covered[:10]) + (" ..." if len(covered) > 10 else "")
        lines.append(f"{quota_type} {value}: the fair share of {len(covered)} entities without an entry "
                     f"of their own ({names}); {len(below)} others never went above it")
    lines += [f"  {entity_label(flow.entity)}: {_why(flow, throttled, stat)}"
              for flow in [f for f in flows if f.entity not in explicit and f.quota is not None][:10]]
    return lines


def render_quotas_yaml(
    entries: Sequence[Entry],
    flows: Sequence[FlowAdvice],
    throttled: Mapping[QuotaEntity, float],
    header: Sequence[str],
    scope: Scope,
    windows: Mapping[str, int],
    stat: str = "p99",
) -> str:
    """quotas.yaml in kqp's own format (`kqp check-config` / `kqp serve --config`), with a
    comment per entry saying why; written by ruamel.yaml, as the proxy writes its quota file back."""
    by_entity: dict[QuotaEntity, list[FlowAdvice]] = {}
    for flow in flows:
        by_entity.setdefault(flow.entity, []).append(flow)
    explicit = {entry.entity for entry in entries}
    listed = CommentedSeq()
    for index, entry in enumerate(entries):
        item = CommentedMap(entity=_yaml_entity(entry.entity))
        for quota_type, value in entry.limits.items():
            item[quota_type] = value
            if value == UNLIMITED_QUOTA:
                item.yaml_add_eol_comment("Long.MAX_VALUE: no quota (exempt from the <default> entry)", quota_type)
        listed.append(item)
        # A blank line, then the reasons, above each entry.
        comments = _entry_comments(entry, flows, by_entity, explicit, throttled, stat)
        listed.yaml_set_comment_before_after_key(index, before="\n".join(["", *comments]), indent=4)
    quotas = CommentedMap(scope=scope)
    quotas.update(windows)
    quotas["entries"] = listed
    document = CommentedMap(quotas=quotas)
    document.yaml_set_start_comment("\n".join(header))
    writer = YAML()
    writer.indent(mapping=2, sequence=4, offset=2)
    writer.width = 1 << 16  # one line per value, however long a name
    text = io.StringIO()
    writer.dump(document, text)
    return text.getvalue()


# ---------------------------------------------------------------- verification


@dataclass
class Verification:
    """The advised file replayed through the proxy's engine (deferral mode)."""

    loads: dict[Resource, float]
    series: dict[Resource, np.ndarray]
    clients: pd.DataFrame
    warm_up_buckets: int


def verify(
    spark: SparkSession,
    raw: DataFrame,
    settings: QuotaSettings,
    series: Series,
    options: AdviseOptions,
    before: Mapping[Resource, np.ndarray],
    warm_up_buckets: int,
) -> Verification:
    """Replay the advised quotas through kqp.quotas (whatif's simulate, deferral mode).

    The charged bytes of each Produce and Fetch move from the second they were recorded in
    to the second the replay sends them; the brokers' series change by that difference
    (replication modelled as in analyze), and the statistic is taken over the capture window
    plus the seconds the deferred traffic spills into, less the first quota window (warm-up).
    """
    from kqp.spark_jobs.whatif import (
        client_outcomes,
        engine_replay_functions,
        needs_cluster_wide_replay,
        sharing,
        simulate,
    )
    from kqp.spark_jobs.whatif import prepare_requests as whatif_requests

    link_users, link_client_ids = sharing(settings)
    simulated = simulate(
        spark,
        whatif_requests(raw),
        functools.partial(engine_replay_functions, settings),
        "deferral",
        link_users=link_users,
        link_client_ids=link_client_ids,
        per_broker=not needs_cluster_wide_replay(settings),
        # Tasks the advice can never throttle keep their recorded timeline: no replay needed.
        passthrough=settings,
    ).persist()
    clients = to_pandas(client_outcomes(simulated))
    unit = series.unit
    # Per (broker, API, bucket): the bytes the deferral moved out of it and into it. Summed in
    # Spark so that the driver gets one row per bucket, not one per (from, to) pair of buckets
    # (millions at 10M requests, when throttled clients run minutes behind their capture).
    moved_rows = (
        simulated.where(F.col("api_key").isin(ApiKey.PRODUCE, ApiKey.FETCH))
        .select(
            "broker",
            "api_key",
            F.floor(F.col("ts_ms") / (1000 * unit)).cast("long").alias("before"),
            F.floor(F.col("sim_ts_ms") / (1000 * unit)).cast("long").alias("after"),
            F.floor(F.col("sim_ts_ms") / 1000).cast("long").alias("sim_second"),
            "nbytes",
        )
        .where(F.col("before") != F.col("after"))
    )
    zero = F.lit(0).cast("long")
    moved = to_pandas(
        moved_rows.groupBy("broker", "api_key", F.col("before").alias("bucket"))
        .agg(
            F.sum("nbytes").alias("moved_out"),
            zero.alias("moved_in"),
            zero.alias("arrivals"),
            F.lit(None).cast("long").alias("last_second"),
        )
        .unionByName(
            moved_rows.groupBy("broker", "api_key", F.col("after").alias("bucket")).agg(
                zero.alias("moved_out"),
                F.sum("nbytes").alias("moved_in"),
                F.count("*").alias("arrivals"),
                F.max("sim_second").alias("last_second"),
            )
        )
        .groupBy("broker", "api_key", "bucket")
        .agg(
            *[F.sum(c).alias(c) for c in ("moved_out", "moved_in", "arrivals")],
            F.max("last_second").alias("last_second"),
        )
    )
    simulated.unpersist()
    # The replay spills past the capture up to the last bucket a deferred request reaches.
    arrived = moved.loc[moved["arrivals"] > 0, "bucket"]
    last = int(arrived.max()) if len(arrived) else series.first_bucket
    buckets = max(len(series.covered), last - series.first_bucket + 1)
    # The seconds each bucket spans in the capture (its bytes as captured are rate x these) and in
    # the replay, which runs on past the capture's last second while deferred requests arrive: a
    # last capture bucket covering 2 s of an 11 s bucket must not have 11 s of spill divided by 2.
    capture_covered = np.concatenate([series.covered, np.zeros(buckets - len(series.covered))])
    arrivals = moved["last_second"].dropna()
    last_second = max(series.seconds[1], int(arrivals.max()) if len(arrivals) else series.seconds[1])
    replay_covered = _covered(series.seconds[0], last_second, unit)[1]
    replay_covered = np.concatenate([replay_covered, np.full(max(buckets - len(replay_covered), 0), float(unit))])
    replay_covered = replay_covered[:buckets]
    # delta[(broker, api)]: the bytes the deferral moved out of (negative) and into (positive) each
    # bucket. Only the timing changes: deferral sends every byte, later.
    delta = {(b, k): np.zeros(buckets) for b in series.brokers for k in (ApiKey.PRODUCE, ApiKey.FETCH)}
    for row in moved.itertuples():
        key = (int(row.broker), int(row.api_key))
        index = int(row.bucket) - series.first_bucket
        if key in delta and 0 <= index < buckets:
            delta[key][index] += int(row.moved_in) - int(row.moved_out)
    # The client-side change, carried to the brokers' NW_IN/NW_OUT with advice_math's replication model.
    followers, spread = replication_shares(options.replication_factor, len(series.brokers))
    produce_total = sum(delta[(b, ApiKey.PRODUCE)] for b in series.brokers)
    after: dict[Resource, np.ndarray] = {}
    for broker in series.brokers:
        produced = delta[(broker, ApiKey.PRODUCE)]
        change = {
            cap.NW_IN: produced + spread * (produce_total - produced),
            cap.NW_OUT: delta[(broker, ApiKey.FETCH)] + followers * produced,
        }
        for resource in cap.NETWORK_RESOURCES:
            base = np.concatenate([before[(broker, resource)], np.zeros(buckets - len(series.covered))])
            # Bytes in each bucket (as captured, plus what the deferral moved), over the seconds
            # the replay spans in it. At 1 s buckets both spans are 1 s: the rate plus the moved bytes.
            after[(broker, resource)] = np.maximum((base * capture_covered + change[resource]) / replay_covered, 0.0)
    # The replay starts every quota sensor empty, and Kafka's windowed rate lets a new sensor
    # take up to (window_num - 1) windows' worth of quota at once: the first quota window of
    # the replay shows that warm-up, which a running broker's sensors (warm for hours) do not.
    warm = min(warm_up_buckets, max(buckets - 1, 0))
    loads = {res: statistic(values[warm:], options.headroom_stat) for res, values in after.items()}
    return Verification(loads=loads, series=after, clients=clients, warm_up_buckets=warm)


def throttled_shares(clients: pd.DataFrame, granularity: Granularity) -> dict[QuotaEntity, float]:
    """Share of each entity's requests the replay throttled."""
    keys = list(ENTITY_COLUMNS[granularity])
    grouped = clients.groupby(keys)[["throttled_requests", "requests"]].sum()
    return {
        entity_of(granularity, key if isinstance(key, tuple) else (key,)): float(row.throttled_requests / row.requests)
        for key, row in grouped.iterrows()
        if row.requests
    }


# ---------------------------------------------------------------- the job


@dataclass
class AdviseResult:
    summary: dict[str, Any]
    tables: dict[str, pd.DataFrame]
    quotas_yaml: str
    advice: Advice
    series_before: dict[Resource, np.ndarray]
    series_after: dict[Resource, np.ndarray] | None
    violations: list[str]


def _before_series(series: Series, problem: Problem) -> dict[Resource, np.ndarray]:
    """The brokers' NW_IN / NW_OUT as captured (analyze's nw_in / nw_out)."""
    followers, spread = replication_shares(problem.replication_factor, len(series.brokers))
    cluster_produce = sum(series.broker_rates[b]["produce_bytes"] for b in series.brokers)
    result = {}
    for broker in series.brokers:
        rates = series.broker_rates[broker]
        result[(broker, cap.NW_IN)] = rates["bytes_in"] + spread * (cluster_produce - rates["produce_bytes"])
        result[(broker, cap.NW_OUT)] = rates["bytes_out"] + followers * rates["produce_bytes"]
    return result


def _windows(current: QuotaSettings | None, options: AdviseOptions) -> dict[str, int]:
    """The quota window of the advised file: --window-num / --window-size-seconds, else
    today's (--current), else Kafka's default (11 x 1 s).

    Written out, because the advice depends on it: a quota is measured over this window, and
    a client may burst above its quota for a part of it.
    """
    settings = current if current is not None else QuotaSettings()
    return {
        "window_num": options.window_num or settings.window_num,
        "window_size_seconds": options.window_size_seconds or settings.window_size_s,
    }


def run_advise(spark: SparkSession, options: AdviseOptions, progress: Progress | None = None) -> AdviseResult:
    """Aggregate, optimise, write and load the advised file, verify it; returns what `load` writes."""
    from kqp.spark_jobs.whatif import load_quota_settings

    progress = progress or Progress("advise", 3 + 2 * options.rounds)
    if options.headroom_stat not in STATS:
        raise ValueError(f"headroom stat must be one of {STATS}")
    if options.headroom_resolution not in ADVISE_RESOLUTIONS:
        raise ValueError(f"headroom resolution must be one of {ADVISE_RESOLUTIONS}")
    capacity_file = cap.load_capacity(options.capacity)
    current = load_quota_settings(options.current) if options.current else None

    fit_shuffle_partitions(spark, options.capture)
    raw = read_capture(spark, options.capture)
    traffic = aggregate_traffic(prepare_requests(raw).drop("partitions")).persist()
    windows = _windows(current, options)
    series = aggregate(spark, traffic, options, bucket_seconds(options, windows))
    traffic.unpersist()
    progress.step(f"aggregated {len(series.demand)} flows over {len(series.brokers)} brokers")

    limits = limits_of(capacity_file, series.brokers, options)
    problem = build_problem(series, limits, options, windows)
    before = _before_series(series, problem)
    out = Path(options.output)
    out.mkdir(parents=True, exist_ok=True)
    header = [
        f"Quotas advised by `kqp replay advise` for capture {options.capture}",
        f"capacity {options.capacity}, limits = capacity x threshold (NW_IN {options.nw_in_threshold}, "
        f"NW_OUT {options.nw_out_threshold}), judged at the {options.headroom_stat} of "
        f"{resolution_text(series.unit)} buckets, replication factor {options.replication_factor} (modelled), "
        f"entities by {options.entity}, floor {options.floor:,.0f} B/s.",
        guarantee(options.headroom_stat, series.unit, windows, problem.burst_factor),
        "Check it with `kqp check-config`; load it with `kqp serve --config` (live reload picks up a change).",
    ]
    quotas_path = out / "quotas.yaml"

    # Round 1 plans for the limits themselves. The model clips each bucket at the quota, but
    # Kafka measures a quota over its whole window (11 x 1 s by default), so a limited client
    # still bursts above it within a window; when the replay shows a resource over its limit,
    # the next round plans for the limit less that overshoot.
    planned = dict(limits)
    rounds: list[dict[str, Any]] = []
    for round_number in range(1, options.rounds + 1):
        advice = water_fill(replace(problem, limits=planned))
        entries = choose_entries(advice.flows, options.entity)
        progress.step(
            f"round {round_number}: {sum(f.limited for f in advice.flows)} flows limited in {len(entries)} entries"
        )
        quotas_path.write_text(
            render_quotas_yaml(entries, advice.flows, {}, header, options.scope, windows, options.headroom_stat)
        )
        # Loaded exactly as `kqp serve` loads it: the replay runs what the proxy would run.
        settings = load_quota_settings(str(quotas_path))
        if not options.verify or advice.unmet:
            verification = None
            break
        # The replay's sensors start empty: its first quota window is warm-up (a bucket longer than
        # the window is kept, or a short capture judged at 1 min would be judged on its spill alone).
        warm_up = windows["window_num"] * windows["window_size_seconds"] // series.unit
        verification = verify(spark, raw, settings, series, options, before, warm_up)
        over = {res: load for res, load in verification.loads.items() if load > limits[res] * (1 + 1e-9)}
        rounds.append(
            {
                "round": round_number,
                "planned_limits": {f"{b} {r}": v for (b, r), v in planned.items()},
                "replayed": {f"{b} {r}": v for (b, r), v in verification.loads.items()},
                "over": sorted(f"{b} {r}" for b, r in over),
            }
        )
        progress.step(f"round {round_number}: replayed the advice through kqp.quotas (deferral), {len(over)} over")
        if not over:
            break
        for res, load in over.items():
            # In proportion: the replay's overshoot comes from bursts between throttles, which
            # shrink with the quotas but not to nothing.
            planned[res] = planned[res] * limits[res] / load
    # The last round's advice is the one written, now with the replay's throttled share per entry.
    throttled = throttled_shares(verification.clients, options.entity) if verification is not None else {}
    quotas_yaml = render_quotas_yaml(
        entries, advice.flows, throttled, header, options.scope, windows, options.headroom_stat
    )
    quotas_path.write_text(quotas_yaml)

    # A violation is either a limit no quota can meet (unmet) or one the replay still finds exceeded
    # after the last round; either makes the job exit with BUDGET_EXIT_CODE.
    violations = list(advice.unmet)
    loads_table = _loads_table(advice, limits, verification)
    if verification is not None:
        for row in loads_table.itertuples():
            if row.verified_after > row.limit * (1 + 1e-9) and not any(
                v.startswith(f"broker {row.broker} {row.resource}:") for v in violations
            ):
                violations.append(
                    f"broker {row.broker} {row.resource}: the replay of the advised quotas leaves its "
                    f"{options.headroom_stat} at {row.verified_after:,.0f} B/s, over the limit of {row.limit:,.0f} B/s "
                    f"after {len(rounds)} rounds"
                )
    tables = {
        "advice": _advice_table(advice, throttled, verification),
        "entries": _entries_table(entries),
        "broker_loads": loads_table,
    }
    if verification is not None:
        tables["replay_clients"] = verification.clients.sort_values(["principal", "client_id"]).reset_index(drop=True)
    if current is not None:
        tables["diff"] = _diff(series.pairs, current, settings)
    summary = _summary(options, series, advice, entries, tables, violations, verification is not None)
    summary["rounds"] = rounds
    summary["burst_factor"] = problem.burst_factor
    summary["bucket_seconds"] = series.unit
    summary["guarantee"] = guarantee(options.headroom_stat, series.unit, windows, problem.burst_factor)
    progress.step("tables and summary")
    return AdviseResult(
        summary=summary,
        tables=tables,
        quotas_yaml=quotas_yaml,
        advice=advice,
        series_before=before,
        series_after=verification.series if verification else None,
        violations=violations,
    )


def _advice_table(
    advice: Advice, throttled: Mapping[QuotaEntity, float], verification: Verification | None
) -> pd.DataFrame:
    """One row per flow: demand, the advised quota and why, and the replay's throttled share."""
    rows = []
    for flow in advice.flows:
        rows.append(
            {
                "entity": entity_label(flow.entity),
                "quota_type": flow.quota_type,
                "weight": flow.weight,
                "protected": flow.protected,
                "demand_stat_bytes_per_s": flow.demand_stat,
                "demand_peak_bytes_per_s": flow.demand_peak,
                "limited": flow.limited,
                "quota_bytes_per_s": flow.quota,
                "fair_share_bytes_per_s": flow.fair_share,
                "binding": None if flow.binding is None else f"broker {flow.binding[0]} {flow.binding[1]}",
                "reason": flow.reason,
                "replay_throttled_share": throttled.get(flow.entity) if verification is not None else None,
            }
        )
    return pd.DataFrame(rows)


def _entries_table(entries: Sequence[Entry]) -> pd.DataFrame:
    """The entries as written to quotas.yaml; None in a column means the entry leaves that type alone."""
    return pd.DataFrame(
        [
            {
                "entity": entity_label(entry.entity),
                PRODUCE: entry.limits.get(PRODUCE),
                FETCH: entry.limits.get(FETCH),
            }
            for entry in entries
        ],
        columns=["entity", PRODUCE, FETCH],
    )


def _loads_table(advice: Advice, limits: Mapping[Resource, float], verification: Verification | None) -> pd.DataFrame:
    """Per resource: the true limit, the limit planned in the last round, and the load as captured,
    as modelled under the advice, and as replayed (NaN without --verify), all in bytes/s.
    """
    return pd.DataFrame(
        [
            {
                "broker": load.broker,
                "resource": load.resource,
                "limit": limits[(load.broker, load.resource)],
                "planned_limit": load.limit,
                "before": load.before,
                "modelled_after": load.after,
                "verified_after": verification.loads[(load.broker, load.resource)] if verification else math.nan,
                "background": load.background,
                "protected": load.protected,
            }
            for load in advice.loads
        ]
    )


def _diff(pairs: pd.DataFrame, current: QuotaSettings, advised: QuotaSettings) -> pd.DataFrame:
    """Per captured (principal, client-id): the limit it gets today and with the advice."""
    from kqp.quotas import QuotaEngine

    engines = {"current": QuotaEngine(current), "advised": QuotaEngine(advised)}
    rows = []
    for pair in pairs.sort_values(["principal", "client_id"]).itertuples():
        row: dict[str, Any] = {"principal": pair.principal, "client_id": pair.client_id}
        for quota_type in BYTE_RATE_TYPES:
            for name, engine in engines.items():
                row[f"{name}_{quota_type}"] = engine.quota(quota_type, pair.principal, pair.client_id)
            row[f"{quota_type}_changed"] = row[f"current_{quota_type}"] != row[f"advised_{quota_type}"]
        rows.append(row)
    return pd.DataFrame(rows)


def _summary(
    options: AdviseOptions,
    series: Series,
    advice: Advice,
    entries: Sequence[Entry],
    tables: Mapping[str, pd.DataFrame],
    violations: list[str],
    verified: bool,
) -> dict[str, Any]:
    return {
        "schema": SUMMARY_SCHEMA,
        "generated_at": pd.Timestamp.now(tz="UTC").isoformat(),
        "options": {
            "capture": options.capture,
            "capacity": options.capacity,
            "current": options.current,
            "entity": options.entity,
            "scope": options.scope,
            "weights": dict(options.weights),
            "protect": list(options.protect),
            "floor": options.floor,
            "replication_factor": options.replication_factor,
            "thresholds": {cap.NW_IN: options.nw_in_threshold, cap.NW_OUT: options.nw_out_threshold},
            "basis": f"{options.headroom_stat} of {resolution_text(series.unit)} buckets",
            "top_n": options.top_n,
        },
        "brokers": list(series.brokers),
        "buckets": len(series.covered),
        "fits": not violations,
        "unmet": violations,
        "limited": [
            {"entity": entity_label(f.entity), "quota_type": f.quota_type, "quota": f.quota, "reason": f.reason}
            for f in advice.flows
            if f.limited
        ],
        "entries": len(entries),
        "broker_loads": tables["broker_loads"].to_dict(orient="records"),
        "verified": verified,
        "not_advised": [
            "request_percentage (broker CPU cannot be judged from the capture)",
            "controller_mutation_rate",
            "connection_creation_rate",
        ],
    }


# ---------------------------------------------------------------- load


def _plot_loads(loads: pd.DataFrame) -> Any:
    """Each broker resource's load at the headroom statistic as a share of its limit (100 %)."""
    import matplotlib.pyplot as plt

    labels = [f"broker {b} {r}" for b, r in zip(loads["broker"], loads["resource"], strict=True)]
    positions = np.arange(len(loads))
    figure, axis = plt.subplots(figsize=(max(6, 1.4 * len(loads) + 2), 4))
    columns = [("before", "as captured"), ("modelled_after", "advised (modelled)")]
    if loads["verified_after"].notna().any():
        columns.append(("verified_after", "advised (replayed through kqp.quotas)"))
    width = 0.8 / len(columns)
    for offset, (column, label) in enumerate(columns):
        share = 100 * loads[column] / loads["limit"]
        axis.bar(positions + (offset - (len(columns) - 1) / 2) * width, share, width, label=label)
    axis.axhline(100, color="black", linestyle="--", linewidth=0.8)
    axis.set_xticks(list(positions), labels, rotation=20, ha="right")
    axis.set_ylabel("% of the limit (capacity x threshold)")
    axis.set_title("broker load at the headroom statistic, before and after the advice")
    axis.legend(fontsize="small")
    return figure


def _plot_series(result: AdviseResult, unit: int) -> Any:
    import matplotlib.pyplot as plt

    resources = sorted(result.series_before)
    figure, axes = plt.subplots(len(resources), 1, figsize=(11, 2.2 * len(resources) + 0.5), sharex=True)
    axes = np.atleast_1d(axes)
    limits = {(row.broker, row.resource): row.limit for row in result.tables["broker_loads"].itertuples()}
    for axis, resource in zip(axes, resources, strict=True):
        before = result.series_before[resource]
        axis.plot(np.arange(len(before)) * unit, before / 1e6, linewidth=0.8, label="as captured")
        if result.series_after is not None:
            after = result.series_after[resource]
            axis.plot(np.arange(len(after)) * unit, after / 1e6, linewidth=0.8, label="replayed with the advice")
        axis.axhline(limits[resource] / 1e6, color="black", linestyle="--", linewidth=0.8)
        axis.set_ylabel("MB/s")
        axis.set_title(f"broker {resource[0]} {resource[1]}", fontsize="small")
    axes[0].legend(loc="upper right", fontsize="small")
    axes[-1].set_xlabel("seconds from the start of the capture")
    return figure


def _plot_entities(advice: pd.DataFrame, top_n: int) -> Any:
    import matplotlib.pyplot as plt

    rows = advice.sort_values("demand_stat_bytes_per_s", ascending=False).head(top_n)
    kinds = ["produce" if t == PRODUCE else "fetch" for t in rows["quota_type"]]
    labels = [f"{entity} ({kind})" for entity, kind in zip(rows["entity"], kinds, strict=True)]
    allowed = [
        q if q is not None and not pd.isna(q) else d
        for q, d in zip(rows["quota_bytes_per_s"], rows["demand_stat_bytes_per_s"], strict=True)
    ]
    positions = np.arange(len(rows))
    figure, axis = plt.subplots(figsize=(10, max(2.5, 0.4 * len(rows) + 1)))
    axis.barh(positions + 0.2, rows["demand_stat_bytes_per_s"] / 1e6, 0.4, label="offered (statistic)")
    axis.barh(positions - 0.2, np.array(allowed) / 1e6, 0.4, label="allowed (quota, or all when unlimited)")
    axis.set_yticks(list(positions), labels)
    axis.invert_yaxis()
    axis.set_xlabel("MB/s")
    axis.set_title("offered vs allowed per entity")
    axis.legend(fontsize="small")
    return figure


def write_advise_outputs(result: AdviseResult, output: str, unit: int) -> None:
    from kqp.spark_jobs.report import Report, write_summary_and_report, write_tables

    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quotas.yaml").write_text(result.quotas_yaml)
    write_tables(out, result.tables)
    summary = result.summary
    options = summary["options"]
    report = Report("kqp quota advice", out)
    limited = summary["limited"]
    report.paragraph(
        f"Capture `{options['capture']}`, capacity `{options['capacity']}`, basis {options['basis']}, "
        f"entities by {options['entity']}, scope {options['scope']}: {len(limited)} quotas advised in "
        f"{summary['entries']} entries (`quotas.yaml`). "
        + ("The advice fits every broker." if summary["fits"] else "**The advice does not fit.**")
    )
    report.paragraph(summary["guarantee"])
    report.bullets([f"**Cannot be met:** {reason}" for reason in summary["unmet"]])
    report.heading("Broker load before and after")
    loads = result.tables["broker_loads"]
    report.figure("broker_loads", _plot_loads(loads), "broker load at the headroom statistic, before and after")
    report.figure("broker_series", _plot_series(result, unit), "network per broker over time, before and after")
    report.table(loads)
    report.heading("Offered vs allowed per entity")
    advice = result.tables["advice"]
    if len(advice):
        report.figure("entities", _plot_entities(advice, options["top_n"]), "offered vs allowed per entity")
    report.table(advice)
    report.heading("Entries written")
    report.table(result.tables["entries"])
    if "diff" in result.tables:
        report.heading(f"Against the current quotas (`{options['current']}`)")
        diff = result.tables["diff"]
        changed = diff[diff[[f"{t}_changed" for t in BYTE_RATE_TYPES]].any(axis=1)]
        report.paragraph(f"{len(changed)} of {len(diff)} captured (principal, client-id) pairs change limits.")
        report.table(changed)
    report.paragraph("Not advised: " + "; ".join(summary["not_advised"]) + ".")
    write_summary_and_report(out, summary, report, list(result.tables))


def _weight(text: str) -> tuple[str, float]:
    name, sep, value = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected ENTITY=WEIGHT, got {text!r}")
    try:
        weight = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"weight of {name!r} is not a number: {value!r}") from None
    if not weight > 0 or math.isinf(weight):
        raise argparse.ArgumentTypeError(f"weight of {name!r} must be a positive number, got {value!r}")
    return name, weight


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kqp replay advise",
        description="Propose byte-rate quotas that keep every broker under its capacity.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("capture", help="capture directory (local path or Hadoop-compatible URI)")
    parser.add_argument("--capacity", required=True, help="Cruise Control capacity JSON file")
    parser.add_argument("--output", required=True, help="output directory (local to the driver)")
    parser.add_argument(
        "--current",
        help="the quota config in force today: the report shows the difference, and its quota window is "
        "the advice's (default: none, Kafka's 11 x 1 s window)",
    )
    parser.add_argument(
        "--weight", action="append", type=_weight, default=[], metavar="ENTITY=W", help="share weight (default 1)"
    )
    parser.add_argument(
        "--protect", action="append", default=[], metavar="ENTITY", help="never limit this entity (default: none)"
    )
    parser.add_argument("--floor", type=float, default=0.0, metavar="BYTES_PER_S", help="never limit below this")
    parser.add_argument(
        "--entity",
        choices=GRANULARITIES,
        default="client-id",
        help="quota entities: ENTITY names are CLIENT-ID, USER or USER/CLIENT-ID",
    )
    parser.add_argument(
        "--scope",
        choices=("broker", "cluster"),
        default="broker",
        help="broker: every broker enforces the quota on its own (Kafka's way); cluster: one budget over brokers",
    )
    parser.add_argument(
        "--replication-factor",
        type=int,
        default=3,
        help="replicas per partition, to model the followers' NW_IN and the leaders' NW_OUT",
    )
    parser.add_argument(
        "--nw-in-threshold",
        type=float,
        default=cap.DEFAULT_NETWORK_THRESHOLD,
        help="share of a broker's NW_IN capacity it may use (the limit is capacity x threshold)",
    )
    parser.add_argument(
        "--nw-out-threshold",
        type=float,
        default=cap.DEFAULT_NETWORK_THRESHOLD,
        help="share of a broker's NW_OUT capacity it may use",
    )
    parser.add_argument(
        "--headroom-stat", choices=STATS, default="p99", help="statistic of a broker's series judged against its limit"
    )
    parser.add_argument(
        "--headroom-resolution",
        choices=ADVISE_RESOLUTIONS,
        default=WINDOW_RESOLUTION,
        help="bucket length of the judged series: window = the quota window (window-num x window-size-seconds, "
        "the finest a quota holds a client to; default), 1s or 1min as analyze",
    )
    parser.add_argument(
        "--window-num", type=int, help="quota.window.num of the advised file (default: --current's, else 11)"
    )
    parser.add_argument(
        "--window-size-seconds", type=int, help="quota.window.size.seconds (default: --current's, else 1)"
    )
    parser.add_argument(
        "--burst-factor",
        type=float,
        help="how far above its quota a throttled client may go within one bucket "
        "(default: quota window / bucket, at least 1: 1 at the window resolution, 11 for 11 x 1 s at 1 s)",
    )
    parser.add_argument("--no-verify", action="store_true", help="skip the replay of the advice")
    parser.add_argument(
        "--rounds", type=int, default=3, help="replays at most, each planning for the overshoot the last one showed"
    )
    parser.add_argument("--top-n", type=int, default=20, help="entities in the offered-vs-allowed plot")
    parser.add_argument("--master", help="Spark master URL (default: spark-submit's, else local[*])")
    return parser


def options_from_args(args: argparse.Namespace) -> AdviseOptions:
    if args.floor < 0:
        raise SystemExit("kqp replay advise: --floor must be >= 0")
    return AdviseOptions(
        capture=args.capture,
        capacity=args.capacity,
        output=args.output,
        current=args.current,
        weights=dict(args.weight),
        protect=tuple(args.protect),
        floor=args.floor,
        entity=args.entity,
        scope=args.scope,
        replication_factor=args.replication_factor,
        nw_in_threshold=args.nw_in_threshold,
        nw_out_threshold=args.nw_out_threshold,
        headroom_stat=args.headroom_stat,
        headroom_resolution=args.headroom_resolution,
        verify=not args.no_verify,
        rounds=max(1, args.rounds),
        window_num=args.window_num,
        window_size_seconds=args.window_size_seconds,
        burst_factor=args.burst_factor,
        top_n=args.top_n,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run advise; exit 0, or 3 when the advice cannot keep some broker under its limit."""
    from kqp.spark_jobs.session import get_spark

    args = build_parser().parse_args(argv)
    options = options_from_args(args)
    spark = get_spark("kqp-advise", args.master)
    progress = Progress("advise", 4 + 2 * options.rounds)
    result = run_advise(spark, options, progress)
    write_advise_outputs(result, options.output, int(result.summary["bucket_seconds"]))
    progress.step(f"wrote {options.output}/quotas.yaml, report.html and summary.json")
    for violation in result.violations:
        print(f"ADVICE DOES NOT FIT: {violation}", file=sys.stderr)
    return BUDGET_EXIT_CODE if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
