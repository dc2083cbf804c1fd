"""kqp: a Kafka-protocol-aware proxy that enforces Apache Kafka's client quota model.

The per-request modules listed in kqp/compiled_modules.py may be compiled (setup.py). Importing
kqp decides once which build the process runs: the compiled one when every listed module has
an extension module at least as new as its source, else, or with KQP_PURE=1 in the
environment, the pure one, all from source. Never a mix: mypyc's modules call each other in C,
so one module from source beside compiled ones would run two copies of its classes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import (
    BYTECODE_SUFFIXES,
    EXTENSION_SUFFIXES,
    SOURCE_SUFFIXES,
    FileFinder,
    ModuleSpec,
    SourceFileLoader,
    SourcelessFileLoader,
)
from pathlib import Path
from types import ModuleType

from kqp.compiled_modules import COMPILED_MODULES, SHARED_LIBRARY

__version__ = "0.1.0"


class _SourceOnlyFinder(MetaPathFinder):
    """Finds kqp's modules from their `.py` files only, passing over compiled extension modules."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not fullname.startswith("kqp.") or path is None:
            return None
        for entry in path:
            finder = FileFinder(entry, (SourceFileLoader, SOURCE_SUFFIXES), (SourcelessFileLoader, BYTECODE_SUFFIXES))
            spec = finder.find_spec(fullname, target)
            if spec is not None:
                return spec
        return None


def _why_pure() -> str | None:
    """None when the compiled build can run; else why the pure one runs."""
    if os.environ.get("KQP_PURE") == "1":
        return "KQP_PURE=1"
    root = Path(__file__).parent.parent
    # The modules' code lives in one shared library (the small per-module ones only import it),
    # rebuilt whenever one of the sources changed: a source newer than it means a stale build.
    shared = [root / f"{SHARED_LIBRARY}{suffix}" for suffix in EXTENSION_SUFFIXES]
    built = [path.stat().st_mtime for path in shared if path.exists()]
    # Only a checkout (setup.py beside kqp) is edited after its build; an installed wheel's files
    # all carry the times of their unpacking.
    checkout = (root / "setup.py").exists()
    if not built:
        return "kqp's modules are not compiled"
    for name in COMPILED_MODULES:
        source = root / (name.replace(".", "/") + ".py")
        if not any(source.with_suffix(suffix).exists() for suffix in EXTENSION_SUFFIXES):
            return f"{name} is not compiled"
        if checkout and source.stat().st_mtime > built[0]:
            return f"{name}'s source is newer than the compiled build: run `make setup` to rebuild"
    return None


#: Why this process runs the pure build, or None when it runs the compiled one.
PURE_BECAUSE = _why_pure()
BUILD = "pure" if PURE_BECAUSE else "compiled"
if PURE_BECAUSE is not None:
    sys.meta_path.insert(0, _SourceOnlyFinder())
