"""The proxy's per-request figures: plain accumulators on the data path, and the label policy
that keeps their cardinality bounded.

Strategy: the per-request figures (`request_completed`, `throttled`) are on the data path,
so they go into plain Python accumulators (a dict lookup, a few integer additions and a
C-level `bisect` per histogram), turned into metric families at scrape time
(`traffic_families`, which kqp.proxy.metrics' custom collector yields).

Label cardinality is bounded. A user or client-id appears as a label value only when an
operator configured a quota naming it (`set_labelled_entities`) or the (user, client-id)
pair is among the `top_n_client_ids` pairs by bytes; everything else is added up under
`__other__`. The top N are re-ranked every `rerank_interval_s` from a bounded traffic tally;
a pair that falls out stops being exported (Prometheus marks its series stale) and its traffic
adds into `__other__` from then on, but its totals are kept: when it is labelled again its
series come back where they stopped, never lower. A counter that went down without the
process restarting would read as a reset to `rate()`, and one that restarted from zero and
climbed past its old value before the next scrape would hide that traffic from `rate()`
altogether. Only the `retired_capacity` pairs that fell out most recently keep their totals;
an older one that comes back starts from zero again, which Prometheus reads as a reset.

Methods are meant to be called from the event loop thread only: nothing here takes a lock.

This module is compiled with the rest of the per-request path (kqp/compiled_modules.py), so
kqp.proxy.metrics holds a TrafficMetrics rather than subclassing it: an interpreted class
cannot subclass a compiled one.
"""

from __future__ import annotations

import heapq
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from kqp.protocol.apis import api_name
from kqp.protocol.generated import ERROR_NAMES

OTHER = "__other__"

# Broker round trips range from sub-millisecond metadata calls to Fetch long polls that wait
# fetch.max.wait.ms (500 ms by default, often configured higher).
BROKER_LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
# Time the proxy adds should be tens of microseconds; the upper buckets catch event-loop stalls.
PROXY_LATENCY_BUCKETS_S = (
    0.00002, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5,
)  # fmt: skip
# Kafka's throttles are bounded by the quota window (11 s by default for byte rates) but
# controller mutation throttles can be longer.
THROTTLE_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

DEFAULT_RERANK_INTERVAL_S = 60.0
# The clock is read once per this many requests, not on every one.
_RERANK_CHECK_EVERY = 1024
# Bound on the resolved-label cache; cleared when full (a flood of one-off client-ids).
_LABEL_CACHE_LIMIT = 100_000


