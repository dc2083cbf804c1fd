"""A pytest plugin (`-p tests.unit.helpers.compiled_calls`) for the pure pass of
tests/unit/test_build.py, which names with `--interpreted-in-both-builds=PREFIX` the tests whose
code is interpreted in both builds, and with `--interpreted-sample=ID_START` the parameter ids of
those it still runs.

The others of them are deselected: on the pure build they would run the very code the main pass
ran (test_build.py says which and why). The sample runs watched: a sampled test fails if any
function of a compiled module (kqp/compiled_modules.py) runs while it does, so the day one of
them reaches a compiled module the pure pass says so. Only the pure build can be watched: a
compiled function runs as C, unseen by `sys.settrace`."""

from __future__ import annotations

import sys
import threading
from collections.abc import Generator
from types import FrameType
from typing import Any

import pytest

import kqp
from kqp.compiled_modules import COMPILED_MODULES

_COMPILED = frozenset(COMPILED_MODULES)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--interpreted-in-both-builds", action="append", default=[], metavar="PREFIX",
                     help="node id prefix of tests interpreted in both builds: only their sample runs, watched")
    parser.addoption("--interpreted-sample", action="append", default=[], metavar="ID_START",
                     help="how the parameter ids of the sample of those tests begin")


def _prefixes(config: pytest.Config) -> tuple[str, ...]:
    return tuple(config.getoption("--interpreted-in-both-builds"))


def _sampled(config: pytest.Config, nodeid: str) -> bool:
    return nodeid.rsplit("[", 1)[-1].startswith(tuple(config.getoption("--interpreted-sample")))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    prefixes = _prefixes(config)
    if not prefixes:
        return
    if kqp.BUILD != "pure":
        raise pytest.UsageError("a compiled module's calls can be seen on the pure build only (KQP_PURE=1)")
    for prefix in prefixes:
        # A prefix that names no test, or a sample that names none of its tests, would leave
        # nothing watched: the list in test_build.py must follow the tests it names.
        named = [item.nodeid for item in items if item.nodeid.startswith(prefix)]
        if not named or not any(_sampled(config, nodeid) for nodeid in named):
            raise pytest.UsageError(f"{prefix}: {len(named)} tests, none of them sampled")
    left_out = [item for item in items if item.nodeid.startswith(prefixes) and not _sampled(config, item.nodeid)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        kept = set(items) - set(left_out)
        items[:] = [item for item in items if item in kept]


class _Watch:
    def __init__(self) -> None:
        self.called: set[str] = set()

    def trace(self, frame: FrameType, event: str, arg: Any) -> None:
        # Call events only (returning None asks for no tracing inside the frame). The module is the
        # frame's globals' name, so that a dataclass's generated methods count as their module's.
        name = frame.f_globals.get("__name__")
        if name in _COMPILED:
            self.called.add(name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    if not item.nodeid.startswith(_prefixes(item.config)):
        return (yield)
    watch = _Watch()
    sys.settrace(watch.trace)
    threading.settrace(watch.trace)
    try:
        result = yield
    finally:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
    assert not watch.called, (f"{item.nodeid} calls compiled modules {sorted(watch.called)}: "
                              "the pure pass must run it whole (tests/unit/test_build.py)")
    return result
