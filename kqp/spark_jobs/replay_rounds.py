"""Deferral replays of one capture under one quota config after another (advise's rounds), the
rows prepared once and each replay a single pass over them.

whatif's `simulate_partials` replays a capture once: it reads and decodes the capture, shuffles
the rows to their replay tasks, derives each row's charges in the Python workers
(quota_replay.charged_inputs) and reads the capture a second time for the tasks the quotas never
throttle. Of that, only the tasks depend on the quotas, and only through how the config links
clients into quota groups (whatif.ReplayOptions: link_users, link_client_ids, per_broker), which
advise's rounds do not change: its rounds move the quota values. `ChargedReplays` prepares the
rows once per grouping: their charges (the proxy's own recording rules, as in every replay), their
quota group, and the rows partitioned by replay task, cached. A row carries its (principal,
client-id) pair as a number into the driver's list of pairs, not as two strings: the rows cross
to the Python workers and back, are shuffled and cached, and cross again in every round, and the
strings are put back from the list (a lookup per row, no string built) where a task replays.
Each replay is then one pass over
the cache: every task's rows go through the engine, but for the tasks the config provably never
throttles (whatif.passing_tasks), which are summed as recorded without it.

The partial sums are whatif's (replay_partials.task_partials) and so are the tables merged from
them: the rows and their charges are the same, the rows of each task reach the engine in the
same order (the partitioning shuffle reads the capture as the replay's own shuffle does, and
keeps each map task's order; replay_group then sorts stably by time and connection), and a
passed-through task's sums are the same whether it is summed alone or with other tasks' rows
(whole milliseconds and bytes, exact in any order).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import DoubleType, IntegerType, LongType, StructField, StructType

from kqp.spark_jobs.quota_replay import MUTATION_COLUMNS, MutationFunction, charged_inputs, quota_groups
from kqp.spark_jobs.replay_loop import ThrottleFunction
from kqp.spark_jobs.replay_partials import PARTIALS_SCHEMA, task_partials
from kqp.spark_jobs.whatif import (
    RECORDED_CALL_COLUMNS,
    PassingTasks,
    ReplayOptions,
    ReplayTraffic,
    as_recorded,
    numbered,
    pair_mapping,
    passing_tasks,
    replay_task,
    with_pair_names,
)

# What a deferral replay reads of a charged row (quota_replay.INPUT_COLUMNS and MUTATION_COLUMNS,
# and the recorded throttle the partial sums compare with), its principal and client-id as the
# number of their pair (_PAIR_FIELDS): the raw sizes and times the charges were derived from, and
# the capture's recorded engine calls, are not kept.
_KEPT_COLUMNS = ("ts_ms", "connection_id", "broker", "api_key", *MUTATION_COLUMNS, "recorded_throttle_ms")
_PAIR_FIELDS = (StructField("pair", IntegerType(), False), StructField("quota_group", IntegerType(), False))
_CHARGE_FIELDS = (StructField("nbytes", LongType()), StructField("request_time_ms", DoubleType()))
_CHARGED_COLUMNS = [*_KEPT_COLUMNS, *(field.name for field in (*_PAIR_FIELDS, *_CHARGE_FIELDS))]

ThrottleFactory = Callable[[], ThrottleFunction | tuple[ThrottleFunction, MutationFunction]]


@dataclass(frozen=True)
class _Prepared:
    """The charged rows of one grouping, partitioned by replay task and cached."""

    options: tuple[bool, bool, bool]  # link_users, link_client_ids, per_broker
    groups: dict[tuple[str, str], int]
    keys: tuple[str, ...]
    rows: DataFrame
    pairs: tuple[tuple[str, str], ...]  # (principal, client-id) of each pair number


class ChargedReplays:
    """Repeated deferral replays of `requests` (whatif.prepare_requests' rows), whose
    whatif.replay_traffic is `traffic`. `release` frees the cache."""

    def __init__(self, spark: SparkSession, requests: DataFrame, traffic: ReplayTraffic) -> None:
        self._spark = spark
        self._requests = requests
        self._traffic = traffic
        self._prepared: _Prepared | None = None

    def partials(self, throttle_factory: ThrottleFactory, options: ReplayOptions, moved_unit: int | None) -> DataFrame:
        """whatif.simulate_partials(..., moved_unit=moved_unit) of a deferral replay, from the cache."""
        if options.mode != "deferral":
            raise ValueError("ChargedReplays replays in deferral mode only")
        prepared = self._prepare(options)
        passing = (
            passing_tasks(prepared.keys, prepared.groups, options.passthrough, self._traffic)
            if options.passthrough is not None
            else None
        )
        replay = functools.partial(
            _replay_partition,
            keys=prepared.keys,
            throttle_factory=throttle_factory,
            passing=passing,
            moved_unit=moved_unit,
            pairs=prepared.pairs,
        )
        # A narrow map over the cache's partitions, which hold whole tasks: no shuffle, no sort.
        return prepared.rows.mapInPandas(replay, PARTIALS_SCHEMA)

    def release(self) -> None:
        if self._prepared is not None:
            self._prepared.rows.unpersist()
            self._prepared = None

    def _prepare(self, options: ReplayOptions) -> _Prepared:
        grouping = (options.link_users, options.link_client_ids, options.per_broker)
        if self._prepared is not None and self._prepared.options == grouping:
            return self._prepared
        self.release()
        groups = quota_groups(self._traffic.pairs, options.link_users, options.link_client_ids)
        pairs, mapping = pair_mapping(self._spark, groups)
        keys = ("broker", "quota_group") if options.per_broker else ("quota_group",)
        fields = {field.name: field for field in self._requests.schema.fields}
        schema = StructType([fields[name] for name in _KEPT_COLUMNS] + list(_PAIR_FIELDS) + list(_CHARGE_FIELDS))
        # The open-loop replay's recorded engine calls are not read in deferral mode: not sent to Python.
        inputs = numbered(self._requests.drop(*RECORDED_CALL_COLUMNS), mapping)
        # Filled by the first replay's pass (persist is lazy), read by every later one.
        rows = inputs.mapInPandas(_charged, schema).repartition(*keys).persist()
        self._prepared = _Prepared(grouping, groups, keys, rows, pairs)
        return self._prepared


def _charged(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """Each row's charges by the proxy's recording rules, with the columns a replay reads."""
    for frame in frames:
        yield charged_inputs(frame)[_CHARGED_COLUMNS]


def _replay_partition(
    frames: Iterator[pd.DataFrame],
    keys: tuple[str, ...],
    throttle_factory: ThrottleFactory,
    passing: PassingTasks | None,
    moved_unit: int | None,
    pairs: tuple[tuple[str, str], ...],
) -> Iterator[pd.DataFrame]:
    """The partial sums of every task in one partition of the cache, each task's rows in the
    order the partition holds them (pandas' groupby keeps it within a group)."""
    batches = list(frames)
    if not batches:
        return
    rows = with_pair_names(pd.concat(batches, ignore_index=True), pairs)
    del batches
    for key, task in rows.groupby(list(keys), sort=False):
        task_key = tuple(int(k) for k in (key if isinstance(key, tuple) else (key,)))
        if passing is not None and passing.passes(task_key):
            replayed = as_recorded(task)
        else:
            replayed = replay_task(task, throttle_factory, "deferral", charged=True)
        yield task_partials(replayed, peaks=False, moved_unit=moved_unit)
