"""Pure replay of one group of captured requests through a throttle function.

No Spark here: `whatif` hands each group (a pandas frame from `applyInPandas`) to
`replay_group`, and unit tests drive it directly. The throttle function is the quota
engine's (`kqp.quotas`), so the arithmetic is the proxy's own; this module only decides
*when* each request reaches it.

Modes:
  * open loop: every request at its recorded time, whatever the throttles were; the upper
    bound of throttling, and the mode to calibrate against a capture's recorded throttles
    (the recorded traffic already reflects how clients reacted to the throttles of the day).
  * deferral: a throttled client waits out its throttle before its connection sends again
    (KIP-219 clients do this), so the rest of that connection's requests shift later by the
    delay; the gaps between them are kept. Connections interleave by simulated time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
import pandas as pd

from kqp.protocol.api_keys import ApiKey
from kqp.quotas import QuotaEngine
from kqp.quotas.recording import (
    QuotaClient,
    RequestOutcome,
    ResponseCharges,
    charge_request,
    charge_response,
    exchange_throttle,
    request_charges,
    upstream_answer_ms,
)
from kqp.spark_jobs.replay_loop import (
    RowMutationFunction,
    RowThrottles,
    ThrottleFunction,
    deferral,
    derived_charges,
    open_loop,
)

Mode = Literal["open_loop", "deferral"]
MODES: tuple[Mode, ...] = ("open_loop", "deferral")

# (api_key, api_version, broker, principal, client_id, [(topic, partitions)], now_ms) -> throttle
# in ms, for CreateTopics / CreatePartitions / DeleteTopics (KIP-599), charged when the
# request arrives.
MutationFunction = Callable[[int, int, int, str, str, list[tuple[str, int]], int], float]

INPUT_COLUMNS = ("ts_ms", "connection_id", "broker", "principal", "client_id", "api_key", "nbytes", "request_time_ms")
# Optional: with them, controller mutations are charged too (see replay_group).
MUTATION_COLUMNS = ("api_version", "request_ts_ms", "mutations")


# Capture v2: the engine's inputs as the proxy recorded them (kqp/capture/schema.py).
RECORDED_COLUMNS = (
    "quota_broker",
    "quota_request_seq",
    "quota_request_now_ms",
    "quota_response_seq",
    "quota_response_now_ms",
    "quota_produce_bytes",
    "quota_fetch_bytes",
    "quota_request_time_ms",
    "acks",
    "api_version",
    "mutations",
)
_REQUEST_PHASE, _RESPONSE_PHASE = 0, 1


def charged_inputs(requests: pd.DataFrame) -> pd.DataFrame:
    """Add `nbytes` and `request_time_ms`: what each request charged, by the proxy's own rules.

    A row the proxy recorded (capture v2) carries the charges themselves: they are copied column
    by column. Otherwise they are derived from the raw sizes and times through
    kqp.quotas.recording.response_charges, called once per such row on plain Python values (the
    columns converted to lists once) by a compiled loop (replay_loop.derived_charges): the rule
    stays the proxy's one copy, and what a row costs is the rule, not pandas' per-cell access
    nor an interpreted loop around it. Needs api_key, api_version, request_bytes,
    response_bytes, round_trip_ms and fetch_max_wait_ms (and the v2 quota_* columns when present).
    """
    frame = requests.copy()
    n = len(frame)
    nbytes = np.zeros(n, dtype=np.int64)
    request_ms = np.full(n, np.nan)
    has_recorded = "quota_broker" in frame.columns
    recorded = frame["quota_broker"].notna().to_numpy() if has_recorded else np.zeros(n, dtype=bool)
    if recorded.any():
        # At most one of the two byte charges is set (Produce or Fetch), as in the rule below.
        for column in ("quota_produce_bytes", "quota_fetch_bytes"):
            charged = frame[column].to_numpy(dtype=np.float64, na_value=np.nan)
            present = recorded & ~np.isnan(charged)
            nbytes[present] = np.maximum(charged[present], 0).astype(np.int64)
        took = frame["quota_request_time_ms"].to_numpy(dtype=np.float64, na_value=np.nan)
        request_ms[recorded] = took[recorded]
    derived = np.flatnonzero(~recorded)
    if len(derived):
        # Plain Python values, NaN for a missing one, so the per-row loop (compiled) touches no pandas.
        def values(column: str) -> list[float]:
            return list(frame[column].to_numpy(dtype=np.float64, na_value=np.nan)[derived].tolist())

        derived_bytes, derived_ms = derived_charges(
            frame["api_key"].to_numpy(dtype=np.int64)[derived].tolist(),
            frame["api_version"].to_numpy(dtype=np.int64)[derived].tolist(),
            frame["request_bytes"].to_numpy(dtype=np.int64)[derived].tolist(),
            values("response_bytes"),
            values("round_trip_ms"),
            values("fetch_max_wait_ms"),
        )
        nbytes[derived] = derived_bytes
        request_ms[derived] = derived_ms
    frame["nbytes"] = nbytes
    frame["request_time_ms"] = request_ms
    return frame


def is_recorded(requests: pd.DataFrame) -> bool:
    """Whether every row carries the engine inputs the proxy recorded (capture v2 with quotas on)."""
    return set(RECORDED_COLUMNS) <= set(requests.columns) and bool(requests["quota_broker"].notna().all())


def replay_recorded(requests: pd.DataFrame, engine: QuotaEngine) -> pd.DataFrame:
    """Open-loop replay of recorded engine inputs, call by call in the proxy's order.

    Each row's request-time charges (acks=0 Produce, controller mutations, a Fetch's cap) and
    response charges go through kqp.quotas.recording at the engine clock the proxy read, in
    the order of the proxy's engine calls; a row's throttle is the larger of the two, as the
    proxy's. Returns the rows sorted by `ts_ms`, plus `sim_ts_ms` (= ts_ms) and `sim_throttle_ms`.
    """
    frame = requests.sort_values(["ts_ms", "connection_id"], kind="stable").reset_index(drop=True)
    events: list[tuple[float, int, int, int]] = []
    for phase, seq_column, now_column in (
        (_REQUEST_PHASE, "quota_request_seq", "quota_request_now_ms"),
        (_RESPONSE_PHASE, "quota_response_seq", "quota_response_now_ms"),
    ):
        charged = frame[now_column].notna().to_numpy()
        nows = frame[now_column].to_numpy(dtype=np.float64)
        seqs = frame[seq_column].fillna(0).to_numpy(dtype=np.int64)
        events.extend((float(nows[i]), int(seqs[i]), phase, int(i)) for i in np.flatnonzero(charged))
    events.sort()
    throttles = np.zeros(len(frame), dtype=np.float64)
    outcomes: dict[int, RequestOutcome] = {}
    rows = frame.to_dict("records")
    for now, _seq, phase, index in events:
        row = rows[index]
        client = QuotaClient(str(row["quota_broker"]), str(row["principal"]), str(row["client_id"]))
        api_key = int(row["api_key"])
        if phase == _REQUEST_PHASE:
            acks_zero = api_key == ApiKey.PRODUCE and _present(row["acks"]) and int(row["acks"]) == 0
            produce_bytes = int(row["quota_produce_bytes"]) if acks_zero else 0
            mutations = row["mutations"]
            topics = None
            if mutations is not None and len(mutations):
                topics = [(str(m["topic"]), int(m["partitions"])) for m in mutations]
            charges = request_charges(api_key, int(row["api_version"]), produce_bytes, not acks_zero, topics)
            outcomes[index] = outcome = charge_request(engine, client, charges, now)
            throttle = float(outcome.throttle_ms)
        else:
            response = ResponseCharges(
                api_key,
                int(row["quota_produce_bytes"]) if _present(row["quota_produce_bytes"]) else None,
                int(row["quota_fetch_bytes"]) if _present(row["quota_fetch_bytes"]) else None,
                float(row["quota_request_time_ms"]) if _present(row["quota_request_time_ms"]) else None,
            )
            # The request's throttle as the response reports it, max'd with the response's.
            charged = charge_response(engine, client, response, now)
            # A mutation's throttle is reduced by the upstream's answer time, as the proxy's.
            sent_us, answered_us = row.get("ts_request_sent_us"), row.get("ts_response_received_us")
            upstream_ms = None
            if _present(sent_us) and _present(answered_us):
                upstream_ms = upstream_answer_ms(int(sent_us), int(answered_us))
            throttle = float(exchange_throttle(outcomes.get(index), charged, now, upstream_ms))
        throttles[index] = throttle
    frame["sim_ts_ms"] = frame["ts_ms"].to_numpy(dtype=np.int64)
    frame["sim_throttle_ms"] = throttles
    return frame


def _present(value: object) -> bool:
    return value is not None and not bool(pd.isna(value))


def replay_group(
    requests: pd.DataFrame, throttle: ThrottleFunction, mode: Mode, mutation: MutationFunction | None = None
) -> pd.DataFrame:
    """Simulated throttle and send time of every request of one quota group.

    Args:
        requests: INPUT_COLUMNS (ts_ms recorded arrival, integer ms), any order; with
            `mutation`, also MUTATION_COLUMNS (mutations: (topic, partitions) pairs or None).
        throttle: the quota engine's decision for a request arriving at `now_ms`.
        mode: "open_loop" or "deferral".
        mutation: the engine's controller-mutation decision; a mutation request's throttle is
            the larger of the two, as the proxy answers it.

    Returns:
        The input rows (sorted by recorded time) plus `sim_ts_ms` (when the request reaches
        the broker in the simulation) and `sim_throttle_ms`.
    """
    frame = _in_recorded_order(requests)
    ts = frame["ts_ms"].to_numpy(dtype=np.int64).tolist()
    # The engine's inputs as plain Python values, converted once per group: the per-request
    # loop (kqp.spark_jobs.replay_loop, compiled) reads list items, not numpy scalars.
    throttles_of = RowThrottles(
        frame["api_key"].to_numpy(dtype=np.int64).tolist(),
        frame["broker"].to_numpy(dtype=np.int64).tolist(),
        frame["principal"].tolist(),
        frame["client_id"].tolist(),
        frame["nbytes"].to_numpy(dtype=np.int64).tolist(),
        frame["request_time_ms"].to_numpy(dtype=np.float64).tolist(),
        throttle,
        *_mutation_throttles(frame, mutation),
    )
    if mode == "open_loop":
        sim_ts, throttles = ts, open_loop(ts, throttles_of)
    elif mode == "deferral":
        sim_ts, throttles = deferral(frame["connection_id"].to_numpy(dtype=np.int64).tolist(), ts, throttles_of)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    frame["sim_ts_ms"] = np.array(sim_ts, dtype=np.int64)
    frame["sim_throttle_ms"] = np.array(throttles, dtype=np.float64)
    return frame


def _in_recorded_order(requests: pd.DataFrame) -> pd.DataFrame:
    """The rows sorted by (ts_ms, connection_id), stably, indexed 0..n-1: what
    `sort_values(...).reset_index(drop=True)` gives, without copying every column twice (once
    to sort, once to reindex), nor at all when the rows are in that order already (a capture
    is written in time order)."""
    order = np.lexsort((requests["connection_id"].to_numpy(), requests["ts_ms"].to_numpy()))
    in_order = bool((order == np.arange(len(order))).all())
    # In order: a new frame over the same columns (the caller's gains no columns, keeps its index).
    frame = requests.copy(deep=False) if in_order else requests.take(order)
    frame.index = pd.RangeIndex(len(frame))
    return frame


def _mutation_throttles(
    frame: pd.DataFrame, mutation: MutationFunction | None
) -> tuple[RowMutationFunction | None, list[bool] | None]:
    """The throttle of a row's controller mutations at `now_ms`, and which rows have any: the
    few such rows go through `mutation` (the engine's), charged when their request arrived."""
    if mutation is None:
        return None, None
    mutations = frame["mutations"].to_numpy()
    mutating = [entries is not None and len(entries) > 0 for entries in mutations]
    if not any(mutating):
        return None, None
    # The proxy charges mutations when the request arrives, before the response it records at.
    lead = (frame["ts_ms"] - frame["request_ts_ms"]).to_numpy(dtype=np.int64)
    versions = frame["api_version"].to_numpy()
    api_keys = frame["api_key"].to_numpy(dtype=np.int64)
    brokers = frame["broker"].to_numpy(dtype=np.int64)
    principals = frame["principal"].tolist()
    client_ids = frame["client_id"].tolist()

    def charged(i: int, now_ms: int) -> float:
        topics = [(str(entry["topic"]), int(entry["partitions"])) for entry in mutations[i]]
        return mutation(
            int(api_keys[i]), int(versions[i]), int(brokers[i]), principals[i], client_ids[i], topics,
            now_ms - int(lead[i]),
        )

    return charged, mutating


def quota_groups(
    pairs: list[tuple[str, str]], link_users: bool = True, link_client_ids: bool = True
) -> dict[tuple[str, str], int]:
    """Group (principal, client-id) pairs that could share a quota sensor.

    Kafka keeps one sensor per resolved quota entity: a user quota is shared by all that
    user's client-ids (`link_users`), a client-id quota by all users using that client-id
    (`link_client_ids`); a (user, client-id) quota belongs to the pair alone. Pairs linked
    that way go to one group (union-find), so a group can be replayed alone, in parallel
    with the others.
    """
    parent: dict[tuple[str, str], tuple[str, str]] = {}

    def find(node: tuple[str, str]) -> tuple[str, str]:
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    def union(a: tuple[str, str], b: tuple[str, str]) -> None:
        root_a, root_b = find(a), find(b)
        if root_a != root_b:
            parent[max(root_a, root_b)] = min(root_a, root_b)

    def node_of(principal: str, client_id: str) -> tuple[str, str]:
        return ("pair", f"{principal}\x00{client_id}")

    for principal, client_id in pairs:
        pair = node_of(principal, client_id)
        find(pair)
        if link_users:
            union(pair, ("user", principal))
        if link_client_ids:
            union(pair, ("client", client_id))
    roots: dict[tuple[str, str], int] = {}
    groups = {}
    for principal, client_id in sorted(pairs):
        root = find(node_of(principal, client_id))
        groups[(principal, client_id)] = roots.setdefault(root, len(roots))
    return groups
