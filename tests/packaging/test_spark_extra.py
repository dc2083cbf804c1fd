"""A user who installs `kafka-quota-proxy[spark]` (and nothing else) can run every `kqp replay` job.

The package is built from a copy of what a source distribution holds (pyproject.toml, README.md,
kqp/) and installed with its `spark` extra into a fresh virtualenv by pip, dependencies and all,
from pip's warm cache. Then every third-party module any kqp module imports (at the top or inside a
function, such as `live`'s confluent_kafka) must import there, and the command line must answer.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JOBS = ("analyze", "whatif", "live", "generate")


def third_party_imports(package: Path) -> set[str]:
    """Top-level names of the non-stdlib modules the package's code imports anywhere."""
    names: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {name for name in names if name not in sys.stdlib_module_names and name != package.name}


def run(command: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{' '.join(command)} exited {result.returncode}:\n{result.stdout[-2000:]}\n" \
                                   f"{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def spark_only_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("spark-extra")
    source = root / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "kqp", source / "kqp", ignore=shutil.ignore_patterns("__pycache__"))
    env_dir = root / "venv"
    # No pip inside the new venv: this interpreter's pip installs into it (`pip --python`), which
    # saves bootstrapping a second pip. The install is a real one: build, resolve, download.
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", f"{source}[spark]"], timeout=900)
    return env_dir


def test_the_extra_brings_every_module_kqp_imports(spark_only_venv: Path) -> None:
    names = sorted(third_party_imports(REPO / "kqp"))
    assert {"pyspark", "pandas", "confluent_kafka", "matplotlib"} <= set(names)
    script = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    run([str(spark_only_venv / "bin" / "python"), "-c", script, *names])
    # Only the spark extra was asked for: the dev tools are not there.
    missing = subprocess.run([str(spark_only_venv / "bin" / "python"), "-c", "import pytest"],
                             capture_output=True, check=False)
    assert missing.returncode != 0


def test_the_command_line_answers(spark_only_venv: Path) -> None:
    kqp = str(spark_only_venv / "bin" / "kqp")
    assert "serve" in run([kqp, "--help"]).stdout
    usage = run([kqp, "replay", "--help"]).stdout
    for job in JOBS:
        assert job in usage
        assert run([kqp, "replay", job, "--help"]).stdout.startswith("usage:")
