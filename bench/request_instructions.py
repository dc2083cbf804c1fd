"""Instructions the proxy executes per request, counted by the CPU: a figure that does not move
with the machine's load, so that each step of the per-request path can be compared with the
one before on a busy machine.

    .venv/bin/python bench/request_instructions.py [--paths relay connection hooks] [--repeat 3]

The same hops as bench/request_cpu.py (the bare relay's two protocol objects; a
`ProxiedConnection` with no hooks; one with the hooks `kqp serve` installs), fed small
Produce requests and their responses, 5 in flight, warm. Each hop runs in a child process
under `perf stat -e instructions:u` twice, once for SHORT and once for LONG requests, with
the same frames built beforehand in both; the difference divided by LONG - SHORT is what one
request and its response cost, with start-up and frame building cancelled out. User-space
instructions only: the system calls of a real hop come on top (bench/hop_cost.py). Needs
`perf` (Debian's linux-perf) and a kernel that lets it count.

Instructions are not time: a cache miss costs no instruction. bench/request_cpu.py
`--cold-mb` measures that side.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

SHORT, LONG = 10_000, 30_000
PATHS = ("relay", "connection", "hooks")


def run_hop(path: str, requests: int) -> None:
    """Child process: build LONG frames, then push `requests` of them through one hop."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import request_cpu as rc  # the child only: the parent needs no Kafka codec

    from kqp.proxy.hooks import TrafficHooks
    from kqp.proxy.topics import TopicDirectory

    async def drive() -> None:
        frames = [rc.sized(rc.produce_frame(i, 100, 1)) for i in range(LONG)]
        answers = [rc.sized(rc.produce_response_frame(i)) for i in range(LONG)]
        hop: rc.Hop
        if path == "relay":
            hop = rc.RelayHop()
        elif path == "connection":
            hop = rc.connection(TrafficHooks())
        else:
            hop = rc.connection(rc.kqp_serve_hooks(TopicDirectory()))
        rc.run_round(hop, frames[:requests], answers[:requests])

    asyncio.run(drive())


def instructions(path: str, requests: int) -> int:
    command = ["perf", "stat", "-x", ",", "-e", "instructions:u", sys.executable, __file__,
               "--child", path, str(requests)]
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=os.environ)
    for line in done.stderr.splitlines():
        if "instructions" in line:
            return int(line.split(",")[0])
    raise RuntimeError(f"perf printed no instruction count: {done.stderr.strip()}")


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        run_hop(sys.argv[2], int(sys.argv[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--repeat", type=int, default=3, help="measurements per path (the median is printed)")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        print("perf is not installed (Debian: linux-perf)", file=sys.stderr)
        return 2
    print(f"Produce v11 requests of 1 record of 100 bytes, 5 in flight; user-space instructions per "
          f"request+response ({LONG} minus {SHORT} requests, median of {args.repeat})")
    for path in args.paths:
        counts = []
        for _ in range(args.repeat):
            counts.append((instructions(path, LONG) - instructions(path, SHORT)) / (LONG - SHORT))
            print(f"  {path}: {counts[-1]:,.0f}", file=sys.stderr, flush=True)
        print(f"  {path:12s} {statistics.median(counts):9,.0f} instructions per request+response "
              f"(runs: {', '.join(f'{c:,.0f}' for c in counts)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
