"""`kqp serve --workers`: the supervisor's /metrics is every worker's, labelled by worker."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kqp.proxy.http_endpoint import ObservabilityEndpoint
from kqp.proxy.workers import WorkersCollector


async def test_each_workers_series_keeps_its_labels_and_gains_its_worker() -> None:
    endpoints = []
    for connections in (3, 5):
        registry = CollectorRegistry()
        counter = Counter("kqp_connections_opened_total", "Client connections accepted.", ["listener"],
                          registry=registry)
        counter.labels(listener="bootstrap").inc(connections)
        endpoint = ObservabilityEndpoint(registry, "127.0.0.1", 0)
        await endpoint.start()
        endpoints.append(endpoint)
    try:
        supervisor_registry = CollectorRegistry(auto_describe=False)
        supervisor_registry.register(WorkersCollector([e.port for e in endpoints]))
        # The scrape is synchronous (the supervisor does nothing else); run it off the loop.
        text = (await asyncio.to_thread(generate_latest, supervisor_registry)).decode()
    finally:
        for endpoint in endpoints:
            await endpoint.stop()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    totals = {(s.labels["worker"], s.labels["listener"]): s.value
              for s in families["kqp_connections_opened"].samples if s.name.endswith("_total")}
    assert totals == {("0", "bootstrap"): 3.0, ("1", "bootstrap"): 5.0}
    assert text.count("# HELP kqp_connections_opened_total") == 1  # one family, not one per worker


def test_a_worker_that_does_not_answer_is_left_out_not_fatal() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkersCollector([1]))  # nothing listens on port 1
    assert generate_latest(registry) == b""
