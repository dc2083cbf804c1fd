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

import heapq
import math
from collections.abc import Callable
from typing import Literal

import numpy as np
import pandas as pd

Mode = Literal["open_loop", "deferral"]
MODES: tuple[Mode, ...] = ("open_loop", "deferral")

# (api_key, broker, principal, client_id, nbytes, request_time_ms, now_ms) -> throttle in ms.
# nbytes is what the quota counts (Produce request size, Fetch response size, else 0);
# request_time_ms the broker's handling time, for request-percentage quotas.
ThrottleFunction = Callable[[int, int, str, str, int, float, int], float]
# (api_key, api_version, broker, principal, client_id, [(topic, partitions)], now_ms) -> throttle
# in ms, for CreateTopics / CreatePartitions / DeleteTopics (KIP-599), charged when the
# request arrives.
MutationFunction = Callable[[int, int, int, str, str, list[tuple[str, int]], int], float]

INPUT_COLUMNS = ("ts_ms", "connection_id", "broker", "principal", "client_id", "api_key", "nbytes", "request_time_ms")
# Optional: with them, controller mutations are charged too (see replay_group).
MUTATION_COLUMNS = ("api_version", "request_ts_ms", "mutations")


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
    frame = requests.sort_values(["ts_ms", "connection_id"], kind="stable").reset_index(drop=True)
    n = len(frame)
    sim_ts = np.zeros(n, dtype=np.int64)
    throttles = np.zeros(n, dtype=np.float64)
    ts = frame["ts_ms"].to_numpy(dtype=np.int64)
    api = frame["api_key"].to_numpy()
    broker = frame["broker"].to_numpy()
    principal = frame["principal"].to_numpy()
    client = frame["client_id"].to_numpy()
    nbytes = frame["nbytes"].to_numpy(dtype=np.int64)
    request_ms = frame["request_time_ms"].to_numpy(dtype=np.float64)

    mutations = frame["mutations"].to_numpy() if mutation is not None else None
    # The proxy charges mutations when the request arrives, before the response it records at.
    lead = (frame["ts_ms"] - frame["request_ts_ms"]).to_numpy(dtype=np.int64) if mutation is not None else None
    versions = frame["api_version"].to_numpy() if mutation is not None else None

    def decide(i: int, now: int) -> float:
        delay = throttle(
            int(api[i]), int(broker[i]), principal[i], client[i], int(nbytes[i]), float(request_ms[i]), now
        )
        if mutation is not None and mutations is not None and mutations[i] is not None and len(mutations[i]):
            assert lead is not None and versions is not None
            topics = [(str(entry["topic"]), int(entry["partitions"])) for entry in mutations[i]]
            charged = mutation(
                int(api[i]), int(versions[i]), int(broker[i]), principal[i], client[i], topics, now - int(lead[i])
            )
            delay = max(delay, charged)
        return delay

    if mode == "open_loop":
        for i in range(n):
            sim_ts[i] = ts[i]
            throttles[i] = decide(i, int(ts[i]))
    elif mode == "deferral":
        _deferral(frame["connection_id"].to_numpy(), ts, decide, sim_ts, throttles)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    frame["sim_ts_ms"] = sim_ts
    frame["sim_throttle_ms"] = throttles
    return frame


def _deferral(
    connections: np.ndarray,
    ts: np.ndarray,
    decide: Callable[[int, int], float],
    sim_ts: np.ndarray,
    throttles: np.ndarray,
) -> None:
    # Per connection: its row indices in recorded order, and how far it has been pushed back.
    rows_of: dict[int, list[int]] = {}
    for index, connection in enumerate(connections):
        rows_of.setdefault(int(connection), []).append(index)
    position = dict.fromkeys(rows_of, 0)
    shift = dict.fromkeys(rows_of, 0)
    # Heap of (simulated time, row index, connection): the next request of every connection.
    heap = [(int(ts[rows[0]]), rows[0], connection) for connection, rows in rows_of.items()]
    heapq.heapify(heap)
    while heap:
        now, index, connection = heapq.heappop(heap)
        sim_ts[index] = now
        delay = decide(index, now)
        throttles[index] = delay
        if delay > 0:
            # The client mutes this connection until the throttle elapses.
            shift[connection] = max(shift[connection], now + math.ceil(delay) - int(ts[index]))
        position[connection] += 1
        rows = rows_of[connection]
        if position[connection] < len(rows):
            following = rows[position[connection]]
            heapq.heappush(heap, (int(ts[following]) + shift[connection], following, connection))


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
