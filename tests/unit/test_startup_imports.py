"""What `kqp serve` loads before it serves: no kafka-python, no JSON definition, and of the
generated codec only what the proxy's own modules need at import (issue 40)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _loaded_after(statement: str) -> dict[str, object]:
    script = (
        "import sys\n"
        "opened = []\n"
        "sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == 'open' else None)\n"
        f"{statement}\n"
        "import json\n"
        "print(json.dumps({'modules': sorted(sys.modules), 'opened': opened}))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO)
    loaded: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return loaded


def test_the_proxy_and_cli_import_no_kafka_python_and_read_no_definition() -> None:
    loaded = _loaded_after("import kqp.proxy.app, kqp.cli")
    modules = loaded["modules"]
    assert isinstance(modules, list)
    assert not [name for name in modules if name == "kafka" or name.startswith("kafka.")]
    assert not [path for path in loaded["opened"] if "kafka_message_definitions" in str(path)]  # type: ignore[attr-defined]
    # At most Fetch's walks (the fast path finds its top-level tagged fields at import); every
    # other API's generated modules wait for the first frame of that API.
    generated = {name for name in modules if name.startswith("kqp.protocol.generated.")}
    assert generated <= {"kqp.protocol.generated.walks", "kqp.protocol.generated.walks.fetch"}
