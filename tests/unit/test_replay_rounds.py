"""advise's repeated replays (kqp/spark_jobs/replay_rounds.py), the part that runs in a Python
worker: one cached partition, holding several replay tasks' rows interleaved, replayed task by
task. The Spark side (the cache, and its tables against simulate_partials') is in
tests/spark/test_whatif.py."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from kqp.protocol.api_keys import ApiKey
from kqp.spark_jobs.replay_partials import task_partials
from kqp.spark_jobs.replay_rounds import _replay_partition
from kqp.spark_jobs.whatif import PassingTasks, as_recorded, replay_task

KEYS = ("broker", "quota_group")
# The driver's list of pairs: a cached row carries the number of its (principal, client-id).
PAIRS = (("User:ANONYMOUS", "heavy"), ("User:ANONYMOUS", "light"), ("User:ANONYMOUS", "other"))


def every_produce_of(client_id: str, throttle_ms: float) -> Callable[[], Callable[..., float]]:
    def factory() -> Callable[..., float]:
        def throttle(
            api_key: int, broker: int, principal: str, client: str, nbytes: int, request_ms: float, now_ms: int
        ) -> float:
            return throttle_ms if api_key == ApiKey.PRODUCE and client == client_id else 0.0

        return throttle

    return factory


def partition() -> pd.DataFrame:
    """Three tasks' charged rows, interleaved as a partition of the cache holds them, with ties in
    (time, connection) whose order the replay must keep."""
    rng = np.random.default_rng(7)
    n = 600
    clients = np.array(["heavy", "light", "other"])[rng.integers(0, 3, n)]
    return pd.DataFrame(
        {
            "ts_ms": np.sort(rng.integers(0, 5_000, n)),
            "connection_id": rng.integers(0, 3, n) + 10 * (clients == "light"),
            "broker": np.where(clients == "other", 2, 1).astype(np.int32),
            "principal": "User:ANONYMOUS",
            "client_id": clients,
            "api_key": rng.choice([ApiKey.PRODUCE, ApiKey.FETCH], n).astype(np.int32),
            "api_version": np.full(n, 9, dtype=np.int32),
            "request_ts_ms": np.zeros(n, dtype=np.int64),
            "mutations": None,
            "recorded_throttle_ms": 0.0,
            "nbytes": rng.integers(1, 100_000, n),
            "request_time_ms": rng.random(n),
            "quota_group": np.where(clients == "light", 1, 0).astype(np.int32),
        }
    )


def cached(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows as the cache holds them: their pair's number instead of its two strings."""
    number = {pair: i for i, pair in enumerate(PAIRS)}
    pairs = [number[pair] for pair in zip(rows["principal"], rows["client_id"], strict=True)]
    return rows.drop(columns=["principal", "client_id"]).assign(pair=np.array(pairs, dtype=np.int32))


def test_each_task_of_a_partition_is_replayed_alone_in_the_partitions_order() -> None:
    rows = partition()
    factory = every_produce_of("heavy", 25.0)
    passing = PassingTasks(free_groups=frozenset(), tasks=frozenset({(1, 1)}))
    held = cached(rows)
    batches = [held.iloc[start : start + 128] for start in range(0, len(held), 128)]
    parts = list(_replay_partition(iter(batches), KEYS, factory, passing, moved_unit=2, pairs=PAIRS))
    expected = []
    for task in ((1, 0), (1, 1), (2, 0)):
        of_task = rows[(rows["broker"] == task[0]) & (rows["quota_group"] == task[1])]
        replayed = as_recorded(of_task) if task == (1, 1) else replay_task(of_task, factory, "deferral", charged=True)
        expected.append(task_partials(replayed, peaks=False, moved_unit=2))
    # One part per task, in the order the tasks first appear in the partition.
    assert len(parts) == 3
    order = list(dict.fromkeys(zip(rows["broker"], rows["quota_group"], strict=True)))
    for part, task in zip(parts, order, strict=True):
        pd.testing.assert_frame_equal(part, expected[[(1, 0), (1, 1), (2, 0)].index(task)])
    # Not vacuous: the heavy client's Produce requests were throttled and deferred.
    heavy = pd.concat(parts).query("part == 'client' and client_id == 'heavy'")
    assert int(heavy["throttled"].sum()) > 0 and int(heavy["max_shift_ms"].max()) > 0


def test_an_empty_partition_gives_nothing() -> None:
    nothing = _replay_partition(iter([]), KEYS, every_produce_of("heavy", 25.0), None, moved_unit=None, pairs=PAIRS)
    assert list(nothing) == []
