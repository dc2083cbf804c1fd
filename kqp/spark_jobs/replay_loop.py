"""The whatif replay's per-request loop: each row's throttle from the quota engine, and the
deferral schedule that decides when each row reaches it.

Compiled with the quota engine (kqp/compiled_modules.py), so that a replayed request costs
about what the engine's own work costs: the loop reads plain lists (no numpy or pandas here;
kqp.spark_jobs.quota_replay converts a group's columns once), calls the engine's recording rules
in C (kqp.quotas.recording, the proxy's one copy of them) and keeps its schedule in a heap of
plain ints. Any throttle function still works (the unit tests' doubles): only `EngineThrottle`,
the engine's own, is called without the generic call's boxing.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Final

from kqp.protocol.api_keys import ApiKey
from kqp.protocol.fast_path import FETCH_FIRST_FLEXIBLE
from kqp.quotas.engine import QuotaManagers
from kqp.quotas.recording import FETCH_QUOTA_API_KEYS, broker_label, charge_response_of, response_charges

# (api_key, broker, principal, client_id, nbytes, request_time_ms, now_ms) -> throttle in ms.
# nbytes is what the quota counts (Produce request size, Fetch response size, else 0);
# request_time_ms the broker's handling time, for request-percentage quotas (NaN: none).
ThrottleFunction = Callable[[int, int, str, str, int, float, int], float]
# (row index, now_ms) -> the throttle of the controller mutations a row charges.
RowMutationFunction = Callable[[int, int], float]

# Module constants mypyc reads natively, not the enum's attribute on every request.
_PRODUCE: Final = int(ApiKey.PRODUCE)
_FETCH: Final = int(ApiKey.FETCH)
_SHARE_FETCH: Final = int(ApiKey.SHARE_FETCH)
# A capture v1 row holds raw frame sizes: a frame's size prefix, and a response's header (a
# correlation id, plus a tagged-field byte in flexible Fetch versions), which Kafka does not count.
SIZE_PREFIX_BYTES: Final = 4
RESPONSE_HEADER_BYTES: Final = 4
_NAN: Final = float("nan")


class EngineThrottle:
    """A ThrottleFunction backed by one kqp.quotas engine: a response's charges, as the proxy
    builds them when a response passes, applied with kqp.quotas.recording's rule."""

    def __init__(self, engine: QuotaManagers) -> None:
        # Read by whatif for an exact replay of a capture that recorded its engine inputs.
        self.engine = engine
        # A task replays a handful of brokers: each one's label once, not once per request.
        self._labels: dict[int, str] = {}
        # Correct from the start: -1 is a broker not yet known, labelled as such.
        self._last_broker = -1
        self._last_label = broker_label(-1)

    def __call__(
        self, api_key: int, broker: int, principal: str, client_id: str, nbytes: int, request_ms: float, now_ms: int
    ) -> float:
        return self.charge(api_key, broker, principal, client_id, nbytes, request_ms, now_ms)

    def charge(
        self, api_key: int, broker: int, principal: str, client_id: str, nbytes: int, request_ms: float, now_ms: int
    ) -> float:
        # A task's rows are mostly of one broker: its label kept at hand, the others in a dict.
        if broker == self._last_broker:
            label = self._last_label
        else:
            found = self._labels.get(broker)
            label = found if found is not None else broker_label(broker)
            self._labels[broker] = label
            self._last_broker, self._last_label = broker, label
        throttle = charge_response_of(
            self.engine,
            label,
            principal,
            client_id,
            api_key,
            nbytes if api_key == _PRODUCE else None,
            nbytes if api_key in FETCH_QUOTA_API_KEYS else None,
            request_ms if request_ms == request_ms else None,  # NaN: no response came back
            now_ms,
        )
        return float(throttle)


class RowThrottles:
    """The throttle of each row of one group when it reaches the engine at `now_ms`: the
    response's (`throttle`), and, for the rows `mutating` marks, the larger of that and their
    controller mutations' (`mutation`), as the proxy answers a mutation request."""

    def __init__(
        self,
        api_keys: list[int],
        brokers: list[int],
        principals: list[str],
        client_ids: list[str],
        nbytes: list[int],
        request_ms: list[float],
        throttle: ThrottleFunction,
        mutation: RowMutationFunction | None = None,
        mutating: list[bool] | None = None,
    ) -> None:
        self.api_keys = api_keys
        self.brokers = brokers
        self.principals = principals
        self.client_ids = client_ids
        self.nbytes = nbytes
        self.request_ms = request_ms
        self.throttle = throttle
        self.engine_throttle = throttle if isinstance(throttle, EngineThrottle) else None
        self.mutation = mutation
        self.mutating = mutating

    def at(self, i: int, now_ms: int) -> float:
        engine_throttle = self.engine_throttle
        if engine_throttle is not None:
            delay = engine_throttle.charge(self.api_keys[i], self.brokers[i], self.principals[i], self.client_ids[i],
                                           self.nbytes[i], self.request_ms[i], now_ms)
        else:
            delay = self.throttle(self.api_keys[i], self.brokers[i], self.principals[i], self.client_ids[i],
                                  self.nbytes[i], self.request_ms[i], now_ms)
        mutation, mutating = self.mutation, self.mutating
        if mutation is not None and mutating is not None and mutating[i]:
            charged = mutation(i, now_ms)
            if charged > delay:
                delay = charged
        return delay


