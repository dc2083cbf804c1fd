"""What `kqp serve`'s imports cost at start, with and without bytecode caches, and what they load.

    .venv/bin/python bench/import_cost.py [--runs 7]

Each run is a fresh interpreter that imports what `python -m kqp serve` imports before it
serves (`kqp.proxy.app`, `kqp.cli`) under `-X importtime`, with the build of the environment
(compiled, or pure with KQP_PURE=1). Three cases of bytecode, each in a cache directory of this
run's own (`-X pycache_prefix`), so that the checkout's `__pycache__` folders are neither used
nor left behind: every module's bytecode written beforehand (a wheel install, or `python -m
compileall kqp` as `make test` runs it); the same but none for kqp's own modules (a checkout run
with PYTHONDONTWRITEBYTECODE=1, as on this project's build hosts: installed packages come with
their bytecode); and none at all (every module compiled from source).

Prints per case the median (min-max) of: the cumulative `-X importtime` of the two imports,
the interpreter's wall time, its RSS after the imports; and, from the first run, whether
kafka-python was loaded, how many JSON files the imports opened, and how many of the generated
codec's per-API modules (messages and response walks) were imported beside the number of APIs
the proxy decodes (issue 40, acceptance 3).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IMPORTS = ("kqp.proxy.app", "kqp.cli")

# Runs in the child: what it loaded and how much memory it holds once the imports are done.
PROBE = """
import sys
import kqp.proxy.app, kqp.cli
import json, kqp
from kqp.protocol.apis import DECODED_APIS

def generated(kind):
    prefix = f"kqp.protocol.generated.{kind}."
    return sum(1 for name in sys.modules if name.startswith(prefix))

rss_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS"))
print("PROBE" + json.dumps({
    "build": kqp.BUILD,
    "kafka_python": any(name == "kafka" or name.startswith("kafka.") for name in sys.modules),
    "messages": generated("messages"),
    "walks": generated("walks"),
    "decoded_apis": len(DECODED_APIS),
    "rss_kb": rss_kb,
}))
"""

# The JSON files the imports open (a separate run: the wrapper around open would add to the time).
JSON_PROBE = """
import builtins, io
opened = []
real_open = io.open

def recording_open(file, *args, **kwargs):
    if str(file).endswith(".json"):
        opened.append(str(file))
    return real_open(file, *args, **kwargs)

builtins.open = io.open = recording_open
import kqp.proxy.app, kqp.cli
print(len(opened))
"""


def run_once(pycache_prefix: Path) -> tuple[float, float, dict[str, object]]:
    """(seconds of cumulative importtime for IMPORTS, wall seconds, the probe's report)."""
    command = [sys.executable, "-X", "importtime", "-X", f"pycache_prefix={pycache_prefix}",
               "-c", PROBE]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=True)
    wall = time.perf_counter() - started
    cumulative_us = 0
    for line in done.stderr.splitlines():
        # "import time: self [us] | cumulative | imported package"
        if not line.startswith("import time:") or "|" not in line:
            continue
        _self, cumulative, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
        if name.strip() in IMPORTS:
            cumulative_us += int(cumulative)
    report = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("PROBE"))[5:])
    return cumulative_us / 1e6, wall, report


def json_files_opened(pycache_prefix: Path) -> int:
    done = subprocess.run([sys.executable, "-X", f"pycache_prefix={pycache_prefix}", "-c", JSON_PROBE],
                          capture_output=True, text=True, cwd=REPO, check=True)
    return int(done.stdout.strip())


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    print("| bytecode caches | build | importtime s | wall s | RSS MB | kafka-python | JSON files opened | "
          "generated modules imported (messages, walks) / APIs decoded |")
    print("|---|---|---:|---:|---:|---|---:|---|")
    with tempfile.TemporaryDirectory(prefix="kqp-import-cost-") as scratch:
        cached = Path(scratch) / "cached"
        # One run with bytecode writing on fills this run's cache directory with every module the
        # imports load (the standard library's too: with a cache prefix set, Python reads only there).
        writing = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
        subprocess.run([sys.executable, "-X", f"pycache_prefix={cached}", "-c", "import kqp.proxy.app, kqp.cli"],
                       check=True, cwd=REPO, env=writing)
        # The same caches but kqp's: a checkout run with PYTHONDONTWRITEBYTECODE=1 (installed packages
        # come with their bytecode, the checkout's own modules get none).
        all_but_kqp = Path(scratch) / "all-but-kqp"
        shutil.copytree(cached, all_but_kqp)
        shutil.rmtree(all_but_kqp / (REPO / "kqp").relative_to("/"))
        cases = (("all modules compiled beforehand", lambda: cached),
                 ("all but kqp's (PYTHONDONTWRITEBYTECODE=1 in a checkout)", lambda: all_but_kqp),
                 ("none (every module compiled from source)", lambda: Path(tempfile.mkdtemp(dir=scratch))))
        for label, make_prefix in cases:
            runs = [run_once(make_prefix()) for _ in range(args.runs)]
            first = runs[0][2]
            rss = [int(str(report["rss_kb"])) / 1024 for _, _, report in runs]
            print(f"| {label} | {first['build']} | {spread([r[0] for r in runs])} | {spread([r[1] for r in runs])} | "
                  f"{statistics.median(rss):.0f} | {'loaded' if first['kafka_python'] else 'not loaded'} | "
                  f"{json_files_opened(make_prefix())} | "
                  f"{first['messages']}, {first['walks']} / {first['decoded_apis']} |", flush=True)


if __name__ == "__main__":
    main()
