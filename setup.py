"""Builds kqp's per-request modules (kqp/compiled_modules.py) with mypyc from their own source.

pyproject.toml holds the package's metadata; this file only adds the compiled modules. Without
mypyc or a C compiler, or with KQP_PURE=1 in the environment, it builds the pure package (the
same `.py` files, interpreted) and says so. `make setup` runs it in place
(`python setup.py build_ext --inplace`); `pip wheel .` builds a compiled wheel (README).
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

LISTED = runpy.run_path("kqp/compiled_modules.py")
MODULES: tuple[str, ...] = LISTED["COMPILED_MODULES"]
# mypyc names the shared library `<group_name>__mypyc`.
GROUP_NAME: str = LISTED["SHARED_LIBRARY"].removesuffix("__mypyc")


class BuildOrFallBack(build_ext):
    """A failed C build (no compiler, no Python headers) leaves the pure package, with a warning."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # distutils raises several unrelated types for a missing compiler
            print(f"warning: kqp's compiled modules were not built ({error}); the pure build is used",
                  file=sys.stderr)


def compiled_extensions() -> list[Any]:
    if os.environ.get("KQP_PURE") == "1":
        print("KQP_PURE=1: building the pure package", file=sys.stderr)
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("warning: mypyc (part of mypy) is not installed; building the pure package", file=sys.stderr)
        return []
    paths = [name.replace(".", "/") + ".py" for name in MODULES]
    # The compiled modules are a part of the tree: mypy's section overrides for the rest of kqp
    # would otherwise be reported unused, which mypyc treats as an error.
    return mypycify(["--no-warn-unused-configs", *paths], opt_level=os.environ.get("KQP_OPT_LEVEL", "3"),
                    group_name=GROUP_NAME)


setup(ext_modules=compiled_extensions(), cmdclass={"build_ext": BuildOrFallBack})
