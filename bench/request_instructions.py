"""Instructions the proxy executes per request, counted by the CPU or by valgrind: a figure that
does not move with the machine's load, so that each step of the per-request path can be
compared with the one before on a busy machine.

    .venv/bin/python bench/request_instructions.py [--paths relay connection hooks defaults]
        [--repeat 3] [--counter auto|perf|valgrind] [--keep DIR]

The same hops as bench/request_cpu.py (the bare relay's two protocol objects; a
`ProxiedConnection` with no hooks; one with the hooks `kqp serve` installs and a `<default>`
producer quota, as request_cpu's; one with the hooks of `kqp serve` run with no configuration,
as bench/proxy_throughput.py runs it: quota admin, enforcement with no quota, metrics), fed
small Produce requests and their responses, 5 in flight, warm, on uvloop's event loop. Each hop runs in a child
process twice, once for SHORT and once for LONG requests, with the same frames built
beforehand in both; the difference divided by LONG - SHORT is what one request and its
response cost, with start-up and frame building cancelled out. The child runs with
PYTHONHASHSEED=0, so that two runs hash alike.

User-space instructions only, counted by `perf stat -e instructions:u` where the kernel lets
perf count (Debian's linux-perf), else by valgrind's cachegrind (no cache simulation; about
30x slower, hence fewer requests: VALGRIND_SHORT and VALGRIND_LONG). `--keep DIR` keeps
cachegrind's output of each run (`<path>-<requests>.cg`): `cg_diff` of a path's two files then
`cg_annotate` of the difference says which functions the instructions of the extra requests
went to. The system calls of a real hop come on top (bench/hop_cost.py).

Instructions are not time: a cache miss costs no instruction. bench/request_cpu.py
`--cold-mb` measures that side.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import uvloop

SHORT, LONG = 10_000, 30_000
VALGRIND_SHORT, VALGRIND_LONG = 2_000, 6_000
PATHS = ("relay", "connection", "hooks", "defaults")
COUNTERS = ("auto", "perf", "valgrind")


def stamped(frame: bytes, count: int, offset: int) -> list[bytes]:
    """`count` copies of a sized frame with correlation ids 0.. at `offset`: what building each
    frame gives (the batch is the same in all), at a fraction of the cost under valgrind."""
    return [frame[:offset] + index.to_bytes(4, "big") + frame[offset + 4:] for index in range(count)]


def run_hop(path: str, requests: int, built: int) -> None:
    """Child process: build `built` frames, then push the first `requests` through one hop."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import request_cpu as rc  # the child only: the parent needs no Kafka codec

    from kqp.proxy.hooks import TrafficHooks
    from kqp.proxy.topics import TopicDirectory

    async def drive() -> None:
        # Sized frames: the request's correlation id after size, api key and version; the response's after size.
        frames = stamped(rc.sized(rc.produce_frame(0, 100, 1)), built, 8)
        answers = stamped(rc.sized(rc.produce_response_frame(0)), built, 4)
        hop: rc.Hop
        if path == "relay":
            hop = rc.RelayHop()
        elif path == "connection":
            hop = rc.connection(TrafficHooks())
        else:
            hop = rc.connection(rc.kqp_serve_hooks(TopicDirectory(), default_quota=path == "hooks"))
        rc.run_round(hop, frames[:requests], answers[:requests])

    # On uvloop, as `kqp serve` runs (its loop's clock is a C call, asyncio's a Python one).
    uvloop.run(drive())


def perf_counts() -> bool:
    """Whether `perf stat` can count user-space instructions here (not in many VMs)."""
    if shutil.which("perf") is None:
        return False
    done = subprocess.run(["perf", "stat", "-x", ",", "-e", "instructions:u", "true"], capture_output=True, text=True)
    return done.returncode == 0 and any(line.split(",")[0].isdigit() for line in done.stderr.splitlines())


def instructions(counter: str, path: str, requests: int, built: int, keep: Path | None) -> int:
    child = [sys.executable, __file__, "--child", path, str(requests), str(built)]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if counter == "perf":
        command = ["perf", "stat", "-x", ",", "-e", "instructions:u", *child]
    else:
        out = str(keep / f"{path}-{requests}.cg") if keep is not None else "/dev/null"
        command = ["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}", *child]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr.strip()}")
    for line in done.stderr.splitlines():
        if counter == "perf" and "instructions" in line:
            return int(line.split(",")[0])
        found = re.search(r"I\s+refs:\s+([\d,]+)", line)
        if counter == "valgrind" and found:
            return int(found.group(1).replace(",", ""))
    raise RuntimeError(f"{counter} printed no instruction count: {done.stderr.strip()}")


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        run_hop(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--repeat", type=int, default=3, help="measurements per path (the median is printed)")
    parser.add_argument("--counter", choices=COUNTERS, default="auto",
                        help="perf stat, valgrind's cachegrind, or perf where it can count (auto)")
    parser.add_argument("--keep", type=Path, default=None, help="valgrind: keep cachegrind's files in this folder")
    args = parser.parse_args()
    counter = args.counter
    if counter == "auto":
        counter = "perf" if perf_counts() else "valgrind"
    if counter == "perf" and not perf_counts():
        print("perf cannot count instructions:u here (not installed, or the kernel does not let it)", file=sys.stderr)
        return 2
    if counter == "valgrind" and shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: valgrind)", file=sys.stderr)
        return 2
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    short, long = (SHORT, LONG) if counter == "perf" else (VALGRIND_SHORT, VALGRIND_LONG)
    import kqp  # the build the children run: they import the same tree

    print(f"kqp from {Path(kqp.__file__).parent} (its {kqp.BUILD} build); Produce v11 requests of 1 record of "
          f"100 bytes, 5 in flight; user-space instructions per request+response by {counter} "
          f"({long} minus {short} requests, median of {args.repeat})")
    for path in args.paths:
        counts = []
        for _ in range(args.repeat):
            counts.append((instructions(counter, path, long, long, args.keep)
                           - instructions(counter, path, short, long, args.keep)) / (long - short))
            print(f"  {path}: {counts[-1]:,.0f}", file=sys.stderr, flush=True)
        print(f"  {path:12s} {statistics.median(counts):9,.0f} instructions per request+response "
              f"(runs: {', '.join(f'{c:,.0f}' for c in counts)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
