"""Fixtures for tests against a real Kafka cluster (harness/local_kafka.py) and a real `kqp serve`.

The clusters (`kafka_1node`, `kafka_3nodes`) are tests/conftest.py's, shared with the Spark tests
on a broker. Proxies are per test, each on free loopback ports, and must exit cleanly on
SIGTERM; a module whose tests only pass their own traffic through one shares it
(`shared_proxy`). When a test fails, the logs of the proxies it used are attached to its report.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess
from tests.conftest import LEFT_OPEN_PROPERTY
from tests.integration.helpers.proxies import ProxyFactory
from tests.integration.helpers.quota_proxy import ConfiguredProxy

_PROXIES = pytest.StashKey[list[ProxyProcess]]()
_CLIENT_TYPES = (Producer, Consumer, AdminClient)


@pytest.fixture
def start_proxy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProxyFactory]:
    """start_proxy(cluster, sasl=False) -> a running ProxyProcess in front of that cluster."""
    started: list[ProxyProcess] = []
    logged = request.node.stash.setdefault(_PROXIES, [])

    def start(cluster: KafkaCluster, sasl: bool = False) -> ProxyProcess:
        upstream = cluster.sasl_bootstrap if sasl else cluster.bootstrap
        proxy = ProxyProcess(upstream, tmp_path / f"proxy-{len(started) + 1}.log")
        started.append(proxy)
        logged.append(proxy)
        proxy.start()
        return proxy

    yield start
    exit_codes = {proxy.log_path.name: proxy.stop() for proxy in started}
    unclean = {name: code for name, code in exit_codes.items() if code != 0}
    assert not unclean, f"proxy did not exit cleanly on SIGTERM: {unclean}"


@pytest.fixture(scope="module")
def shared_proxy(kafka_3nodes: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    """One proxy in front of `kafka_3nodes` for every test of a module that only passes its own
    traffic through a proxy (none reads the proxy's metrics or log, or needs it fresh): one start
    and one stop per module rather than per test. Tests take it through `proxy_for_test`, which
    puts its log into the report of a test that fails; its clean exit on SIGTERM is asserted
    once, at the module's end."""
    proxy = ProxyProcess(kafka_3nodes.bootstrap, tmp_path_factory.mktemp("shared-proxy") / "proxy.log")
    proxy.start()
    yield proxy
    code = proxy.stop()
    assert code == 0, f"the module's proxy did not exit cleanly on SIGTERM: {code}\n{proxy.log_tail()}"


@pytest.fixture
def proxy_for_test(request: pytest.FixtureRequest, shared_proxy: ProxyProcess) -> ProxyProcess:
    """The module's `shared_proxy`, ready, its log in this test's report if the test fails."""
    request.node.stash.setdefault(_PROXIES, []).append(shared_proxy)
    assert shared_proxy.readyz() == 200
    return shared_proxy


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


def _open_clients(collect: bool = True) -> dict[int, object]:
    if collect:
        gc.collect()
    # type(o), not isinstance: isinstance asks a weakref.proxy for its referent's __class__, which
    # raises ReferenceError once that referent is gone (kafka-python leaves such proxies behind;
    # one failed the teardown of test_plain_kafka_python on a fresh clone, ci8).
    return {id(o): o for o in gc.get_objects() if issubclass(type(o), _CLIENT_TYPES)}


@pytest.fixture(autouse=True)
def close_clients_left_open(request: pytest.FixtureRequest) -> Iterator[None]:
    """A librdkafka client a test forgets keeps reconnecting to its stopped proxy for the rest
    of the session (CPU on a 2-core machine, and pages of log over the next failure's output):
    close it here and name the test in the summary.

    Only the look after the test collects garbage first (clients a test dropped are freed, not
    named); the look before it need not: the previous test's look after it collected, and a
    full collection over the session's heap (Spark, pandas, pyarrow loaded) is a fraction of a
    second of CPU, twice per test in the real-time line."""
    before = _open_clients(collect=False)
    yield
    for key, client in _open_clients().items():
        if key in before:
            continue
        try:
            _close_if_open(client)
        except RuntimeError:
            continue  # the test had closed it: the object merely outlived the test
        # A user property travels with the test's report to the controller of an xdist run,
        # where tests/conftest.py prints the summary; a module-level list would stay in the worker.
        request.node.user_properties.append((LEFT_OPEN_PROPERTY, type(client).__name__))


def _close_if_open(client: object) -> None:
    """Close a client still open; RuntimeError when it was closed already."""
    if isinstance(client, Producer):
        client.poll(0)  # raises once closed
        client.close()
    elif isinstance(client, Consumer):
        client.assignment()  # raises once closed
        client.close()
    # AdminClient (confluent-kafka 2.16) has no close(): it is only named.


@pytest.fixture
def mutation_proxy(kafka_1node: KafkaCluster, tmp_path: Path) -> Iterator[tuple[ConfiguredProxy, Path]]:
    """A proxy in front of `kafka_1node` with controller_mutation_rate 5 for client-id `creator`."""
    config = tmp_path / "quotas.yaml"
    config.write_text(
        "# quotas for the mutation test\n"
        "quotas:\n"
        "  entries:\n"
        "    - entity: {client-id: creator}\n"
        "      controller_mutation_rate: 5\n"
    )
    proxy = ConfiguredProxy(kafka_1node.bootstrap, tmp_path / "proxy.log", config)
    proxy.start()
    try:
        yield proxy, config
    finally:
        assert proxy.stop() == 0, proxy.log_tail()
