"""What every part of the suite shares: the summary of librdkafka clients tests left open.

tests/integration/conftest.py names, on each test's report, a librdkafka client the test left
open (it closes it); the summary is printed here, from the reports, so that it is printed
wherever the reports arrive (a plugin that runs tests in other processes included).
"""

from __future__ import annotations

import pytest

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