class _Histogram:
    """A Prometheus histogram kept as per-bucket (not cumulative) counts, so an observation
    is one increment; `cumulative` builds the `le` series at scrape time. No lock: updated
    from the event loop thread only."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        # bisect_left finds the first bound >= value, i.e. Prometheus' "le" bucket.
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return buckets, self.total


class _ApiStats:
    """Per API key: Kafka's RequestsPerSec (by version), byte totals, ErrorsPerSec (by error
    code) and the two latency histograms (broker round trip, time the proxy added)."""

    __slots__ = ("broker", "errors", "name", "proxy", "request_bytes", "requests_by_version", "response_bytes")

    def __init__(self, name: str) -> None:
        self.name = name
        self.requests_by_version: dict[int, int] = {}
        self.request_bytes = 0
        self.response_bytes = 0
        self.errors: dict[int, int] = {}
        self.broker = _Histogram(BROKER_LATENCY_BUCKETS_S)
        self.proxy = _Histogram(PROXY_LATENCY_BUCKETS_S)


class _ClientStats:
    """Per (user, client-id) label pair, after cardinality folding: many real pairs may add
    into the one `__other__` entry."""

    __slots__ = ("request_bytes", "requests", "response_bytes")

    def __init__(self) -> None:
        self.requests = 0
        self.request_bytes = 0
        self.response_bytes = 0


def _error_name(code: int) -> str:
    """Kafka's name for an error code (e.g. NOT_LEADER_OR_FOLLOWER), as the broker's
    ErrorsPerSec `error` tag spells it (generated from Kafka's Errors by harness/kafka_codegen.py);
    a code newer than the bundled definitions keeps its number."""
    name = ERROR_NAMES.get(code)
    return f"UNRECOGNIZED_{code}" if name is None else name


class TrafficMetrics:
    """The per-request accumulators and their label policy (kqp.proxy.metrics.ProxyMetrics adds
    the rare events and registers both).

    Args:
        top_n_client_ids: how many (user, client-id) pairs keep their own labels by traffic.
        clock: monotonic seconds, for re-ranking; injected by tests.
        rerank_interval_s: how often the top N are recomputed.
        tally_capacity: how many pairs the traffic tally follows (default 20 x top N, min 1000).
        retired_capacity: how many pairs that fell out of the top N keep their totals, unexported,
            for when they come back (default: the tally's capacity). A re-rank retires at most
            N pairs, so a retired pair's totals last at least retired_capacity / N re-ranks.
    """

    def __init__(
        self,
        top_n_client_ids: int = 20,
        *,
        clock: Callable[[], float] = time.monotonic,
        rerank_interval_s: float = DEFAULT_RERANK_INTERVAL_S,
        tally_capacity: int | None = None,
        retired_capacity: int | None = None,
    ) -> None:
        self.top_n = max(0, top_n_client_ids)
        self._clock = clock
        self._rerank_interval_s = rerank_interval_s
        self._tally_capacity = tally_capacity if tally_capacity is not None else max(1000, 20 * self.top_n)
        self._retired_capacity = max(0, retired_capacity if retired_capacity is not None else self._tally_capacity)

        self._apis: dict[int, _ApiStats] = {}
        self._clients: dict[tuple[str, str], _ClientStats] = {}
        # (quota_type, user, client_id, source, enforced) -> [throttled responses, seconds]
        self._throttles: dict[tuple[str, str, str, str, str], list[float]] = {}
        self._throttle_histograms: dict[tuple[str, str, str], _Histogram] = {}

        self._labelled_users: frozenset[str] = frozenset()
        self._labelled_client_ids: frozenset[str] = frozenset()
        self._top: set[tuple[str, str]] = set()
        self._label_cache: dict[tuple[str, str], tuple[str, str]] = {}
        # Real pair -> the _ClientStats its labels add into; cleared with _label_cache, and
        # whenever an entry of _clients is dropped (re-rank), so it never holds a dropped one.
        self._client_cache: dict[tuple[str, str], _ClientStats] = {}
        # Pairs that fell out of the top N, the longest gone first. Their entries stay in _clients
        # and _throttles, not exported, until the pair's labels are resolved again (it is back)
        # or it is the oldest of more than _retired_capacity.
        self._retired: dict[tuple[str, str], None] = {}
        self._tally: dict[tuple[str, str], int] = {}
        self._ops_since_check = 0
        self._last_rerank = clock()

    # ---- configuration ----------------------------------------------------------------

    def set_labelled_entities(self, users: Iterable[str] = (), client_ids: Iterable[str] = ()) -> None:
        """Users and client-ids named by a configured quota; they always keep their own label."""
        self._labelled_users = frozenset(users)
        self._labelled_client_ids = frozenset(client_ids)
        self._label_cache.clear()
        self._client_cache.clear()

    # ---- data path ---------------------------------------------------------------------

    def request_completed(
        self,
        api_key: int,
        api_version: int,
        request_bytes: int,
        response_bytes: int,
        broker_seconds: float | None,
        proxy_seconds: float,
        error_codes: Iterable[int] = (),
        *,
        user: str = "",
        client_id: str = "",
    ) -> None:
        """One request/response pair finished.

        Args:
            broker_seconds: from forwarding the request to receiving the response; None when
                there was no response (Produce with acks=0) or the proxy answered itself.
            proxy_seconds: time the proxy itself added (decode, hooks, queueing), excluding
                deliberate throttle delays.
            error_codes: every error code in the response (top level and per partition);
                zeros are ignored. Each occurrence counts, as in Kafka's ErrorsPerSec.
        """
        stats = self._apis.get(api_key)
        if stats is None:
            stats = self._apis[api_key] = _ApiStats(api_name(api_key))
        versions = stats.requests_by_version
        versions[api_version] = versions.get(api_version, 0) + 1
        stats.request_bytes += request_bytes
        stats.response_bytes += response_bytes
        if broker_seconds is not None:
            stats.broker.observe(broker_seconds)
        stats.proxy.observe(proxy_seconds)
        if error_codes:
            for code in error_codes:
                if code:
                    stats.errors[code] = stats.errors.get(code, 0) + 1

        # The real pair's folded entry, found in one lookup: this runs for every request.
        pair = (user, client_id)
        client = self._client_cache.get(pair)
        if client is None:
            client = self._client_for(pair)
        client.requests += 1
        client.request_bytes += request_bytes
        client.response_bytes += response_bytes

        # The ranking tally follows real pairs (not folded labels) but only up to its
        # capacity: pairs first seen while it is full wait for the next re-rank's decay.
        tally = self._tally
        if pair in tally:
            tally[pair] += request_bytes + response_bytes
        elif len(tally) < self._tally_capacity:
            tally[pair] = request_bytes + response_bytes
        self._ops_since_check += 1
        if self._ops_since_check >= _RERANK_CHECK_EVERY:
            self._ops_since_check = 0
            if self._clock() - self._last_rerank >= self._rerank_interval_s:
                self.rerank_top_entities()

    def throttled(
        self, quota_type: str, user: str, client_id: str, throttle_ms: float, enforced: bool, source: str
    ) -> None:
        """A response carried a throttle: `source` "proxy" (ours) or "broker" (the broker's own).

        `enforced` is False when the proxy only computed the throttle (observe-only mode).
        """
        pair = (user, client_id)
        labels = self._label_cache.get(pair)
        if labels is None:
            labels = self._resolve_labels(pair)
        enforced_label = "true" if enforced else "false"
        # Counts and seconds per labelled client (Kafka's throttle-time sensor per entity);
        # the histogram is per quota type only, so its cardinality does not grow with clients.
        key = (quota_type, labels[0], labels[1], source, enforced_label)
        seconds = throttle_ms / 1000.0
        entry = self._throttles.get(key)
        if entry is None:
            self._throttles[key] = [1, seconds]
        else:
            entry[0] += 1
            entry[1] += seconds
        histogram_key = (quota_type, source, enforced_label)
        histogram = self._throttle_histograms.get(histogram_key)
        if histogram is None:
            histogram = self._throttle_histograms[histogram_key] = _Histogram(THROTTLE_BUCKETS_S)
        histogram.observe(seconds)

    # ---- label policy ------------------------------------------------------------------

    def _configured_labels(self, pair: tuple[str, str]) -> tuple[str, str]:
        # User and client-id fold independently: a configured user keeps its label even
        # with an unconfigured client-id, as a `user`-only quota entity would be reported.
        user, client_id = pair
        return (
            user if user in self._labelled_users else OTHER,
            client_id if client_id in self._labelled_client_ids else OTHER,
        )

    def _client_for(self, pair: tuple[str, str]) -> _ClientStats:
        """The accumulator a real pair's requests add into (its labels' entry), remembered in
        `_client_cache` until the labels may change (every `_label_cache` clear clears it)."""
        labels = self._label_cache.get(pair)
        if labels is None:
            labels = self._resolve_labels(pair)
        client = self._clients.get(labels)
        if client is None:
            client = self._clients[labels] = _ClientStats()
        if len(self._client_cache) >= _LABEL_CACHE_LIMIT:
            self._client_cache.clear()
        self._client_cache[pair] = client
        return client

    def _resolve_labels(self, pair: tuple[str, str]) -> tuple[str, str]:
        if pair in self._top:
            labels = pair
        elif len(self._top) < self.top_n:
            # Until N pairs have been seen, each gets its own labels at once, so a small
            # deployment shows every client without waiting for the first re-rank.
            self._top.add(pair)
            labels = pair
        else:
            labels = self._configured_labels(pair)
        self._back_in_use(labels)
        # Clear rather than evict: simple, and a refill costs one resolution per live pair.
        if len(self._label_cache) >= _LABEL_CACHE_LIMIT:
            self._label_cache.clear()
        self._label_cache[pair] = labels
        return labels

    def _back_in_use(self, labels: tuple[str, str]) -> None:
        """Labels that are given to traffic again, whichever way (re-ranked, a free top slot, a
        quota naming them): their series are exported again, continuing from the kept totals."""
        self._retired.pop(labels, None)

    def labels_for_snapshot(self, user: str, client_id: str) -> tuple[str, str]:
        """The labels the quota engine's figures of this pair are reported under (scrape time)."""
        pair = (user, client_id)
        return pair if pair in self._top else self._configured_labels(pair)

    def rerank_top_entities(self) -> None:
        """Recompute the top N pairs by bytes since the previous re-rank (older traffic halved)."""
        tally = self._tally
        new_top = set(heapq.nlargest(self.top_n, tally, key=tally.__getitem__)) if self.top_n else set()
        retired = self._retired
        # Before retiring and forgetting: a pair back in the top N is no longer gone, however
        # long it was, so this re-rank must not forget its totals.
        for pair in new_top:
            self._back_in_use(pair)
        for pair in self._top - new_top:
            if self._configured_labels(pair) == pair:
                continue  # configured entities keep their series
            retired[pair] = None  # last: the most recently gone (a top pair is never retired)
        forgotten: set[tuple[str, str]] = set()
        while len(retired) > self._retired_capacity:
            pair = next(iter(retired))
            del retired[pair]
            forgotten.add(pair)
        if forgotten:
            for pair in forgotten:
                self._clients.pop(pair, None)
            for key in [key for key in self._throttles if (key[1], key[2]) in forgotten]:
                del self._throttles[key]
        self._top = new_top
        self._label_cache.clear()
        self._client_cache.clear()
        # Decay instead of forgetting: a steady heavy client stays ranked, while room is
        # made for pairs that were not followed when the tally was full.
        keep = heapq.nlargest(self._tally_capacity // 2, tally.items(), key=lambda item: item[1])
        self._tally = {pair: total // 2 for pair, total in keep}
        self._last_rerank = self._clock()

    # ---- exposition --------------------------------------------------------------------

    def traffic_families(self) -> Iterator[Metric]:
        """The accumulated figures as metric families (kqp.proxy.metrics' collector yields them)."""
        requests = CounterMetricFamily(
            "kqp_requests", "Requests forwarded, per API and version.", labels=["api", "api_version"]
        )
        errors = CounterMetricFamily(
            "kqp_request_errors", "Error codes seen in responses, per API and error.", labels=["api", "error"]
        )
        request_bytes = CounterMetricFamily("kqp_request_bytes", "Request bytes received from clients.", labels=["api"])
        response_bytes = CounterMetricFamily("kqp_response_bytes", "Response bytes sent to clients.", labels=["api"])
        broker_latency = HistogramMetricFamily(
            "kqp_request_broker_latency_seconds",
            "Time from forwarding a request to the broker until its response arrived.",
            labels=["api"],
        )
        proxy_latency = HistogramMetricFamily(
            "kqp_request_proxy_latency_seconds",
            "Time the proxy added to a request/response pair, throttle delays excluded.",
            labels=["api"],
        )
        for stats in list(self._apis.values()):
            for version, count in sorted(stats.requests_by_version.items()):
                requests.add_metric([stats.name, str(version)], count)
            for code, count in sorted(stats.errors.items()):
                errors.add_metric([stats.name, _error_name(code)], count)
            request_bytes.add_metric([stats.name], stats.request_bytes)
            response_bytes.add_metric([stats.name], stats.response_bytes)
            buckets, total = stats.broker.cumulative()
            broker_latency.add_metric([stats.name], buckets, total)
            buckets, total = stats.proxy.cumulative()
            proxy_latency.add_metric([stats.name], buckets, total)
        yield from (requests, errors, request_bytes, response_bytes, broker_latency, proxy_latency)

        client_labels = ["user", "client_id"]
        client_requests = CounterMetricFamily(
            "kqp_client_requests", "Requests per user and client-id (bounded labels).", labels=client_labels
        )
        client_in = CounterMetricFamily(
            "kqp_client_request_bytes", "Request bytes per user and client-id.", labels=client_labels
        )
        client_out = CounterMetricFamily(
            "kqp_client_response_bytes", "Response bytes per user and client-id.", labels=client_labels
        )
        retired = self._retired
        for (user, client_id), client in list(self._clients.items()):
            if (user, client_id) in retired:
                continue
            client_requests.add_metric([user, client_id], client.requests)
            client_in.add_metric([user, client_id], client.request_bytes)
            client_out.add_metric([user, client_id], client.response_bytes)
        yield from (client_requests, client_in, client_out)

        throttle_labels = ["quota_type", "user", "client_id", "source", "enforced"]
        throttles = CounterMetricFamily("kqp_throttles", "Responses that carried a throttle.", labels=throttle_labels)
        throttle_time = CounterMetricFamily(
            "kqp_throttle_time_seconds", "Total throttle time given to clients.", labels=throttle_labels
        )
        for throttle_key, (throttled_responses, seconds) in list(self._throttles.items()):
            if (throttle_key[1], throttle_key[2]) in retired:
                continue
            throttles.add_metric(list(throttle_key), throttled_responses)
            throttle_time.add_metric(list(throttle_key), seconds)
        throttle_histogram = HistogramMetricFamily(
            "kqp_throttle_duration_seconds",
            "Distribution of throttle times given to clients.",
            labels=["quota_type", "source", "enforced"],
        )
        for histogram_key, histogram in list(self._throttle_histograms.items()):
            buckets, total = histogram.cumulative()
            throttle_histogram.add_metric(list(histogram_key), buckets, total)
        yield from (throttles, throttle_time, throttle_histogram)
