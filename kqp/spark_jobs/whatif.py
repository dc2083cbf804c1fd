"""`whatif`: what a quota config would have done to the captured traffic.

Run locally::

    kqp replay whatif CAPTURE_DIR --quotas quotas.yaml --output OUT [--mode deferral] [--calibrate]

On a cluster::

    cd /path/to/kqp && zip -qr /tmp/kqp.zip kqp
    spark-submit --master yarn --py-files /tmp/kqp.zip --files quotas.yaml \\
        kqp/spark_jobs/whatif.py hdfs:///captures/kqp --quotas quotas.yaml --output /shared/out/whatif

Every request goes through `kqp.quotas` (the proxy's own engine, not a re-implementation),
recorded the way the proxy records it (kqp/proxy/policies/kafka_charging.py): Produce by request size,
Fetch by response size, request time by the broker round trip (less a long-poll's wait),
at the instant the response came back; the throttle is the largest of them. The broker
is the upstream node label (`1`, `2`, ... or `bootstrap`, as the proxy names it), and the
engine applies the scope of each budget (per broker, as Kafka, or cluster-wide) from the
settings. (principal, client-id) pairs that could share a sensor under the config are
grouped (quota_replay.quota_groups); each group, and each broker of it when every budget
is per broker, is replayed in time order by `groupBy(...).applyInPandas`, with its own
engine; CreateTopics / CreatePartitions / DeleteTopics are charged to the controller-mutation
quota (KIP-599) when they arrived, with the partitions the capture records.

Outputs per (principal, client-id): share of requests throttled, total and p50/p95/p99/max
throttle, bytes delayed, effective rate; per broker: peak bytes/s before and after
throttling (deferral mode moves traffic later); with --calibrate: simulated vs recorded
`proxy_throttle_ms` and the error.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kqp.protocol.api_keys import MUTATION_API_KEYS, ApiKey
from kqp.quotas.recording import (
    FETCH_QUOTA_API_KEYS,
    QuotaClient,
    broker_label,
    charge_request,
    request_charges,
)
from kqp.quotas.settings import QuotaSettings, QuotaType
from kqp.spark_jobs.capture_source import read_capture
from kqp.spark_jobs.common import ANONYMOUS, BUDGET_EXIT_CODE, HelpFormatter, Progress
from kqp.spark_jobs.quota_replay import (
    MODES,
    MUTATION_COLUMNS,
    RECORDED_COLUMNS,
    Mode,
    MutationFunction,
    charged_inputs,
    is_recorded,
    quota_groups,
    replay_group,
    replay_recorded,
)
from kqp.spark_jobs.replay_filter import ByteQuotaType, passthrough_tasks, task_quotas
from kqp.spark_jobs.replay_loop import EngineThrottle, ThrottleFunction
from kqp.spark_jobs.replay_partials import PARTIALS_SCHEMA, task_partials
from kqp.spark_jobs.session import to_pandas

SUMMARY_SCHEMA = "kqp.replay.whatif/1"
PRODUCER_BYTE_RATE: ByteQuotaType = "producer_byte_rate"
CONSUMER_BYTE_RATE: ByteQuotaType = "consumer_byte_rate"
# What a Produce or Fetch can charge is never more than the largest of these: the raw frame
# sizes (the recording rules subtract headers from them) or the charges the proxy recorded.
_CHARGE_BOUND_COLUMNS = ("request_bytes", "response_bytes", "quota_produce_bytes", "quota_fetch_bytes")
# The proxy's engine clock, call order and acks: what quota_replay.replay_recorded replays call by
# call. Deferral mode derives the charges from sizes and times (charged_inputs) and never reads them.
RECORDED_CALL_COLUMNS = (
    "quota_request_seq",
    "quota_request_now_ms",
    "quota_response_seq",
    "quota_response_now_ms",
    "acks",
)

# What each replayed group returns: the request as captured (ts_ms, nbytes, ...) and as
# simulated (sim_ts_ms: when it would have been sent; sim_throttle_ms: what it would get).
SIMULATED_SCHEMA = (
    "ts_ms long, connection_id long, broker int, principal string, client_id string, api_key int, nbytes long, "
    "request_time_ms double, recorded_throttle_ms double, quota_group int, sim_ts_ms long, sim_throttle_ms double"
)


@dataclass(frozen=True)
class WhatIfOptions:
    """The job's settings; the command line's defaults are read from these fields."""

    capture: str
    quotas: str  # a proxy config file: only its quota section is used
    output: str
    # open_loop: traffic is replayed at its captured times whatever the throttles (what the
    # clients would have been told); deferral: a throttled connection waits its throttle out
    # before sending again (what the brokers would have carried). See quota_replay.
    mode: Mode = "open_loop"
    calibrate: bool = False
    top_n: int = 20
    # A CI gate: exit BUDGET_EXIT_CODE when a client is throttled on more of its requests.
    budget_max_throttled_share: float | None = None


def load_quota_settings(config_path: str) -> QuotaSettings:
    """The quota settings of a proxy config file, read exactly as the proxy reads them."""
    # Imported here: only the driver reads the config file; the executors, which import this
    # module to replay, receive the parsed settings inside the engine factory.
    from kqp.config import load_config

    settings: QuotaSettings = load_config([config_path]).quota_settings()
    return settings


def needs_cluster_wide_replay(settings: QuotaSettings) -> bool:
    """True when some budget spans brokers, so a group cannot be replayed broker by broker."""
    return settings.scope == "cluster" or any(entry.scope == "cluster" for entry in settings.entries)


def engine_replay_functions(settings: QuotaSettings) -> tuple[ThrottleFunction, MutationFunction]:
    """A fresh kqp.quotas engine's request throttle and controller-mutation functions."""
    from kqp.quotas import QuotaEngine

    # One engine for both, as in the proxy: a group's mutation quota and its byte and
    # request quotas are charged to the same engine.
    engine = QuotaEngine(settings)

    def mutation(
        api_key: int,
        api_version: int,
        broker: int,
        principal: str,
        client_id: str,
        topics: list[tuple[str, int]],
        now_ms: int,
    ) -> float:
        charges = request_charges(api_key, api_version, 0, True, topics)
        client = QuotaClient(broker_label(broker), principal, client_id)
        return float(charge_request(engine, client, charges, now_ms).throttle_ms)

    return engine_throttle_function(settings, engine), mutation


