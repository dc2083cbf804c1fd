"""What the installed packages may import: only themselves, the standard library and their declared
dependencies. The checkout's harness/ and tests/ are not shipped, so no module of kqp, nor of the
simulator kqpsim (installed beside it), may need them."""

from __future__ import annotations

import ast
from pathlib import Path

KQP = Path(__file__).resolve().parents[2] / "kqp"
KQPSIM = KQP.parent / "kqpsim"
NOT_SHIPPED = ("harness", "tests", "bench")


def imported_top_levels(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_kqp_nor_kqpsim_module_imports_the_checkout_only_folders() -> None:
    offenders = {
        str(path.relative_to(KQP.parent)): sorted(imported_top_levels(path) & set(NOT_SHIPPED))
        for path in sorted([*KQP.rglob("*.py"), *KQPSIM.rglob("*.py")])
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_scan_sees_the_package() -> None:
    assert len(list(KQP.rglob("*.py"))) > 20
    assert "kqp" in imported_top_levels(KQP / "cli.py")
    assert "kqp" in imported_top_levels(KQPSIM / "scenario.py")
