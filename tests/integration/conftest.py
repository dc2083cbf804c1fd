"""Fixtures for tests against a real Kafka cluster (harness/local_kafka.py) and a real `kqp serve`.

The clusters are session-scoped and start only when a test asks for them; a broker that
fails to start raises with the tail of its log. Proxies are per test, each on free loopback
ports, and must exit cleanly on SIGTERM. When a test fails, the logs of the proxies it
started are attached to its report.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess

_PROXIES = pytest.StashKey[list[ProxyProcess]]()


def _cluster(nodes: int) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(nodes=nodes)
    # start() stops what it launched and raises with the brokers' log tails if start-up fails.
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kafka_1node() -> Iterator[KafkaCluster]:
    yield from _cluster(1)


@pytest.fixture(scope="session")
def kafka_3nodes() -> Iterator[KafkaCluster]:
    yield from _cluster(3)


ProxyFactory = Callable[..., ProxyProcess]


@pytest.fixture
def start_proxy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProxyFactory]:
    """start_proxy(cluster, sasl=False) -> a running ProxyProcess in front of that cluster."""
    started: list[ProxyProcess] = []
    request.node.stash[_PROXIES] = started

    def start(cluster: KafkaCluster, sasl: bool = False) -> ProxyProcess:
        upstream = cluster.sasl_bootstrap if sasl else cluster.bootstrap
        proxy = ProxyProcess(upstream, tmp_path / f"proxy-{len(started) + 1}.log")
        started.append(proxy)
        proxy.start()
        return proxy

    yield start
    exit_codes = {proxy.log_path.name: proxy.stop() for proxy in started}
    unclean = {name: code for name, code in exit_codes.items() if code != 0}
    assert not unclean, f"proxy did not exit cleanly on SIGTERM: {unclean}"


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    return re.sub(r"[^a-zA-Z0-9._-]", "-", request.node.name)[:200]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for proxy in item.stash.get(_PROXIES, []):
            report.sections.append((f"kqp serve log ({proxy.log_path})", proxy.log_tail(200)))
