from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from kqp.proxy.metrics import ProxyMetrics
from kqp.proxy.quota_metrics import QuotaStatSample
from kqp.proxy.traffic_metrics import OTHER
from tests.unit.helpers.metrics import registered_metric_names


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sample(metrics: ProxyMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def client_series(metrics: ProxyMetrics) -> set[tuple[str, str]]:
    return {
        (s.labels["user"], s.labels["client_id"])
        for family in metrics.registry.collect()
        if family.name == "kqp_client_request_bytes"
        for s in family.samples
    }


def test_request_figures_per_api_and_version() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    metrics.request_completed(0, 9, 1000, 60, 0.003, 0.00004, [0, 3, 3], user="alice", client_id="p1")
    metrics.request_completed(0, 11, 500, 60, None, 0.00001, [])
    metrics.request_completed(1, 13, 90, 5000, 0.4, 0.0002, [0])

    assert sample(metrics, "kqp_requests_total", api="Produce", api_version="9") == 1
    assert sample(metrics, "kqp_requests_total", api="Produce", api_version="11") == 1
    assert sample(metrics, "kqp_requests_total", api="Fetch", api_version="13") == 1
    assert sample(metrics, "kqp_request_bytes_total", api="Produce") == 1500
    assert sample(metrics, "kqp_response_bytes_total", api="Fetch") == 5000
    # Each non-zero occurrence counts, by Kafka's error name; NONE is not an error.
    assert sample(metrics, "kqp_request_errors_total", api="Produce", error="UNKNOWN_TOPIC_OR_PARTITION") == 2
    assert sample(metrics, "kqp_request_errors_total", api="Fetch", error="NONE") is None


def test_error_names_are_kafka_s_own_and_a_newer_code_keeps_its_number() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    # 6 and 10 are Kafka's names since 2.x (kafka-python still says NOT_LEADER_FOR_PARTITION and
    # MESSAGE_SIZE_TOO_LARGE); 133 is newer than kafka-python; 30000 is no code Kafka defines.
    metrics.request_completed(0, 9, 100, 60, 0.001, 0.00001, [6, 10, 133, 30000])
    for name in ("NOT_LEADER_OR_FOLLOWER", "MESSAGE_TOO_LARGE", "SHARE_SESSION_LIMIT_REACHED", "UNRECOGNIZED_30000"):
        assert sample(metrics, "kqp_request_errors_total", api="Produce", error=name) == 1, name


def test_latency_histograms_split_broker_time_from_proxy_time() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    metrics.request_completed(0, 9, 1000, 60, 0.003, 0.00004, [])
    metrics.request_completed(0, 9, 1000, 0, None, 0.00001, [])  # acks=0: no broker round trip

    broker = "kqp_request_broker_latency_seconds"
    assert sample(metrics, f"{broker}_count", api="Produce") == 1
    assert sample(metrics, f"{broker}_sum", api="Produce") == 0.003
    assert sample(metrics, f"{broker}_bucket", api="Produce", le="0.0025") == 0
    assert sample(metrics, f"{broker}_bucket", api="Produce", le="0.005") == 1
    assert sample(metrics, f"{broker}_bucket", api="Produce", le="+Inf") == 1
    proxy = "kqp_request_proxy_latency_seconds"
    assert sample(metrics, f"{proxy}_count", api="Produce") == 2
    assert sample(metrics, f"{proxy}_bucket", api="Produce", le="2e-05") == 1
    assert sample(metrics, f"{proxy}_bucket", api="Produce", le="5e-05") == 2


def test_a_value_on_a_bucket_bound_counts_in_that_bucket() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    metrics.request_completed(0, 9, 1, 1, 0.005, 0.0, [])
    assert sample(metrics, "kqp_request_broker_latency_seconds_bucket", api="Produce", le="0.005") == 1


def test_throttles_per_entity_source_and_mode() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    metrics.throttled("produce", "alice", "p1", 250, True, "proxy")
    metrics.throttled("produce", "alice", "p1", 750, True, "proxy")
    metrics.throttled("fetch", "alice", "p1", 100, False, "broker")

    labels = {"quota_type": "produce", "user": "alice", "client_id": "p1", "source": "proxy", "enforced": "true"}
    assert sample(metrics, "kqp_throttles_total", **labels) == 2
    assert sample(metrics, "kqp_throttle_time_seconds_total", **labels) == 1.0
    histogram = {"quota_type": "fetch", "source": "broker", "enforced": "false"}
    assert sample(metrics, "kqp_throttle_duration_seconds_count", **histogram) == 1
    assert sample(metrics, "kqp_throttle_duration_seconds_bucket", le="0.05", **histogram) == 0
    assert sample(metrics, "kqp_throttle_duration_seconds_bucket", le="0.1", **histogram) == 1


def test_first_n_pairs_get_labels_then_the_rest_is_other_unless_configured() -> None:
    metrics = ProxyMetrics(CollectorRegistry(), top_n_client_ids=2)
    metrics.set_labelled_entities(users=["carol"], client_ids=["billing"])
    for client_id in ("a", "b", "c", "billing"):
        metrics.request_completed(0, 9, 100, 10, 0.001, 0.0, [], user="bob", client_id=client_id)
    metrics.request_completed(0, 9, 100, 10, 0.001, 0.0, [], user="carol", client_id="z")

    assert client_series(metrics) == {("bob", "a"), ("bob", "b"), (OTHER, OTHER), (OTHER, "billing"), ("carol", OTHER)}
    assert sample(metrics, "kqp_client_request_bytes_total", user=OTHER, client_id=OTHER) == 100
    assert sample(metrics, "kqp_client_requests_total", user="bob", client_id="a") == 1


def test_rerank_promotes_heavy_pairs_and_drops_demoted_series() -> None:
    clock = FakeMonotonic()
    metrics = ProxyMetrics(CollectorRegistry(), top_n_client_ids=1, clock=clock, rerank_interval_s=60)
    metrics.set_labelled_entities(client_ids=["configured"])
    metrics.request_completed(0, 9, 10, 0, 0.001, 0.0, [], user="u", client_id="early")
    metrics.throttled("produce", "u", "early", 5, True, "proxy")
    for _ in range(5):
        metrics.request_completed(0, 9, 10_000, 0, 0.001, 0.0, [], user="u", client_id="heavy")
    metrics.request_completed(0, 9, 1, 0, 0.001, 0.0, [], user="u", client_id="configured")
    assert client_series(metrics) == {("u", "early"), (OTHER, OTHER), (OTHER, "configured")}

    # The re-rank runs from the data path once the interval has passed.
    clock.now += 61
    for _ in range(1024):
        metrics.request_completed(0, 9, 1, 0, 0.001, 0.0, [], user="u", client_id="configured")
    metrics.request_completed(0, 9, 10_000, 0, 0.001, 0.0, [], user="u", client_id="heavy")

    assert ("u", "heavy") in client_series(metrics)
    assert ("u", "early") not in client_series(metrics)
    assert sample(metrics, "kqp_client_request_bytes_total", user="u", client_id="heavy") == 10_000
    throttle_users = {
        s.labels["client_id"] for f in metrics.registry.collect() if f.name == "kqp_throttles" for s in f.samples
    }
    assert "early" not in throttle_users


def test_a_million_client_ids_keep_the_exposition_bounded() -> None:
    metrics = ProxyMetrics(CollectorRegistry(), top_n_client_ids=10)
    metrics.set_labelled_entities(client_ids=["configured-0", "configured-1"])
    for i in range(1_000_000):
        client_id = f"client-{i}"
        metrics.request_completed(0, 9, 100 + i % 7, 10, 0.001, 0.0, [], user=f"user-{i % 1000}", client_id=client_id)
        if i % 10 == 0:
            metrics.throttled("produce", f"user-{i % 1000}", client_id, 10, True, "proxy")
    metrics.request_completed(0, 9, 100, 10, 0.001, 0.0, [], user="x", client_id="configured-1")
    metrics.rerank_top_entities()

    series = client_series(metrics)
    assert len(series) <= 10 + 1 + 2
    assert (OTHER, OTHER) in series
    exposition = generate_latest(metrics.registry)
    assert len(exposition) < 40_000
    assert exposition.count(b"\nkqp_throttles_total{") <= 10 + 1 + 2
    total = sum(s.value for f in metrics.registry.collect() if f.name == "kqp_client_requests" for s in f.samples)
    # Demoted pairs lose their series; what stays covers at least all the aggregated traffic.
    assert total >= 1_000_000 - 10


def test_quota_stats_collector_labels_known_entities_and_aggregates_the_rest() -> None:
    samples = [
        QuotaStatSample("produce", "alice", "p1", 500.0, 1000.0),
        QuotaStatSample("produce", "zed", "x1", 100.0, 200.0),
        QuotaStatSample("produce", "zed", "x2", 50.0, 200.0),
        QuotaStatSample("controller_mutation", "alice", "admin", 2.0, 5.0, tokens=-3.0),
    ]
    metrics = ProxyMetrics(CollectorRegistry(), top_n_client_ids=0, quota_stats=lambda: samples)
    metrics.set_labelled_entities(users=["alice"], client_ids=["p1", "admin"])

    assert sample(metrics, "kqp_quota_usage", quota_type="produce", user="alice", client_id="p1") == 500
    assert sample(metrics, "kqp_quota_limit", quota_type="produce", user="alice", client_id="p1") == 1000
    assert sample(metrics, "kqp_quota_usage", quota_type="produce", user=OTHER, client_id=OTHER) == 150
    # A sum of limits would mean nothing: aggregated entities have usage only.
    assert sample(metrics, "kqp_quota_limit", quota_type="produce", user=OTHER, client_id=OTHER) is None
    assert sample(metrics, "kqp_quota_tokens", quota_type="controller_mutation", user="alice", client_id="admin") == -3
    assert sample(metrics, "kqp_quota_usage_ratio_max", quota_type="produce") == 0.5
    assert sample(metrics, "kqp_quota_entities", quota_type="produce") == 3


def test_quota_source_is_read_at_scrape_time_not_at_registration() -> None:
    calls: list[int] = []

    def source() -> list[QuotaStatSample]:
        calls.append(1)
        return []

    metrics = ProxyMetrics(CollectorRegistry(), quota_stats=source)
    assert calls == []
    generate_latest(metrics.registry)
    assert calls == [1]


def test_rare_events() -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    metrics.connection_opened("bootstrap", "bootstrap")
    metrics.connection_opened("node-1", 1)
    metrics.connection_opened("node-1", 1)
    metrics.connection_closed("node-1", 1, "client_closed")
    metrics.config_reload(True)
    metrics.config_reload(False)
    metrics.capture_written(7)
    metrics.capture_dropped(2)
    metrics.capture_files_closed(1)
    metrics.frame_rejected("too_large")
    metrics.node_endpoints_rewritten("Produce")
    metrics.node_endpoints_rewritten("Produce")

    assert sample(metrics, "kqp_connections_open", listener="node-1", upstream_node="1") == 1
    assert sample(metrics, "kqp_connections_opened_total", listener="node-1", upstream_node="1") == 2
    closed = {"listener": "node-1", "upstream_node": "1", "reason": "client_closed"}
    assert sample(metrics, "kqp_connections_closed_total", **closed) == 1
    assert sample(metrics, "kqp_config_reloads_total", result="success") == 1
    assert sample(metrics, "kqp_config_reloads_total", result="failure") == 1
    last_success = sample(metrics, "kqp_config_last_reload_success_timestamp_seconds")
    assert last_success is not None and last_success > 0
    assert sample(metrics, "kqp_capture_records_written_total") == 7
    assert sample(metrics, "kqp_capture_records_dropped_total") == 2
    assert sample(metrics, "kqp_capture_files_closed_total") == 1
    assert sample(metrics, "kqp_frames_rejected_total", reason="too_large") == 1
    assert sample(metrics, "kqp_node_endpoints_rewritten_total", api="Produce") == 2


def test_default_registry_is_private_and_carries_process_metrics() -> None:
    first = ProxyMetrics()
    second = ProxyMetrics()  # no duplicate-registration error: each has its own registry
    assert first.registry is not second.registry
    names = registered_metric_names(first)
    assert "process_cpu_seconds_total" in names
    assert "kqp_requests_total" in names
    assert "kqp_request_proxy_latency_seconds_bucket" in names


def monotonic_samples(metrics: ProxyMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample Prometheus requires never to decrease while the process runs: counters'
    totals and histograms' buckets, counts and sums (all observations here are >= 0)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in metrics.registry.collect()
        if family.type in ("counter", "histogram")
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_a_pair_that_leaves_the_top_n_and_comes_back_continues_its_counters() -> None:
    metrics = ProxyMetrics(CollectorRegistry(), top_n_client_ids=1)
    scrapes: list[dict[tuple[str, tuple[tuple[str, str], ...]], float]] = []

    def traffic(client_id: str, requests: int, throttle_ms: float = 0.0) -> None:
        for _ in range(requests):
            metrics.request_completed(0, 9, 1000, 100, 0.001, 0.0, [], user="u", client_id=client_id)
            if throttle_ms:
                metrics.throttled("producer_byte_rate", "u", client_id, throttle_ms, True, "proxy")
                metrics.throttled("producer_byte_rate", "u", client_id, throttle_ms, True, "broker")

    traffic("a", 10, throttle_ms=500)  # a fills the one top slot; b is folded into __other__
    traffic("b", 1, throttle_ms=500)
    scrapes.append(monotonic_samples(metrics))
    traffic("b", 100, throttle_ms=500)
    metrics.rerank_top_entities()  # b outranks a: a's series go
    traffic("a", 3, throttle_ms=500)  # a, out of the top N, adds into __other__
    scrapes.append(monotonic_samples(metrics))
    assert ("u", "a") not in client_series(metrics)
    traffic("a", 1000)
    metrics.rerank_top_entities()  # a outranks b again
    traffic("a", 1, throttle_ms=10)
    scrapes.append(monotonic_samples(metrics))
    assert ("u", "a") in client_series(metrics)

    # A series may be missing from a scrape, but a range query sees its value before and after:
    # each value must be at least the last one the series showed, however long ago.
    last_seen: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for scrape in scrapes:
        decreased = {key: (last_seen[key], value) for key, value in scrape.items() if value < last_seen.get(key, 0.0)}
        assert decreased == {}
        last_seen.update(scrape)
    # a's own series hold its traffic while it was in the top N; the 1003 requests it sent
    # from outside are in __other__'s, with b's 101 from before b had a slot.
    throttle = {"quota_type": "producer_byte_rate", "user": "u", "client_id": "a", "enforced": "true"}
    assert sample(metrics, "kqp_throttle_time_seconds_total", source="proxy", **throttle) == 5.01
    assert sample(metrics, "kqp_throttles_total", source="broker", **throttle) == 11
    assert sample(metrics, "kqp_client_requests_total", user="u", client_id="a") == 11
    assert sample(metrics, "kqp_client_request_bytes_total", user="u", client_id="a") == 11_000
    assert sample(metrics, "kqp_client_response_bytes_total", user="u", client_id="a") == 1_100
    assert sample(metrics, "kqp_client_requests_total", user=OTHER, client_id=OTHER) == 101 + 1003


def test_only_the_pairs_gone_most_recently_keep_their_totals() -> None:
    metrics = ProxyMetrics(CollectorRegistry(), top_n_client_ids=1, retired_capacity=1)

    def request(client_id: str, request_bytes: int) -> None:
        metrics.request_completed(0, 9, request_bytes, 0, 0.001, 0.0, [], user="u", client_id=client_id)

    def take_the_top_slot(client_id: str, outranking_bytes: int) -> None:
        request(client_id, outranking_bytes)  # into __other__, but counted by the ranking
        metrics.rerank_top_entities()
        request(client_id, 1)  # its own series

    request("a", 10)  # a has the free slot
    take_the_top_slot("b", 100)  # a out, keeping its totals
    take_the_top_slot("c", 10_000)  # b out, keeping its totals; a, gone longer, forgets its own
    take_the_top_slot("a", 1_000_000)  # c out, keeping its totals; b forgets its own
    # The price of the bound: a came back after more pairs than retired_capacity left since it
    # did, so its series starts again from zero, which Prometheus reads as a reset.
    assert sample(metrics, "kqp_client_requests_total", user="u", client_id="a") == 1
    take_the_top_slot("c", 100_000_000)
    assert sample(metrics, "kqp_client_requests_total", user="u", client_id="c") == 2


def test_a_pair_out_of_the_top_n_that_gets_a_quota_continues_its_counters() -> None:
    metrics = ProxyMetrics(CollectorRegistry(), top_n_client_ids=1)
    metrics.request_completed(0, 9, 1000, 0, 0.001, 0.0, [], user="u", client_id="a")
    metrics.throttled("producer_byte_rate", "u", "a", 500, True, "proxy")
    for _ in range(10):
        metrics.request_completed(0, 9, 1000, 0, 0.001, 0.0, [], user="u", client_id="b")
    metrics.rerank_top_entities()  # b in, a out
    assert ("u", "a") not in client_series(metrics)

    metrics.set_labelled_entities(users=["u"], client_ids=["a"])  # a quota names (u, a) now
    metrics.request_completed(0, 9, 1000, 0, 0.001, 0.0, [], user="u", client_id="a")
    assert sample(metrics, "kqp_client_requests_total", user="u", client_id="a") == 2
    throttle = {"quota_type": "producer_byte_rate", "user": "u", "client_id": "a", "source": "proxy"}
    assert sample(metrics, "kqp_throttle_time_seconds_total", enforced="true", **throttle) == 0.5
