"""`kqp serve --workers`: the supervisor's /metrics is every worker's, labelled by worker,
fetched asynchronously with a deadline."""

from __future__ import annotations

import asyncio
import socket
import time

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kqp.proxy.http_endpoint import ObservabilityEndpoint
from kqp.proxy.workers import WorkersCollector, WorkerUnanswered, ask_workers


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
        answers = await ask_workers({index: e.port for index, e in enumerate(endpoints)}, "/metrics", 5.0)
    finally:
        for endpoint in endpoints:
            await endpoint.stop()
    collector = WorkersCollector()
    collector.texts = {index: answer[1] for index, answer in answers.items() if isinstance(answer, tuple)}
    supervisor_registry = CollectorRegistry(auto_describe=False)
    supervisor_registry.register(collector)
    text = generate_latest(supervisor_registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    totals = {(s.labels["worker"], s.labels["listener"]): s.value
              for s in families["kqp_connections_opened"].samples if s.name.endswith("_total")}
    assert totals == {("0", "bootstrap"): 3.0, ("1", "bootstrap"): 5.0}
    assert text.count("# HELP kqp_connections_opened_total") == 1  # one family, not one per worker


async def test_a_stuck_worker_costs_the_deadline_once_and_is_named() -> None:
    registry = CollectorRegistry()
    answering = ObservabilityEndpoint(registry, "127.0.0.1", 0)
    await answering.start()
    # Listening but never accepting: the connection completes in the backlog, nothing answers.
    stuck = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    try:
        ports = {0: stuck[0].getsockname()[1], 1: answering.port, 2: stuck[1].getsockname()[1]}
        start = time.monotonic()
        answers = await ask_workers(ports, "/metrics", 0.3)
        seconds = time.monotonic() - start
    finally:
        for sock in stuck:
            sock.close()
        await answering.stop()
    assert 0.3 <= seconds < 1.5, seconds  # both stuck workers waited for together, not one after the other
    assert isinstance(answers[0], WorkerUnanswered) and "no answer within 0.3 s" in str(answers[0])
    assert isinstance(answers[2], WorkerUnanswered)
    assert isinstance(answers[1], tuple) and answers[1][0] == 200


async def test_a_worker_that_is_gone_is_left_out_not_fatal() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again when the block ends: nothing listens there
    answers = await ask_workers({0: port}, "/metrics", 1.0)
    assert isinstance(answers[0], WorkerUnanswered)
    assert generate_latest(_registry_of(WorkersCollector())) == b""


def _registry_of(collector: WorkersCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


async def test_the_wait_is_on_the_loop_not_blocking_it() -> None:
    stuck = socket.create_server(("127.0.0.1", 0))
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.get_running_loop().create_task(tick())
    try:
        await ask_workers({0: stuck.getsockname()[1]}, "/metrics", 0.3)
    finally:
        ticker.cancel()
        stuck.close()
    assert ticks >= 10, "the event loop kept running during the scrape"
