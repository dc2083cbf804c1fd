"""Prometheus metrics of the proxy, shaped after the figures Kafka's broker exposes.

Two kinds of figures, two modules. The per-request figures are on the data path, so they go
into plain accumulators with a bounded label policy (kqp.proxy.traffic_metrics), which a
custom collector turns into metric families at scrape time, with the quota engine's figures
(kqp.proxy.quota_metrics). prometheus-client's own metric objects, which take a lock per
update, are kept here for the rare events (connections, reloads, capture counters, rejected
frames, the fleet and the guard).

Methods are meant to be called from the event loop thread; `capture_written` and
`capture_dropped` may also be called from the capture writer thread.

docs/metrics.md maps every metric to the Kafka broker metric it mirrors.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from kqp.proxy.quota_metrics import QuotaStatsSource, quota_families
from kqp.proxy.traffic_metrics import DEFAULT_RERANK_INTERVAL_S, TrafficMetrics

# A claim's round trip through the usage topic: a produce and a fetch, then the fallback timeout.
FLEET_CLAIM_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, float("inf"))


class ProxyMetrics:
    """The proxy's metrics, registered on `registry` (a fresh one with process metrics if None).

    The per-request figures are a TrafficMetrics' (`traffic`); its data-path and label-policy
    methods are this object's own attributes, the compiled methods themselves, so a call from
    the data path costs no extra Python frame.

    Args:
        registry: where to register; pass a fresh CollectorRegistry in tests.
        top_n_client_ids: how many (user, client-id) pairs keep their own labels by traffic.
        clock: monotonic seconds, for re-ranking; injected by tests.
        rerank_interval_s: how often the top N are recomputed.
        tally_capacity: how many pairs the traffic tally follows (default 20 x top N, min 1000).
        retired_capacity: how many pairs out of the top N keep their totals for when they come
            back (default: the tally's capacity).
        quota_stats: callable returning the quota engine's current samples; see QuotaStatSample.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        top_n_client_ids: int = 20,
        *,
        clock: Callable[[], float] = time.monotonic,
        rerank_interval_s: float = DEFAULT_RERANK_INTERVAL_S,
        tally_capacity: int | None = None,
        retired_capacity: int | None = None,
        quota_stats: QuotaStatsSource | None = None,
    ) -> None:
        self.traffic = traffic = TrafficMetrics(
            top_n_client_ids,
            clock=clock,
            rerank_interval_s=rerank_interval_s,
            tally_capacity=tally_capacity,
            retired_capacity=retired_capacity,
        )
        self.top_n = traffic.top_n
        self.request_completed = traffic.request_completed
        self.throttled = traffic.throttled
        self.set_labelled_entities = traffic.set_labelled_entities
        self.rerank_top_entities = traffic.rerank_top_entities
        if registry is None:
            registry = CollectorRegistry()
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
        self.registry = registry
        self._quota_stats = quota_stats

        self._connections_open = Gauge(
            "kqp_connections_open",
            "Client connections currently open, per listener and upstream broker node.",
            ["listener", "upstream_node"],
            registry=registry,
        )
        self._connections_opened = Counter(
            "kqp_connections_opened_total",
            "Client connections accepted.",
            ["listener", "upstream_node"],
            registry=registry,
        )
        self._connections_closed = Counter(
            "kqp_connections_closed_total",
            "Client connections closed, by reason.",
            ["listener", "upstream_node", "reason"],
            registry=registry,
        )
        self._config_reloads = Counter(
            "kqp_config_reloads_total", "Configuration reloads, by result.", ["result"], registry=registry
        )
        self._config_reload_ok = self._config_reloads.labels(result="success")
        self._config_reload_failed = self._config_reloads.labels(result="failure")
        self._config_last_success = Gauge(
            "kqp_config_last_reload_success_timestamp_seconds",
            "Unix time of the last successful configuration (re)load.",
            registry=registry,
        )
        self._capture_written = Counter(
            "kqp_capture_records_written_total", "Capture records written to Parquet.", registry=registry
        )
        self._capture_dropped = Counter(
            "kqp_capture_records_dropped_total",
            "Capture records dropped because the capture queue was full or the disk failed.",
            registry=registry,
        )
        self._capture_files = Counter(
            "kqp_capture_files_closed_total", "Capture files closed and renamed into place.", registry=registry
        )
        self._frames_rejected = Counter(
            "kqp_frames_rejected_total",
            "Frames the proxy refused to forward (oversized, undecodable, unsupported), by reason.",
            ["reason"],
            registry=registry,
        )
        self._proxy_headers_refused = Counter(
            "kqp_proxy_protocol_refused_total",
            "Client connections refused for their PROXY protocol header before they became connections: a header "
            "from a source outside proxy_protocol.trusted_networks, none from a trusted one where the mode requires "
            "it, the wrong version, a malformed or truncated header, or none in time. By reason.",
            ["reason"],
            registry=registry,
        )
        self._node_endpoints_rewritten = Counter(
            "kqp_node_endpoints_rewritten_total",
            "Produce, Fetch, ShareFetch and ShareAcknowledge responses whose NodeEndpoints (a new leader's "
            "address, KIP-951) the proxy rewrote to its own, by API.",
            ["api"],
            registry=registry,
        )
        self._quota_admin_refused = Counter(
            "kqp_quota_admin_refused_total",
            "DescribeClientQuotas/AlterClientQuotas refused, by API and by who refused (the brokers' authorizer, "
            "admin_principals, or a SASL listener before authentication).",
            ["api", "reason"],
            registry=registry,
        )
        self._unreadable_logins = Counter(
            "kqp_unreadable_logins_total",
            "Client connections whose SASL login the broker accepted but whose principal the proxy cannot read "
            "(GSSAPI, AWS_MSK_IAM, unknown mechanisms, OAUTHBEARER tokens that are not JWTs): user quotas do "
            "not apply to them. By mechanism.",
            ["mechanism"],
            registry=registry,
        )
        self._fleet_reports = Counter(
            "kqp_fleet_reports_total",
            "Usage reports of the fleet exchange: sent or failed by this instance, received (from every "
            "instance, this one included) or rejected as unreadable.",
            ["result"],
            registry=registry,
        )
        self._fleet_state = Gauge(
            "kqp_fleet_exchange_state",
            "1 for the fleet exchange's current state: starting, ok, or the fallback policy in force "
            "(local, share) while the usage topic is unreachable.",
            ["state"],
            registry=registry,
        )
        self._fleet_instances = Gauge(
            "kqp_fleet_instances", "Proxy instances that reported usage within the last quota window.",
            registry=registry,
        )
        self._fleet_budget_share = Gauge(
            "kqp_fleet_budget_share", "Fraction of each quota this instance enforces (below 1 under policy share).",
            registry=registry,
        )
        self._fleet_deltas = Counter(
            "kqp_fleet_usage_deltas_total",
            "Per-client usage deltas of this instance: reported (sent to the fleet) or quiet (left out: "
            "the client was below fleet.max_unreported_share of its quota per instance).",
            ["result"], registry=registry,
        )
        self._fleet_claims = Histogram(
            "kqp_fleet_mutation_claim_seconds",
            "How long a partition mutation waited for its claim to come back through the usage topic: "
            "ordered (charged in the fleet's order) or alone (not back in time, charged by this instance alone).",
            ["result"], buckets=FLEET_CLAIM_BUCKETS_S, registry=registry,
        )
        # The cluster guard (guard.enabled): per broker resource, and per entity it limits. The entity
        # series exist only while the guard holds a limit on the entity, so their number stays bounded
        # by the entities the guard limits at once.
        self._guard_active = Gauge(
            "kqp_guard_active", "1 while the cluster guard is engaged on this broker resource (NW_IN, NW_OUT).",
            ["broker", "resource"], registry=registry,
        )
        self._guard_load = Gauge(
            "kqp_guard_load_bytes_per_second",
            "The broker resource's load as the guard models it from the measured rates (replication included).",
            ["broker", "resource"], registry=registry,
        )
        self._guard_limit = Gauge(
            "kqp_guard_limit_bytes_per_second", "The broker resource's limit: capacity x threshold.",
            ["broker", "resource"], registry=registry,
        )
        self._guard_entity_limit = Gauge(
            "kqp_guard_entity_limit_bytes_per_second",
            "The guard limit in force on an entity (per broker), while there is one.",
            ["entity", "quota_type", "dry_run"], registry=registry,
        )
        self._guard_entity_usage = Gauge(
            "kqp_guard_entity_usage_bytes_per_second",
            "A guarded entity's measured rate on its busiest broker (the quota window's rate).",
            ["entity", "quota_type"], registry=registry,
        )
        registry.register(_AccumulatorCollector(self))

    # ---- configuration ----------------------------------------------------------------

    def set_quota_stats_source(self, source: QuotaStatsSource | None) -> None:
        self._quota_stats = source

    # ---- rare events -------------------------------------------------------------------

    def connection_opened(self, listener: str, upstream_node: int | str) -> None:
        node = str(upstream_node)
        self._connections_opened.labels(listener, node).inc()
        self._connections_open.labels(listener, node).inc()

    def connection_closed(self, listener: str, upstream_node: int | str, reason: str) -> None:
        # `reason` is a kind ("idle", "client disconnected"), not the full message: the
        # caller strips details so the label stays bounded.
        node = str(upstream_node)
        self._connections_closed.labels(listener, node, reason).inc()
        self._connections_open.labels(listener, node).dec()

    def config_reload(self, success: bool) -> None:
        if success:
            self._config_reload_ok.inc()
            self._config_last_success.set_to_current_time()
        else:
            self._config_reload_failed.inc()

    def fleet_report_sent(self) -> None:
        self._fleet_reports.labels(result="sent").inc()

    def fleet_report_failed(self) -> None:
        self._fleet_reports.labels(result="failed").inc()

    def fleet_report_received(self, accepted: bool) -> None:
        self._fleet_reports.labels(result="received" if accepted else "rejected").inc()

    def fleet_usage_deltas(self, reported: int, quiet: int) -> None:
        self._fleet_deltas.labels(result="reported").inc(reported)
        self._fleet_deltas.labels(result="quiet").inc(quiet)

    def fleet_mutation_claimed(self, seconds: float, ordered: bool) -> None:
        self._fleet_claims.labels(result="ordered" if ordered else "alone").observe(seconds)

    def fleet_status(self, state: str, instances: int, budget_share: float) -> None:
        # A state set (one series per state, 1 for the current): every state's series exists
        # from the start, so alerts on `state="local"` see 0 rather than no data.
        for name in ("starting", "ok", "local", "share"):
            self._fleet_state.labels(state=name).set(1 if name == state else 0)
        self._fleet_instances.set(instances)
        self._fleet_budget_share.set(budget_share)

    def guard_status(
        self,
        resources: Iterable[tuple[int, str, float, float, bool]],
        entities: Iterable[tuple[str, str, float, float]],
        dry_run: bool,
    ) -> None:
        """The guard's last step: (broker, resource, load, limit, engaged) per broker resource and
        (entity, quota type, guard limit, usage) per entity it limits; the entity series of the step
        before are dropped first, so a released entity's series goes away."""
        for broker, resource, load, limit, engaged in resources:
            self._guard_active.labels(broker=str(broker), resource=resource).set(1 if engaged else 0)
            self._guard_load.labels(broker=str(broker), resource=resource).set(load)
            self._guard_limit.labels(broker=str(broker), resource=resource).set(limit)
        self._guard_entity_limit.clear()
        self._guard_entity_usage.clear()
        for entity, quota_type, limit, usage in entities:
            self._guard_entity_limit.labels(entity=entity, quota_type=quota_type,
                                            dry_run="true" if dry_run else "false").set(limit)
            self._guard_entity_usage.labels(entity=entity, quota_type=quota_type).set(usage)

    def capture_written(self, n: int) -> None:
        self._capture_written.inc(n)

    def capture_dropped(self, n: int) -> None:
        self._capture_dropped.inc(n)

    def capture_files_closed(self, n: int) -> None:
        self._capture_files.inc(n)

    def frame_rejected(self, reason: str) -> None:
        self._frames_rejected.labels(reason).inc()

    def proxy_header_refused(self, reason: str) -> None:
        self._proxy_headers_refused.labels(reason).inc()

    def node_endpoints_rewritten(self, api: str) -> None:
        self._node_endpoints_rewritten.labels(api).inc()

    def quota_admin_refused(self, api: str, reason: str) -> None:
        self._quota_admin_refused.labels(api, reason).inc()

    def unreadable_login(self, mechanism: str) -> None:
        # Bounded: counted only once the broker accepted the login, so only mechanisms it enables.
        self._unreadable_logins.labels(mechanism).inc()

    # ---- exposition --------------------------------------------------------------------

    def families(self, *, read_quota_source: bool = True) -> Iterator[Metric]:
        """The accumulated figures as metric families (what the custom collector yields)."""
        yield from self.traffic.traffic_families()
        yield from quota_families(self._quota_stats if read_quota_source else None, self.traffic.labels_for_snapshot)


class _AccumulatorCollector(Collector):
    def __init__(self, metrics: ProxyMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics.families()

    def describe(self) -> Iterable[Metric]:
        # Names only, so registering does not run the quota source.
        return list(self._metrics.families(read_quota_source=False))

