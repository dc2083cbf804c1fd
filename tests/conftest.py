"""What every part of the suite shares: which tests may run beside which under `make test`.

`make test` runs pytest with two pytest-xdist workers (`-n 2 --dist loadgroup`). The tests that
measure on the wall clock (tests/integration: real Kafka, real clients, quotas in real time;
tests/spark: a local Spark session and the advice's closed loop on real Kafka) form one group, so
one worker runs them one after another exactly as a serial run does, and no two of them ever share
the machine. The other worker runs the unit tests beside them: CPU-bound work beside the wire tests
is a condition they must stand anyway (issue 39 asks the suite to pass with a busy loop on the
host), and it takes the unit tests' minutes off the suite's length.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REAL_TIME = (TESTS / "integration", TESTS / "spark")
REAL_TIME_GROUP = "real-time"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.path.is_relative_to(folder) for folder in REAL_TIME):
            item.add_marker(pytest.mark.xdist_group(REAL_TIME_GROUP))


# tests/integration/conftest.py names, on each test's report, a librdkafka client the test left
# open (it closes it); the summary is printed here, where an xdist run's reports arrive.
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
