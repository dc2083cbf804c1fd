"""`kqp replay --package OUT.zip`: the zip that `spark-submit --py-files` ships to executors."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kqp.spark_jobs.cli import main

KQP = Path(__file__).resolve().parents[2] / "kqp"


def test_the_zip_holds_the_package_and_imports_from_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "out" / "kqp.zip"
    assert main(["--package", str(target)]) == 0
    assert f"--py-files {target}" in capsys.readouterr().out
    names = zipfile.ZipFile(target).namelist()
    sources = {path.relative_to(KQP.parent).as_posix() for path in KQP.rglob("*.py")}
    assert sources <= set(names)
    assert "kqp/py.typed" in names
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    # From the zip alone (-I: no site-packages, no editable install, no current directory).
    probe = f"import sys; sys.path.insert(0, {str(target)!r}); import kqp.spark_jobs.cli as m; print(m.__file__)"
    result = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == f"{target}/kqp/spark_jobs/cli.py"


def test_package_needs_exactly_one_argument(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--package"]) == 2
    assert "--package takes one argument" in capsys.readouterr().err