def engine_throttle_function(settings: QuotaSettings, engine: Any = None) -> ThrottleFunction:
    """A throttle function backed by a fresh kqp.quotas engine (the proxy's own code).

    The engine applies the scope (per broker or cluster-wide) from the settings; the charges
    are the proxy's recording rules (kqp.quotas.recording) applied to one request's inputs
    (kqp.spark_jobs.replay_loop.EngineThrottle). Its `engine` attribute is the engine itself,
    for an exact replay of a capture that recorded its inputs: an attribute rather than a
    second return value keeps the ThrottleFunction signature that test doubles implement.
    """
    from kqp.quotas import QuotaEngine

    return EngineThrottle(engine if engine is not None else QuotaEngine(settings))


LIMIT_COLUMNS: dict[QuotaType, str] = {
    "producer_byte_rate": "produce_quota_bytes_per_s",
    "consumer_byte_rate": "fetch_quota_bytes_per_s",
    "request_percentage": "request_quota_percent",
}


def with_quota_limits(clients: pd.DataFrame, settings: QuotaSettings) -> pd.DataFrame:
    """Add the limits the config gives each (principal, client-id), as the engine resolves them."""
    from kqp.quotas import QuotaEngine

    engine = QuotaEngine(settings)
    frame = clients.copy()
    for quota_type, column in LIMIT_COLUMNS.items():
        frame[column] = [
            engine.quota(quota_type, principal, client_id)
            for principal, client_id in zip(frame["principal"], frame["client_id"], strict=True)
        ]
    return frame


def prepare_requests(raw: DataFrame) -> DataFrame:
    """The per-request columns the replay needs; the charges are derived on the executors by
    the proxy's own recording rules (quota_replay.charged_inputs)."""
    has_response = F.col("ts_response_received_us").isNotNull()
    round_trip = (F.col("ts_response_received_us") - F.col("ts_request_sent_us")) / 1000.0
    return raw.select(
        # The proxy records at the response; acks=0 Produce has none and records at the request.
        F.floor(F.coalesce(F.col("ts_response_received_us"), F.col("ts_request_received_us")) / 1000)
        .cast("long")
        .alias("ts_ms"),
        "connection_id",
        F.coalesce(F.col("upstream_node_id"), F.lit(-1)).alias("broker"),
        F.coalesce(F.col("principal"), F.lit(ANONYMOUS)).alias("principal"),
        F.coalesce(F.col("client_id"), F.lit("")).alias("client_id"),
        F.col("api_key").cast("int").alias("api_key"),
        F.col("api_version").cast("int").alias("api_version"),
        "request_bytes",
        "response_bytes",
        F.when(has_response, round_trip).otherwise(F.lit(float("nan"))).alias("round_trip_ms"),
        "fetch_max_wait_ms",
        F.coalesce(F.col("proxy_throttle_ms"), F.lit(0)).cast("double").alias("recorded_throttle_ms"),
        F.floor(F.col("ts_request_received_us") / 1000).cast("long").alias("request_ts_ms"),
        # As JSON text, decoded by the replay (decode_mutations): Spark 4's Arrow writer spends
        # most of the replay's JVM time on a list-of-struct column (ListVector.setValueCount, by
        # a JFR profile of a 1M-request whatif: 69 % of the task threads' samples), even when
        # nearly every value is null.
        F.when(
            F.col("api_key").isin(*MUTATION_API_KEYS),
            F.to_json(
                F.transform(
                    "mutations", lambda m: F.struct(m["topic"].alias("topic"), m["partitions"].alias("partitions"))
                )
            ),
        ).alias("mutations"),
        *[name for name in RECORDED_COLUMNS if name not in ("api_version", "mutations")],
    )


def decode_mutations(frame: pd.DataFrame) -> pd.DataFrame:
    """prepare_requests' `mutations` (JSON text) as quota_replay reads them: a list of
    {"topic", "partitions"} per mutation request, None for the others."""
    if "mutations" not in frame.columns:
        return frame
    decoded = [json.loads(text) if isinstance(text, str) else None for text in frame["mutations"].tolist()]
    frame = frame.copy()
    frame["mutations"] = pd.Series(decoded, index=frame.index, dtype=object)
    return frame


def sharing(settings: QuotaSettings) -> tuple[bool, bool]:
    """Whether the settings make client-ids of a user, or users of a client-id, share a sensor.

    A user-level entry (any user, no client-id) is shared by the user's client-ids; a
    client-id-level entry by the client-id's users. A quota callback may group clients any
    way it likes, so it links both.
    """
    if settings.callback is not None:
        return True, True
    users = any(e.entity.user is not None and e.entity.client_id is None for e in settings.entries)
    client_ids = any(e.entity.client_id is not None and e.entity.user is None for e in settings.entries)
    return users, client_ids


