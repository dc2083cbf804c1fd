"""advise's verification: the advised quota file replayed through the proxy's own quota
engine (whatif's `simulate`, deferral mode), giving each broker's load after throttling and
each entity's throttled share.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from kqp.protocol.api_keys import ApiKey
from kqp.quotas import capacity as cap
from kqp.quotas.settings import QuotaEntity, QuotaSettings
from kqp.spark_jobs.advice_math import (
    Granularity,
    Resource,
    replication_shares,
    statistic,
)
from kqp.spark_jobs.advise_problem import ENTITY_COLUMNS, AdviseOptions, Series, bucket_coverage, entity_of
from kqp.spark_jobs.session import to_pandas

if TYPE_CHECKING:
    from kqp.spark_jobs.replay_rounds import ChargedReplays


@dataclass
class Verification:
    """The advised file replayed through the proxy's engine (deferral mode)."""

    loads: dict[Resource, float]
    series: dict[Resource, np.ndarray]
    clients: pd.DataFrame
    warm_up_buckets: int


def verify(
    settings: QuotaSettings,
    series: Series,
    options: AdviseOptions,
    before: Mapping[Resource, np.ndarray],
    warm_up_buckets: int,
    replays: ChargedReplays,
) -> Verification:
    """Replay the advised quotas through kqp.quotas (whatif's simulate, deferral mode).

    `replays`: the capture's rows (whatif.prepare_requests), charged and partitioned by replay
    task once for all the rounds (kqp.spark_jobs.replay_rounds); each round is one pass over them.

    The charged bytes of each Produce and Fetch move from the second they were recorded in
    to the second the replay sends them; the brokers' series change by that difference
    (replication modelled as in analyze), and the statistic is taken over the capture window
    plus the seconds the deferred traffic spills into, less the first quota window (warm-up).
    """
    from kqp.spark_jobs.whatif import (
        client_outcomes_from_partials,
        engine_replay_functions,
        moved_bytes_from_partials,
        replay_options,
    )

    unit = series.unit
    # Each replay task hands back its partial sums (per client, and per (broker, API, bucket)
    # the bytes the deferral moved out of and into the bucket), not its rows; they are small,
    # so cached for the two tables merged from them. Tasks the advice can never throttle keep
    # their recorded timeline: no replay needed (replay_options' pre-filter).
    partials = replays.partials(
        functools.partial(engine_replay_functions, settings), replay_options(settings, "deferral"), moved_unit=unit
    ).persist()
    clients = to_pandas(client_outcomes_from_partials(partials))
    # Per (broker, API, bucket): the bytes the deferral moved out of it and into it, one row per
    # bucket, not one per (from, to) pair of buckets (millions at 10M requests, when throttled
    # clients run minutes behind their capture).
    moved = to_pandas(moved_bytes_from_partials(partials))
    partials.unpersist()
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
    replay_covered = bucket_coverage(series.seconds[0], last_second, unit)[1]
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
