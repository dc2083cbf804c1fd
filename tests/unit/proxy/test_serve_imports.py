"""What `kqp serve` loads: with the guard and capture off (the default), neither numpy (nor
pyarrow, which brings it) nor any Spark job; the opt-in features load theirs when configured.

Each case runs in a fresh interpreter, since this test process has long imported everything.
The proxy starts for real (listeners on free ports, the metrics endpoint too; the upstream
is never dialled) and stops.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

_SERVE = """
import asyncio, json, socket, sys
from kqp.config.models import CommandLine
from kqp.proxy.app import ProxyApp, load_serve_setup
from kqp.quotas import QuotaEngine

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])

ports = CommandLine(upstream=["127.0.0.1:9"], bind_host="127.0.0.1", bootstrap_port=free_port(),
                    node_port_base=free_port(), metrics_port=free_port())
setup = load_serve_setup([sys.argv[1]], ports)
assert setup is not None

async def main() -> None:
    app = ProxyApp(setup.settings, QuotaEngine(setup.config.quota_settings()), config=setup.config,
                   files=setup.files, command_line=setup.command_line)
    await app.start()
    await app.stop()

asyncio.run(main())
print(json.dumps(sorted(sys.modules)))
"""


def _modules_of_serve(config: Path) -> set[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _SERVE, str(config)], cwd=config.parent, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def _heavy(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in ("numpy", "pyarrow", "pyspark")
            or m.startswith("kqp.spark_jobs")}


def test_serve_with_the_guard_and_capture_off_loads_no_numpy_and_no_spark_job(tmp_path: Path) -> None:
    config = tmp_path / "kqp.yaml"
    config.write_text("quotas:\n  entries:\n    - entity: {client-id: app}\n      producer_byte_rate: 1048576\n")
    modules = _modules_of_serve(config)
    assert "kqp.proxy.server" in modules  # the proxy did start
    assert _heavy(modules) == set()


def test_serve_with_the_guard_on_loads_its_numpy(tmp_path: Path) -> None:
    # The other side of the same check: the guard's step does run numpy, so the test above
    # would see it if the guard's modules were imported regardless of the configuration.
    config = tmp_path / "kqp.yaml"
    config.write_text(f"guard:\n  enabled: true\n  capacity_file: {REPO / 'config' / 'capacity.json'}\n")
    modules = _modules_of_serve(config)
    assert "numpy" in modules
    assert "kqp.quotas.guard" in modules
    assert not {m for m in modules if m.startswith("kqp.spark_jobs")}