@dataclass(frozen=True)
class ReplayOptions:
    """How `simulate` replays a capture.

    `mode`: quota_replay's open_loop or deferral. `link_users` / `link_client_ids`: which
    (principal, client-id) pairs may share a sensor, so go to one task (`sharing`). `per_broker`:
    every budget is per broker (Kafka's way), so each broker's traffic of a group is its own task.
    `passthrough`: the settings the engines are built from; in deferral mode, the tasks they
    provably never throttle (kqp.spark_jobs.replay_filter) skip the engine (see `simulate`).
    """

    mode: Mode
    link_users: bool = True
    link_client_ids: bool = True
    per_broker: bool = True
    passthrough: QuotaSettings | None = None


def replay_options(settings: QuotaSettings, mode: Mode) -> ReplayOptions:
    """The options replaying `settings` takes: its sharing, its scope, and the pre-filter."""
    link_users, link_client_ids = sharing(settings)
    return ReplayOptions(
        mode,
        link_users=link_users,
        link_client_ids=link_client_ids,
        per_broker=not needs_cluster_wide_replay(settings),
        passthrough=settings,
    )


@dataclass(frozen=True)
class ReplayTraffic:
    """What the replay plans with, from one pass over its input: every (principal, client-id)
    pair, and per (broker, principal, client-id, byte quota type, second) an upper bound of the
    bytes charged (`charged`; the pre-filter's input).

    None of it depends on the quota settings, so advise's rounds, which replay the same capture
    under different advice, compute it once.
    """

    pairs: list[tuple[str, str]]
    charged: pd.DataFrame


def replay_traffic(requests: DataFrame, bounds: bool = True) -> ReplayTraffic:
    """One aggregation over `requests` (prepare_requests' rows) giving a ReplayTraffic (with
    `bounds=False`, the pairs alone: `charged` is then empty).

    The bound is what a Produce (Fetch) can charge at most: the largest of its raw request
    (response) size, which the recording rules only shrink, and the charges the proxy recorded.
    Requests of other APIs charge no bytes: they leave one row per (broker, pair) with no type,
    so that every pair is seen. A few rows per client and second: the driver holds them.
    """
    is_bytes = F.col("api_key").isin(ApiKey.PRODUCE, *FETCH_QUOTA_API_KEYS) & F.lit(bounds)
    quota_type = (
        F.when(is_bytes & (F.col("api_key") == ApiKey.PRODUCE), F.lit(PRODUCER_BYTE_RATE))
        .when(is_bytes, F.lit(CONSUMER_BYTE_RATE))
        .alias("quota_type")
    )
    upper = F.greatest(*[F.coalesce(F.col(c).cast("double"), F.lit(0.0)) for c in _CHARGE_BOUND_COLUMNS])
    second = F.when(is_bytes, F.floor(F.col("ts_ms") / 1000).cast("long")).alias("second")
    charged = to_pandas(
        requests.groupBy("broker", "principal", "client_id", quota_type, second).agg(
            F.sum(F.when(is_bytes, upper)).alias("bytes")
        )
    )
    pairs = sorted(set(zip(charged["principal"], charged["client_id"], strict=True)))
    charged = charged[charged["quota_type"].notna()].astype({"second": "int64"}).reset_index(drop=True)
    return ReplayTraffic(pairs=pairs, charged=charged)


