"""Which build of kqp runs: the compiled modules (setup.py, mypyc) or their sources, never a mix.

`make test` sets KQP_EXPECT_BUILD=compiled for the whole suite and KQP_EXPECT_BUILD=pure with
KQP_PURE=1 for its second pass over the protocol and quota tests, so that a build that silently
fell back to the sources (no compiler, a stale extension) fails CI instead of passing slower."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES

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
