"""Which build of kqp runs: the compiled modules (setup.py, mypyc) or their sources, never a mix.

`make test` sets KQP_EXPECT_BUILD=compiled for the whole suite, and the last test here runs the
protocol and quota tests again with KQP_PURE=1 and KQP_EXPECT_BUILD=pure, so that a build that
silently fell back to the sources (no compiler, a stale extension) fails CI instead of passing
slower, and both builds pass the same tests."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

import kqp
from kqp.compiled_modules import COMPILED_MODULES


def _loaded_files() -> dict[str, str]:
    return {name: str(importlib.import_module(name).__file__) for name in COMPILED_MODULES}


def _is_extension(path: str) -> bool:
    return any(path.endswith(suffix) for suffix in EXTENSION_SUFFIXES)


def test_every_compiled_module_is_loaded_as_the_build_says() -> None:
    files = _loaded_files()
    if kqp.BUILD == "compiled":
        assert kqp.PURE_BECAUSE is None
        assert {name: path for name, path in files.items() if not _is_extension(path)} == {}
    else:
        assert kqp.PURE_BECAUSE
        assert {name: path for name, path in files.items() if not path.endswith(".py")} == {}


def test_the_build_is_the_one_this_run_expects() -> None:
    expected = os.environ.get("KQP_EXPECT_BUILD")
    if expected is None:
        pytest.skip("KQP_EXPECT_BUILD is not set (make test sets it)")
    running = kqp.BUILD
    assert running == expected, kqp.PURE_BECAUSE


def test_kqp_pure_loads_every_listed_module_from_its_source() -> None:
    script = (
        "import importlib, json, kqp\n"
        "from kqp.compiled_modules import COMPILED_MODULES\n"
        "files = {n: importlib.import_module(n).__file__ for n in COMPILED_MODULES}\n"
        "print(json.dumps([kqp.BUILD, kqp.PURE_BECAUSE, files]))\n"
    )
    env = {**os.environ, "KQP_PURE": "1"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    build, because, files = json.loads(out.stdout)
    assert (build, because) == ("pure", "KQP_PURE=1")
    assert {name: path for name, path in files.items() if not path.endswith(".py")} == {}


REPO = Path(__file__).resolve().parents[2]
# The tests of what both builds must do alike: the compiled modules are in kqp.protocol and
# kqp.quotas, beside kqp.frozen_value, the pickling of their frozen dataclasses,
# kqp.proxy.traffic_metrics, the metric accumulators, kqp.spark_jobs.replay_loop, the
# replay's loop, whose scheduler tests need no Spark session, and the hooks of every request,
# enforcement's chain and Kafka's charging, and observation (kqp/compiled_modules.py).
PURE_PASS = ("tests/unit/test_build.py", "tests/unit/test_pickling.py", "tests/unit/protocol", "tests/unit/quotas",
             "tests/unit/proxy/test_metrics.py", "tests/unit/proxy/policies", "tests/unit/proxy/test_observation.py",
             "tests/spark/test_quota_replay.py", "tests/unit/test_replay_filter.py")
# Of those, the tests whose code is interpreted in both builds: the generated codec's decoding and
# encoding (kqp.protocol.generated, wire, apis, codec; the generated classes subclass wire.Message,
# which cannot be compiled: kqp/compiled_modules.py). On the pure build they would run the code the
# main pass ran once more. The error-code scan (322 tests, 6 s pure) runs whole: it walks Produce
# responses with their compiled walks (kqp.protocol.generated.walks.produce), which the watcher
# below found when they were compiled.
# Traced on the pure build (2026-11-28), 1,405 of the pure pass's 2,926 tests called no function
# of a compiled module, and the three codec tests, 1,014 of them (the error-code scan 322), took
# 53 s of those tests' 59 s (of 160 s traced). The pure pass runs of the two above only a sample,
# every version of Produce and Metadata (the requests and responses kqp reads most; their
# parameter ids begin so in both), watched by tests/unit/helpers/compiled_calls.py: a sampled
# test that reaches a compiled module fails there.
INTERPRETED_IN_BOTH_BUILDS = (
    "tests/unit/protocol/test_generated_codec.py::test_decode_reads_to_the_end_and_encode_gives_the_same_bytes[",
    "tests/unit/protocol/test_control_plane_codec.py::test_decode_then_encode_is_byte_identical[",
)
INTERPRETED_SAMPLE = ("Produce-v", "Metadata-v")


# A test of its own rather than a second pytest run after the suite: under `make test` it runs in
# the unit tests' pytest, beside the real-time tests (tests/run_suite.sh), not after them.
@pytest.mark.timeout(3600)
def test_the_protocol_and_quota_tests_pass_on_the_pure_build_too() -> None:
    if os.environ.get("KQP_EXPECT_BUILD") != "compiled":
        pytest.skip("runs when the suite runs on the compiled build (make test)")
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PYTEST_", "KQP_"))}  # none of the caller's pytest or build settings
    env.update(KQP_PURE="1", KQP_EXPECT_BUILD="pure")
    watched = [*(f"--interpreted-in-both-builds={prefix}" for prefix in INTERPRETED_IN_BOTH_BUILDS),
               *(f"--interpreted-sample={start}" for start in INTERPRETED_SAMPLE)]
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "-p", "tests.unit.helpers.compiled_calls", *watched, *PURE_PASS],
                            cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    summary = result.stdout.splitlines()[-1]
    assert "passed" in summary and "deselected" in summary, result.stdout[-2000:]