def simulate(
    spark: SparkSession,
    requests: DataFrame,
    throttle_factory: Callable[[], ThrottleFunction | tuple[ThrottleFunction, MutationFunction]],
    options: ReplayOptions,
    summarise: Callable[[pd.DataFrame], pd.DataFrame] | None = None,
    traffic: ReplayTraffic | None = None,
) -> DataFrame:
    """Every request with its simulated send time and throttle (applyInPandas per quota group).

    `throttle_factory` runs on the executors, once per group, and returns a fresh engine's
    throttle function (a group owns its sensors), or that and its mutation function. With
    `options.per_broker` (every budget is per broker, Kafka's way) each broker's traffic of a
    group is replayed separately; otherwise a group's traffic on all brokers goes through one
    engine.

    `options.passthrough`: the settings `throttle_factory` builds its engines from. In deferral
    mode, the tasks those settings provably never throttle (kqp.spark_jobs.replay_filter) then
    skip the shuffle and the engine: their rows come back as the replay would return them, at
    their recorded times with no throttle. Not in open-loop mode, whose exact replay of recorded
    engine inputs runs on the proxy's engine clock rather than on ts_ms.

    `summarise`: applied to each task's replayed rows (and to the passed-through ones,
    _SUMMARY_ROWS at a time) before they leave the Python worker; its result, in PARTIALS_SCHEMA, is then the output
    instead of the rows (simulate_partials: each task's partial sums).

    `traffic`: replay_traffic(requests), when the caller has it already.
    """
    mode = options.mode
    filtering = options.passthrough is not None and mode == "deferral"
    traffic = traffic if traffic is not None else replay_traffic(requests, bounds=filtering)
    # Grouping is done on the driver: the distinct (principal, client-id) pairs are few
    # (thousands), and the linking is a union-find over them, not a DataFrame operation.
    groups = quota_groups(traffic.pairs, options.link_users, options.link_client_ids)
    pairs, mapping = pair_mapping(spark, groups)
    if mode == "deferral":
        # Read only by the open-loop replay of recorded engine calls: not shuffled for nothing.
        requests = requests.drop(*RECORDED_CALL_COLUMNS)
    grouped = numbered(requests, mapping)

    def replay(frame: pd.DataFrame) -> pd.DataFrame:
        rows = replay_task(with_pair_names(frame, pairs), throttle_factory, mode)
        return rows if summarise is None else summarise(rows)

    # With every budget per broker (Kafka's way), a group's brokers share no sensor, so each broker
    # of a group is its own task: more parallelism, same throttles. A cluster-wide budget needs the
    # whole group in one task, in one time order.
    keys = ("broker", "quota_group") if options.per_broker else ("quota_group",)
    schema = SIMULATED_SCHEMA if summarise is None else PARTIALS_SCHEMA
    if not filtering or options.passthrough is None:
        return grouped.groupBy(*keys).applyInPandas(replay, schema)
    flagged = passthrough_condition(spark, grouped, keys, groups, options.passthrough, traffic)
    if flagged is None:
        return grouped.groupBy(*keys).applyInPandas(replay, schema)
    replayed = flagged.where(~F.col(_PASSTHROUGH)).drop(_PASSTHROUGH).groupBy(*keys).applyInPandas(replay, schema)

    def passed_through(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        frames = (with_pair_names(frame, pairs) for frame in frames)
        if summarise is None:
            yield from _passed_through(frames)
            return
        # Summed per _SUMMARY_ROWS rows, not per Arrow batch: a summary costs tens of ms
        # whatever its size (pandas' fixed costs), more than the sums of a batch of a few
        # thousand rows. Partial sums add up the same however the rows are split.
        pending: list[pd.DataFrame] = []
        count = 0
        for rows in _passed_through(frames):
            pending.append(rows)
            count += len(rows)
            if count >= _SUMMARY_ROWS:
                yield summarise(pd.concat(pending, ignore_index=True))
                pending, count = [], 0
        if pending:
            yield summarise(pd.concat(pending, ignore_index=True))

    # No shuffle and no engine: only the proxy's recording rules, for the charged bytes.
    unchanged = flagged.where(F.col(_PASSTHROUGH)).drop(_PASSTHROUGH).mapInPandas(passed_through, schema)
    return replayed.unionByName(unchanged)


_PASSTHROUGH = "_kqp_passthrough"


Pairs = tuple[tuple[str, str], ...]


def pair_mapping(spark: SparkSession, groups: Mapping[tuple[str, str], int]) -> tuple[Pairs, DataFrame]:
    """The (principal, client-id) pairs in order, and a table giving each its number in that order
    and its quota group (`groups`), for `numbered`."""
    pairs = tuple(sorted(groups))
    mapping = spark.createDataFrame(
        [(p, c, number, groups[(p, c)]) for number, (p, c) in enumerate(pairs)],
        "principal string, client_id string, pair int, quota_group int",
    )
    return pairs, mapping


def numbered(requests: DataFrame, mapping: DataFrame) -> DataFrame:
    """`requests` with their pair's number and quota group (pair_mapping's table) in place of their
    principal and client-id: the rows cross to the Python workers (and are shuffled to their
    tasks) with an integer instead of two strings, which with_pair_names puts back there. A
    broadcast join keeps each input partition's rows in their order."""
    return requests.join(F.broadcast(mapping), ["principal", "client_id"]).drop("principal", "client_id")


def with_pair_names(frame: pd.DataFrame, pairs: Sequence[tuple[str, str]]) -> pd.DataFrame:
    """`frame` (numbered rows) with `principal` and `client_id` back, taken from `pairs` by
    number: the same str objects for every row of a pair, none built per row."""
    number = frame["pair"].to_numpy()
    frame["principal"] = np.array([p for p, _ in pairs], dtype=object)[number]
    frame["client_id"] = np.array([c for _, c in pairs], dtype=object)[number]
    return frame


# Passed-through rows summed at a time (simulate): about 25 MB of pandas frame.
_SUMMARY_ROWS = 200_000
SIMULATED_COLUMNS = tuple(name.split()[0] for name in SIMULATED_SCHEMA.split(", "))


def replay_task(
    frame: pd.DataFrame,
    throttle_factory: Callable[[], ThrottleFunction | tuple[ThrottleFunction, MutationFunction]],
    mode: Mode,
    charged: bool = False,
) -> pd.DataFrame:
    """One replay task's rows (a quota group, or a group's traffic on one broker) through a fresh
    engine, in SIMULATED_COLUMNS. `charged`: the rows carry their charges already (`nbytes`,
    `request_time_ms`: quota_replay.charged_inputs), else they are derived here."""
    frame = decode_mutations(frame)
    # A fresh engine per group: groups share no sensor by construction, and a group's
    # sensors must start empty to reproduce the proxy's from the capture's start.
    made = throttle_factory()
    throttle, mutation = made if isinstance(made, tuple) else (made, None)
    engine = getattr(throttle, "engine", None)
    if mode == "open_loop" and engine is not None and is_recorded(frame):
        # Capture v2: the proxy's own engine inputs, replayed call by call.
        result = replay_recorded(frame if charged else charged_inputs(frame), engine)
    else:
        # Captures older than the mutation columns cannot charge mutations: skip them
        # rather than charge them nothing.
        if mutation is not None and not set(MUTATION_COLUMNS) <= set(frame.columns):
            mutation = None
        result = replay_group(frame if charged else charged_inputs(frame), throttle, mode, mutation)
    return result[list(SIMULATED_COLUMNS)]


def as_recorded(charged: pd.DataFrame) -> pd.DataFrame:
    """Charged rows of a task the quotas never throttle, as replay_group would return them:
    at their recorded time, with no throttle (SIMULATED_COLUMNS)."""
    result = charged.copy(deep=False)
    result["sim_ts_ms"] = result["ts_ms"].astype("int64")
    result["sim_throttle_ms"] = 0.0
    return result[list(SIMULATED_COLUMNS)]


def _passed_through(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """Rows of never-throttled tasks, as replay_group returns them: recorded time, no throttle."""
    for frame in frames:
        yield as_recorded(charged_inputs(frame))


@dataclass(frozen=True)
class PassingTasks:
    """The replay tasks quota settings provably never throttle (kqp.spark_jobs.replay_filter):
    every task of a group in `free_groups` (no byte quota for any of its clients), and the tasks
    in `tasks` (keyed as the replay's tasks: (broker, quota_group) or (quota_group,))."""

    free_groups: frozenset[int]
    tasks: frozenset[tuple[int, ...]]

    def passes(self, task: tuple[int, ...]) -> bool:
        return task[-1] in self.free_groups or task in self.tasks  # quota_group is the last key


def passing_tasks(
    keys: tuple[str, ...],
    groups: Mapping[tuple[str, str], int],
    settings: QuotaSettings,
    traffic: ReplayTraffic,
) -> PassingTasks | None:
    """The tasks `settings` provably never throttle (None: no task).

    Groups whose clients have no byte quota at all pass whole, without looking at their traffic;
    groups with one are judged per task from an upper bound of the bytes they charge per second
    (`traffic.charged`, summed over the task's clients), by replay_filter.
    """
    from kqp.quotas import QuotaEngine

    pairs_of: dict[int, list[tuple[str, str]]] = {}
    for pair, group in groups.items():
        pairs_of.setdefault(group, []).append(pair)
    engine = QuotaEngine(settings)
    quotas = {group: task_quotas(engine, settings, pairs) for group, pairs in pairs_of.items()}
    free = {g for g, q in quotas.items() if q.bounded and all(v is None for v in q.smallest.values())}
    judged = sorted(g for g, q in quotas.items() if q.bounded and g not in free)
    passed: set[tuple[int, ...]] = set()
    if judged:
        charged = traffic.charged.assign(
            quota_group=[
                groups[pair] for pair in zip(traffic.charged["principal"], traffic.charged["client_id"], strict=True)
            ]
        )
        # Whole bytes summed in doubles: exact in any order, so a task's seconds are the same
        # sums whether its clients were added up here or request by request.
        per_second = (
            charged[charged["quota_group"].isin(judged)]
            .groupby([*keys, "quota_type", "second"], sort=False)["bytes"]
            .sum()
            .reset_index()
        )
        task_pairs: dict[tuple[int, ...], list[tuple[str, str]]] = {}
        per_task: dict[tuple[tuple[int, ...], ByteQuotaType], tuple[np.ndarray, np.ndarray]] = {}
        for (*task, kind), rows in per_second.groupby([*keys, "quota_type"]):
            key = tuple(int(k) for k in task)
            task_pairs[key] = pairs_of[key[-1]]  # quota_group is the last key
            per_task[(key, kind)] = (rows["second"].to_numpy(), rows["bytes"].to_numpy(dtype=np.float64))
        passed = passthrough_tasks(settings, task_pairs, per_task)
    if not free and not passed:
        return None
    return PassingTasks(free_groups=frozenset(free), tasks=frozenset(passed))


def passthrough_condition(
    spark: SparkSession,
    grouped: DataFrame,
    keys: tuple[str, ...],
    groups: Mapping[tuple[str, str], int],
    settings: QuotaSettings,
    traffic: ReplayTraffic,
) -> DataFrame | None:
    """`grouped` with a boolean column: whether its task is provably never throttled (None: no task is),
    as `passing_tasks` decides it."""
    passing = passing_tasks(keys, groups, settings, traffic)
    if passing is None:
        return None
    free, passed_tasks = sorted(passing.free_groups), sorted(passing.tasks)
    flag = F.col("quota_group").isin(*free) if free else F.lit(False)
    if passed_tasks:
        table = spark.createDataFrame(
            [(*task, True) for task in passed_tasks], ", ".join([*(f"{k} int" for k in keys), "_task_passes boolean"])
        )
        grouped = grouped.join(F.broadcast(table), list(keys), "left")
        flag = flag | F.coalesce(F.col("_task_passes"), F.lit(False))
        return grouped.withColumn(_PASSTHROUGH, flag).drop("_task_passes")
    return grouped.withColumn(_PASSTHROUGH, flag)


def client_outcomes(simulated: DataFrame) -> DataFrame:
    """Per (principal, client-id): throttling, bytes delayed and effective rate."""
    throttled = F.col("sim_throttle_ms") > 0
    # In deferral mode a request can be delayed without being throttled itself: it queued
    # behind a throttled one on its connection. Its bytes count as delayed too.
    delayed = F.col("sim_ts_ms") > F.col("ts_ms")
    # At least 1 s, so a client seen for an instant does not get an absurd rate.
    span_s = F.greatest((F.max("sim_ts_ms") - F.min("sim_ts_ms")) / 1000.0, F.lit(1.0))
    totals = simulated.groupBy("principal", "client_id").agg(
        F.count("*").alias("requests"),
        F.sum(F.when(throttled, 1).otherwise(0)).alias("throttled_requests"),
        F.sum("sim_throttle_ms").alias("throttle_ms_total"),
        F.max("sim_throttle_ms").alias("throttle_ms_max"),
        F.sum(F.when(throttled | delayed, F.col("nbytes")).otherwise(0)).alias("bytes_delayed"),
        F.sum("nbytes").alias("bytes"),
        (F.sum("nbytes") / span_s).alias("effective_bytes_per_s"),
        F.max(F.col("sim_ts_ms") - F.col("ts_ms")).alias("max_shift_ms"),
    )
    # Exact percentiles from (throttle, count) pairs: Spark's percentile keeps a value -> count
    # map either way, so the figures are the same, but throttles are whole milliseconds and
    # repeat, and counting them first in a plain hash aggregate spares the percentile's map
    # one update per request (at 10M requests, most of what the per-client table cost).
    quantiles = (
        simulated.groupBy("principal", "client_id", "sim_throttle_ms")
        .agg(F.count("*").alias("times"))
        .groupBy("principal", "client_id")
        .agg(F.percentile("sim_throttle_ms", [0.5, 0.95, 0.99], F.col("times")).alias("q"))
    )
    return _client_outcome_columns(totals.join(quantiles, ["principal", "client_id"]))


def _client_outcome_columns(joined: DataFrame) -> DataFrame:
    """The per-client table from its sums and its throttle percentiles (`q`), in its column order."""
    return joined.select(
        "principal",
        "client_id",
        "requests",
        "throttled_requests",
        (F.col("throttled_requests") / F.col("requests")).alias("throttled_share"),
        "throttle_ms_total",
        F.col("q")[0].alias("throttle_ms_p50"),
        F.col("q")[1].alias("throttle_ms_p95"),
        F.col("q")[2].alias("throttle_ms_p99"),
        "throttle_ms_max",
        "bytes",
        "bytes_delayed",
        "effective_bytes_per_s",
        "max_shift_ms",
    )


def broker_peaks(simulated: DataFrame) -> DataFrame:
    """Per broker and API: peak bytes/s as recorded and after throttling (simulated times)."""
    # Only the data APIs: their bytes are what fills a broker's network.
    counted = simulated.where(F.col("api_key").isin(ApiKey.PRODUCE, ApiKey.FETCH))

    def peak(time_column: str, name: str) -> DataFrame:
        """The busiest second of each (broker, API), by the given timestamp column."""
        per_second = counted.groupBy("broker", "api_key", F.floor(F.col(time_column) / 1000).alias("s")).agg(
            F.sum("nbytes").alias("bps")
        )
        return per_second.groupBy("broker", "api_key").agg(F.max("bps").alias(name))

    return peak("ts_ms", "recorded_peak_bytes_per_s").join(
        peak("sim_ts_ms", "simulated_peak_bytes_per_s"), ["broker", "api_key"]
    )


def calibration(simulated: DataFrame) -> DataFrame:
    """Per (principal, client-id): simulated vs recorded proxy throttles.

    Replaying a capture under the config the proxy ran with should give back the throttles
    the proxy gave; where it does not, the replay (or the capture) is not faithful, and the
    what-if of another config is not to be trusted either. Agreement is per request (both
    throttled or both not); the errors are in ms."""
    error = F.col("sim_throttle_ms") - F.col("recorded_throttle_ms")
    return simulated.groupBy("principal", "client_id").agg(
        F.count("*").alias("requests"),
        F.sum(F.when(F.col("recorded_throttle_ms") > 0, 1).otherwise(0)).alias("recorded_throttled"),
        F.sum(F.when(F.col("sim_throttle_ms") > 0, 1).otherwise(0)).alias("simulated_throttled"),
        F.sum(F.when((F.col("sim_throttle_ms") > 0) == (F.col("recorded_throttle_ms") > 0), 1).otherwise(0)).alias(
            "agreeing_requests"
        ),
        F.sum("recorded_throttle_ms").alias("recorded_throttle_ms_total"),
        F.sum("sim_throttle_ms").alias("simulated_throttle_ms_total"),
        F.mean(F.abs(error)).alias("mean_abs_error_ms"),
        F.max(F.abs(error)).alias("max_abs_error_ms"),
    )


def simulate_partials(
    spark: SparkSession,
    requests: DataFrame,
    throttle_factory: Callable[[], ThrottleFunction | tuple[ThrottleFunction, MutationFunction]],
    options: ReplayOptions,
    peaks: bool = False,
    moved_unit: int | None = None,
    traffic: ReplayTraffic | None = None,
) -> DataFrame:
    """simulate's replay, each task returning its partial sums (kqp.spark_jobs.replay_partials)
    instead of its rows: the figures below are merged from them, the same as from the rows."""
    summarise = functools.partial(task_partials, peaks=peaks, moved_unit=moved_unit)
    return simulate(spark, requests, throttle_factory, options, summarise=summarise, traffic=traffic)


def _part(partials: DataFrame, name: str) -> DataFrame:
    return partials.where(F.col("part") == name)


def client_outcomes_from_partials(partials: DataFrame) -> DataFrame:
    """client_outcomes, from simulate_partials' sums."""
    span_s = F.greatest((F.max("last_ms") - F.min("first_ms")) / 1000.0, F.lit(1.0))
    totals = (
        _part(partials, "client")
        .groupBy("principal", "client_id")
        .agg(
            F.sum("requests").alias("requests"),
            F.sum("throttled").alias("throttled_requests"),
            F.sum("throttle_ms").alias("throttle_ms_total"),
            F.max("throttle_ms_max").alias("throttle_ms_max"),
            F.sum("bytes_delayed").alias("bytes_delayed"),
            F.sum("bytes").alias("bytes"),
            (F.sum("bytes") / span_s).alias("effective_bytes_per_s"),
            F.max("max_shift_ms").alias("max_shift_ms"),
        )
    )
    quantiles = (
        _part(partials, "throttle")
        .groupBy("principal", "client_id", F.col("throttle_ms").alias("sim_throttle_ms"))
        .agg(F.sum("requests").alias("times"))
        .groupBy("principal", "client_id")
        .agg(F.percentile("sim_throttle_ms", [0.5, 0.95, 0.99], F.col("times")).alias("q"))
    )
    return _client_outcome_columns(totals.join(quantiles, ["principal", "client_id"]))


def broker_peaks_from_partials(partials: DataFrame) -> DataFrame:
    """broker_peaks, from simulate_partials' per-second bytes (made with `peaks=True`)."""

    def peak(part: str, name: str) -> DataFrame:
        per_second = _part(partials, part).groupBy("broker", "api_key", "bucket").agg(F.sum("bytes").alias("bps"))
        return per_second.groupBy("broker", "api_key").agg(F.max("bps").alias(name))

    return peak("recorded_second", "recorded_peak_bytes_per_s").join(
        peak("simulated_second", "simulated_peak_bytes_per_s"), ["broker", "api_key"]
    )


def moved_bytes_from_partials(partials: DataFrame) -> DataFrame:
    """Per (broker, API, bucket): the Produce and Fetch bytes the deferral moved out of it and
    into it, the requests arriving in it and the last second they reach (simulate_partials made
    with `moved_unit`; advise's verification reads it)."""
    moved_in = F.col("part") == "moved_in"
    return (
        partials.where(F.col("part").isin("moved_out", "moved_in"))
        .groupBy("broker", "api_key", "bucket")
        .agg(
            F.sum(F.coalesce(F.col("moved_out"), F.lit(0))).alias("moved_out"),
            F.sum(F.coalesce(F.col("moved_in"), F.lit(0))).alias("moved_in"),
            F.sum(F.when(moved_in, F.col("requests")).otherwise(0)).alias("arrivals"),
            F.max("last_second").alias("last_second"),
        )
    )


def calibration_from_partials(partials: DataFrame) -> DataFrame:
    """calibration, from simulate_partials' sums."""
    return (
        _part(partials, "client")
        .groupBy("principal", "client_id")
        .agg(
            F.sum("requests").alias("requests"),
            F.sum("recorded_throttled").alias("recorded_throttled"),
            F.sum("throttled").alias("simulated_throttled"),
            F.sum("agreeing").alias("agreeing_requests"),
            F.sum("recorded_throttle_ms").alias("recorded_throttle_ms_total"),
            F.sum("throttle_ms").alias("simulated_throttle_ms_total"),
            (F.sum("abs_error_ms") / F.sum("requests")).alias("mean_abs_error_ms"),
            F.max("abs_error_ms_max").alias("max_abs_error_ms"),
        )
    )


def run_whatif(spark: SparkSession, options: WhatIfOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Simulate and shape the results; returns {"summary": ..., "tables": {...}}."""
    progress = progress or Progress("whatif", 2 + options.calibrate)
    settings = load_quota_settings(options.quotas)
    requests = prepare_requests(read_capture(spark, options.capture))
    factory = functools.partial(engine_replay_functions, settings)
    # Each replay task hands back its partial sums, not its rows: the tables are merged from
    # them (small, so cached: the three tables read them).
    partials = simulate_partials(spark, requests, factory, replay_options(settings, options.mode), peaks=True).persist()
    clients = to_pandas(client_outcomes_from_partials(partials))
    rows = int(clients["requests"].sum())
    progress.step(f"replayed {rows} requests through kqp.quotas ({options.mode})")
    clients = clients.sort_values("throttle_ms_total", ascending=False)
    clients = with_quota_limits(clients, settings)
    peaks = to_pandas(broker_peaks_from_partials(partials)).sort_values(["broker", "api_key"])
    tables = {"clients": clients.reset_index(drop=True), "broker_peaks": peaks.reset_index(drop=True)}
    progress.step("per-client throttling and broker peaks")
    summary: dict[str, Any] = {
        "schema": SUMMARY_SCHEMA,
        "options": {"capture": options.capture, "quotas": options.quotas, "mode": options.mode, "top_n": options.top_n},
        "requests": int(rows),
        "throttled_requests": int(clients["throttled_requests"].sum()),
        "throttled_share": float(clients["throttled_requests"].sum() / max(rows, 1)),
        "throttle_ms_total": float(clients["throttle_ms_total"].sum()),
        "bytes_delayed": float(clients["bytes_delayed"].sum()),
        "top_clients": clients.head(options.top_n).to_dict(orient="records"),
        "broker_peaks": peaks.to_dict(orient="records"),
        # Connection creation is not in the capture (records are requests), so KIP-612
        # cannot be replayed; said in the summary rather than silently left out.
        "not_simulated": ["connection creation rate (KIP-612)"],
    }
    if options.calibrate:
        calibrated = (
            to_pandas(calibration_from_partials(partials))
            .sort_values(["principal", "client_id"])
            .reset_index(drop=True)
        )
        tables["calibration"] = calibrated
        recorded_total = float(calibrated["recorded_throttle_ms_total"].sum())
        simulated_total = float(calibrated["simulated_throttle_ms_total"].sum())
        summary["calibration"] = {
            "recorded_throttled_requests": int(calibrated["recorded_throttled"].sum()),
            "simulated_throttled_requests": int(calibrated["simulated_throttled"].sum()),
            "agreement": float(calibrated["agreeing_requests"].sum() / max(rows, 1)),
            "recorded_throttle_ms_total": recorded_total,
            "simulated_throttle_ms_total": simulated_total,
            "total_relative_error": (simulated_total - recorded_total) / recorded_total if recorded_total else None,
            "mean_abs_error_ms": float((calibrated["mean_abs_error_ms"] * calibrated["requests"]).sum() / max(rows, 1)),
        }
        progress.step("calibration against recorded proxy throttles")
    violations = []
    if options.budget_max_throttled_share is not None:
        worst = clients[clients["throttled_share"] > options.budget_max_throttled_share]
        violations = [
            f"{r.principal} / {r.client_id}: {r.throttled_share:.1%} of requests throttled" for r in worst.itertuples()
        ]
    summary["budget"] = {"max_throttled_share": options.budget_max_throttled_share, "violations": violations}
    partials.unpersist()
    return {"summary": summary, "tables": tables}


def _plot_throttled_clients(clients: pd.DataFrame, top_n: int) -> Any:
    import matplotlib.pyplot as plt

    top = clients.head(top_n)
    labels = [f"{p} / {c}" for p, c in zip(top["principal"], top["client_id"], strict=True)]
    figure, axes = plt.subplots(1, 2, figsize=(12, max(2.5, 0.35 * len(top) + 1)), sharey=True)
    axes[0].barh(list(reversed(labels)), list(reversed(top["throttled_share"] * 100)))
    axes[0].set_xlabel("% of requests throttled")
    axes[1].barh(list(reversed(labels)), list(reversed(top["throttle_ms_total"] / 1000)))
    axes[1].set_xlabel("total throttle (s)")
    figure.suptitle("clients by total simulated throttle")
    return figure


def _plot_broker_peaks(peaks: pd.DataFrame) -> Any:
    import matplotlib.pyplot as plt

    labels = [
        f"{b} {'produce' if k == ApiKey.PRODUCE else 'fetch'}"
        for b, k in zip(peaks["broker"], peaks["api_key"], strict=True)
    ]
    positions = range(len(peaks))
    figure, axis = plt.subplots(figsize=(9, 3.5))
    axis.bar([p - 0.2 for p in positions], peaks["recorded_peak_bytes_per_s"] / 1e6, 0.4, label="as recorded")
    axis.bar([p + 0.2 for p in positions], peaks["simulated_peak_bytes_per_s"] / 1e6, 0.4, label="after throttling")
    axis.set_xticks(list(positions), labels, rotation=30, ha="right")
    axis.set_ylabel("peak MB/s (1 s)")
    axis.set_title("broker peaks before and after the quota config")
    axis.legend()
    return figure


def write_whatif_outputs(result: dict[str, Any], output: str) -> None:
    from kqp.spark_jobs.report import Report, write_summary_and_report, write_tables

    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    write_tables(out, result["tables"])
    summary = result["summary"]
    options = summary["options"]
    clients = result["tables"]["clients"]
    report = Report("kqp quota what-if", out)
    report.paragraph(
        f"Capture `{options['capture']}`, quotas `{options['quotas']}`, mode **{options['mode']}**: "
        f"{summary['throttled_requests']:,} of {summary['requests']:,} requests throttled "
        f"({summary['throttled_share']:.2%}), {summary['throttle_ms_total']:,.0f} ms of throttle, "
        f"{summary['bytes_delayed']:,.0f} bytes delayed. Not simulated: {', '.join(summary['not_simulated'])}."
    )
    report.bullets([f"**Budget violated:** {violation}" for violation in summary["budget"]["violations"]])
    report.heading("Per client")
    if len(clients) and clients["throttle_ms_total"].sum() > 0:
        report.figure("throttled_clients", _plot_throttled_clients(clients, options["top_n"]), "throttled clients")
    report.table(clients)
    report.heading("Broker peaks (bytes/s) as recorded and after throttling")
    peaks = result["tables"]["broker_peaks"]
    if len(peaks):
        report.figure("broker_peaks", _plot_broker_peaks(peaks), "broker peaks before and after throttling")
    report.table(peaks)
    if "calibration" in summary:
        report.heading("Calibration against the recorded proxy throttles")
        report.bullets([f"{key}: {value}" for key, value in summary["calibration"].items()])
        report.table(result["tables"]["calibration"])
    write_summary_and_report(out, summary, report, list(result["tables"]))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kqp replay whatif", description="Quota what-if over a capture.", formatter_class=HelpFormatter
    )
    parser.add_argument("capture", help="capture directory (local path or Hadoop-compatible URI)")
    parser.add_argument("--quotas", required=True, help="quota config YAML (same format as the proxy's)")
    parser.add_argument("--output", required=True, help="output directory (local to the driver)")
    parser.add_argument(
        "--mode",
        choices=MODES,
        default=WhatIfOptions.mode,
        help="open_loop: traffic as recorded whatever the throttles; deferral: a throttled connection "
        "waits out its throttle and its later requests move with it",
    )
    parser.add_argument("--calibrate", action="store_true", help="compare with the recorded proxy throttles")
    parser.add_argument("--top-n", type=int, default=WhatIfOptions.top_n, help="rows in each top-N table")
    parser.add_argument(
        "--budget-max-throttled-share",
        type=float,
        help="exit 3 when a client is throttled on a larger share of its requests (default: no budget)",
    )
    parser.add_argument("--master", help="Spark master URL (default: spark-submit's, else local[*])")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from kqp.spark_jobs.session import get_spark

    args = build_parser().parse_args(argv)
    options = WhatIfOptions(
        capture=args.capture,
        quotas=args.quotas,
        output=args.output,
        mode=args.mode,
        calibrate=args.calibrate,
        top_n=args.top_n,
        budget_max_throttled_share=args.budget_max_throttled_share,
    )
    spark = get_spark("kqp-whatif", args.master)
    progress = Progress("whatif", 3 + options.calibrate)
    result = run_whatif(spark, options, progress)
    write_whatif_outputs(result, options.output)
    progress.step(f"wrote {options.output}/report.html and summary.json")
    for violation in result["summary"]["budget"]["violations"]:
        print(f"BUDGET VIOLATED: {violation}", file=sys.stderr)
    return BUDGET_EXIT_CODE if result["summary"]["budget"]["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
