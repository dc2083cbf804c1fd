"""What every part of the suite shares: the real Kafka clusters, which tests are integration tests,
and the summary of librdkafka clients tests left open.

The clusters are session-scoped and start only when a test asks for them: one single-node
cluster for the integration tests and the Spark tests on a broker alike (a start and a stop of
a broker less in the real-time line), and one of three nodes. A broker that fails to start
raises with the tail of its log.

tests/integration/conftest.py names, on each test's report, a librdkafka client the test left
open (it closes it); the summary is printed here, from the reports, so that it is printed
wherever the reports arrive (a plugin that runs tests in other processes included).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.local_kafka import KafkaCluster

INTEGRATION_DIR = Path(__file__).parent / "integration"
# The fixtures that start a real Kafka cluster: the two below, and the Spark tests' `kafka`
# (tests/spark/conftest.py: `kafka_1node` by the name those tests use).
REAL_KAFKA_FIXTURES = frozenset({"kafka_1node", "kafka_3nodes", "kafka"})


def _cluster(nodes: int) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(nodes=nodes)
    # start() stops what it launched and raises with the brokers' log tails if start-up fails.
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop(kill=True)  # the session's end: its data goes with it, no one waits for a clean stop


@pytest.fixture(scope="session")
def kafka_1node() -> Iterator[KafkaCluster]:
    yield from _cluster(1)


@pytest.fixture(scope="session")
def kafka_3nodes() -> Iterator[KafkaCluster]:
    yield from _cluster(3)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/integration, and every test that uses a real Kafka cluster (the
    Spark jobs' live replay, the advice's closed loop, the real capture), is marked
    `integration`, whether or not its module says so: tests/run_suite.sh runs exactly those one
    after another (`-m integration`), as they measure on the wall clock, and the rest beside
    them, so a test that forgot the marker must not run beside them."""
    for item in items:
        uses_real_kafka = not REAL_KAFKA_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
        if uses_real_kafka or INTEGRATION_DIR in item.path.parents:
            item.add_marker(pytest.mark.integration)

LEFT_OPEN_PROPERTY = "librdkafka client left open"
_left_open: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        _left_open.extend(f"{report.nodeid}: {value}" for name, value in report.user_properties
                          if name == LEFT_OPEN_PROPERTY)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _left_open:
        terminalreporter.section("librdkafka clients left open by tests (closed after them)")
        for line in _left_open:
            terminalreporter.line(line)