def open_loop(ts: list[int], throttles_of: RowThrottles) -> list[float]:
    """Each row's throttle at its recorded time `ts[i]`, whatever the throttles before it."""
    return [throttles_of.at(i, ts[i]) for i in range(len(ts))]


def deferral(connections: list[int], ts: list[int], throttles_of: RowThrottles) -> tuple[list[int], list[float]]:
    """When each row reaches the engine and its throttle, when a throttled client waits out its
    throttle before its connection sends again: the rest of that connection's rows shift later
    by the delay, the gaps between them kept; connections interleave by simulated time, ties
    in row order. The rows are in recorded order (`ts` ascending within a connection)."""
    n = len(ts)
    sim_ts = [0] * n
    throttles = [0.0] * n
    if n == 0:
        return sim_ts, throttles
    # Each row's connection as a dense number, and the next row of the same connection (-1: none).
    number_of: dict[int, int] = {}
    connection_of = [0] * n
    following_of = [-1] * n
    first_of: list[int] = []
    last_of: list[int] = []
    for index in range(n):
        number = number_of.get(connections[index])
        if number is None:
            number = number_of[connections[index]] = len(last_of)
            first_of.append(index)
            last_of.append(index)
        else:
            following_of[last_of[number]] = index
            last_of[number] = index
        connection_of[index] = number
    # How far each connection has been pushed back, in ms.
    shift = [0] * len(last_of)
    # The next row of every connection, as one int per entry, (time - base) * n + row: ordered
    # by simulated time, then row, with no tuple per entry. Times from the group's first keep
    # the ints small.
    base = min(ts)
    heap = [(ts[index] - base) * n + index for index in first_of]
    heapq.heapify(heap)
    # Held in locals: the compiled build would otherwise look each up in the module per row.
    replace, pop = heapq.heapreplace, heapq.heappop
    while heap:
        entry = heap[0]
        index = entry % n
        now = entry // n + base
        sim_ts[index] = now
        delay = throttles_of.at(index, now)
        throttles[index] = delay
        number = connection_of[index]
        if delay > 0:
            # The client mutes this connection until the throttle elapses (whole ms: math.ceil
            # without its lookup and call, for a positive delay).
            wait = int(delay)
            if wait < delay:
                wait += 1
            pushed = now + wait - ts[index]
            if pushed > shift[number]:
                shift[number] = pushed
        following = following_of[index]
        # The row leaves the heap, and the connection's next row, if any, takes its place.
        if following >= 0:
            replace(heap, (ts[following] + shift[number] - base) * n + following)
        else:
            pop(heap)
    return sim_ts, throttles



def derived_charges(
    api_keys: list[int],
    versions: list[int],
    request_sizes: list[int],
    response_sizes: list[float],
    round_trips: list[float],
    fetch_max_waits: list[float],
) -> tuple[list[int], list[float]]:
    """The bytes each row charges to its byte quota (0: none) and its request time (NaN: none),
    from the sizes and times a capture recorded, by kqp.quotas.recording.response_charges (the
    proxy's one copy of the rule), called once per row. NaN in the float lists is a missing value
    (no response came back, or no MaxWaitMs read). quota_replay.charged_inputs hands the rows the
    proxy did not record their charges for."""
    n = len(api_keys)
    nbytes = [0] * n
    request_ms = [_NAN] * n
    for i in range(n):
        api_key = api_keys[i]
        response_size = response_sizes[i]
        response_body: int | None = None
        if response_size == response_size:
            # ShareFetch is flexible in every version.
            flexible_fetch = api_key == _SHARE_FETCH or (api_key == _FETCH and versions[i] >= FETCH_FIRST_FLEXIBLE)
            response_body = int(response_size) - SIZE_PREFIX_BYTES - RESPONSE_HEADER_BYTES - int(flexible_fetch)
        round_trip = round_trips[i]
        wait = fetch_max_waits[i]
        charges = response_charges(
            api_key,
            request_sizes[i] - SIZE_PREFIX_BYTES,
            response_body,
            round_trip if round_trip == round_trip else None,
            int(wait) if wait == wait else None,
        )
        if charges.produce_bytes is not None:
            nbytes[i] = max(charges.produce_bytes, 0)
        if charges.fetch_bytes is not None:
            nbytes[i] = max(charges.fetch_bytes, 0)
        if charges.request_time_ms is not None:
            request_ms[i] = charges.request_time_ms
    return nbytes, request_ms
