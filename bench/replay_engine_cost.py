"""CPU per request of the whatif replay's Python side on one replay task, build against build.

    .venv/bin/python bench/replay_engine_cost.py [--capture DIR] [--runs 3] [--tree OLDER_CHECKOUT]

Issue 40's acceptance 2 asks for the whatif replay's engine cost per request; docs/benchmarks.md
measured it on the largest replay task of the 1M capture of bench/spark_replay.py (broker 0,
client-id app-0, that bench's what-if quotas), in process CPU, split into the charges
(quota_replay.charged_inputs) and the deferral replay through the engine (quota_replay.replay_group:
the scheduler and the engine's calls). This script is that measurement, so it can be rerun:

1. Once, cached in --workdir: without --capture, bench/spark_replay.py's 1M capture is generated
   there as that bench generates it (same rate, same seed). Spark (local[1]) then reads the
   capture, gives it the replay's columns with whatif.prepare_requests, groups its (principal,
   client-id) pairs as whatif does (quota_groups with the settings' sharing) and keeps the rows
   of one task: the group of --client-id on --broker, as its applyInPandas task receives them
   (mutations decoded). Not timed.
2. For every build, alternating, --runs times: a fresh Python process loads those rows and times,
   with time.process_time, charged_inputs once and replay_group in deferral mode --repeats times,
   each with a fresh engine from whatif.engine_replay_functions (what a task builds). The process
   CPU covers the Python work only: Spark is not running.

Builds: `compiled` (this checkout's compiled build; it must be built and current), `pure`
(KQP_PURE=1), and with --tree DIR, the code of another checkout (e.g. `git archive` of an older
commit, which holds no compiled modules), run pure. The result: µs per request of each part, each
run, and the medians, as text and as JSON (--json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
# bench/spark_replay.py's default request rate, so that its 1M capture is the one generated here.
SPARK_REPLAY_RATE = 2_000


def extract_task(capture: Path, quotas: Path, broker: int, client_id: str, rows_path: Path) -> int:
    """Stage 1: the rows one whatif replay task receives, written to `rows_path`; their count."""
    from pyspark.sql import functions as F

    from kqp.spark_jobs.capture_source import read_capture
    from kqp.spark_jobs.session import get_spark
    from kqp.spark_jobs.whatif import (
        decode_mutations,
        load_quota_settings,
        prepare_requests,
        quota_groups,
        replay_traffic,
        sharing,
    )

    settings = load_quota_settings(str(quotas))
    spark = get_spark("kqp-replay-engine-cost", "local[1]")
    try:
        requests = prepare_requests(read_capture(spark, str(capture)))
        link_users, link_client_ids = sharing(settings)
        groups = quota_groups(replay_traffic(requests, bounds=False).pairs, link_users, link_client_ids)
        wanted = {pair for pair, group in groups.items() if pair[1] == client_id}
        if not wanted:
            raise SystemExit(f"no client-id {client_id!r} in {capture}")
        members = [pair for pair, group in groups.items() if group in {groups[p] for p in wanted}]
        in_group = F.lit(False)
        for principal, member_client_id in members:
            in_group = in_group | ((F.col("principal") == principal) & (F.col("client_id") == member_client_id))
        frame = requests.where((F.col("broker") == broker) & in_group).toPandas()
    finally:
        spark.stop()
    decode_mutations(frame).to_parquet(rows_path)
    return len(frame)


def measure(rows_path: Path, quotas: Path, repeats: int) -> dict[str, object]:
    """Stage 2, in a fresh process: CPU of the charges and of the deferral replay on the task's rows."""
    import pandas as pd

    import kqp
    from kqp.spark_jobs.quota_replay import charged_inputs, replay_group
    from kqp.spark_jobs.whatif import engine_replay_functions, load_quota_settings

    settings = load_quota_settings(str(quotas))
    frame = pd.read_parquet(rows_path)
    n = len(frame)
    started = time.process_time()
    charged = charged_inputs(frame)
    charges_s = time.process_time() - started
    replay_s = []
    throttled = 0
    for _ in range(repeats):
        throttle, mutation = engine_replay_functions(settings)
        started = time.process_time()
        result = replay_group(charged, throttle, "deferral", mutation)
        replay_s.append(time.process_time() - started)
        throttled = int((result["sim_throttle_ms"] > 0).sum())
    return {
        "kqp": kqp.__file__,
        # A tree from before the compiled build has no PURE_BECAUSE: it can only run pure.
        "build": "compiled" if hasattr(kqp, "PURE_BECAUSE") and kqp.PURE_BECAUSE is None else "pure",
        "requests": n,
        "throttled_requests": throttled,
        "charges_us": charges_s / n * 1e6,
        "replay_us": [seconds / n * 1e6 for seconds in replay_s],
    }


def run_build(name: str, tree: Path, rows_path: Path, quotas: Path, repeats: int) -> dict[str, object]:
    environment = dict(os.environ, PYTHONPATH=str(tree))
    environment.pop("KQP_PURE", None)
    if name != "compiled":
        environment["KQP_PURE"] = "1"
    measuring = ["--measure", str(rows_path), "--quotas", str(quotas), "--repeats", str(repeats)]
    command = [sys.executable, __file__, *measuring]
    # The child's kqp comes from `tree` (PYTHONPATH): this script's directory is bench/, not a checkout.
    output = subprocess.run(command, env=environment, check=True, capture_output=True, text=True, cwd=tree).stdout
    result: dict[str, object] = json.loads(output.strip().splitlines()[-1])
    result["name"] = name
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capture", type=Path, help="a capture directory (default: spark_replay.py's 1M one)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kqp-replay-engine-cost"))
    parser.add_argument("--broker", type=int, default=0)
    parser.add_argument("--client-id", default="app-0")
    parser.add_argument("--runs", type=int, default=3, help="processes per build, alternating (default 3)")
    parser.add_argument("--repeats", type=int, default=2, help="replays per process, each with a fresh engine")
    parser.add_argument("--tree", type=Path, help="another checkout to time beside this one (pure)")
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--quotas", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.quotas, args.repeats)))
        return 0
    from spark_replay import QUOTAS_YAML, generate

    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.capture is None:
        args.capture = args.workdir / "capture-1000000"
        generate(1_000_000, SPARK_REPLAY_RATE, args.capture)
    quotas = args.workdir / "quotas.yaml"
    quotas.write_text(QUOTAS_YAML)
    rows_path = args.workdir / f"task-broker{args.broker}-{args.client_id}.parquet"
    if not rows_path.exists():
        count = extract_task(args.capture, quotas, args.broker, args.client_id, rows_path)
        print(f"extracted {count:,} rows of the task (broker {args.broker}, {args.client_id}) to {rows_path}")
    builds = [("compiled", REPO), ("pure", REPO)] + ([("tree", args.tree.resolve())] if args.tree else [])
    results = []
    for run in range(args.runs):
        for name, tree in builds:
            result = run_build(name, tree, rows_path, quotas, args.repeats)
            results.append(result)
            print(
                f"run {run + 1} {name:8} ({result['build']}, {result['kqp']}): {result['requests']:,} requests,"
                f" {result['throttled_requests']:,} throttled; charges {result['charges_us']:.2f} µs,"
                f" replay {', '.join(f'{us:.2f}' for us in result['replay_us'])} µs per request",  # type: ignore[attr-defined]
                flush=True,
            )
    print("medians (µs per request; replay over every repeat of every run):")
    for name, _tree in builds:
        mine = [r for r in results if r["name"] == name]
        replays = [us for r in mine for us in r["replay_us"]]  # type: ignore[attr-defined]
        charges = [r["charges_us"] for r in mine]
        print(
            f"  {name:8} charges {statistics.median(charges):.2f} ({min(charges):.2f}-{max(charges):.2f}),"  # type: ignore[type-var]
            f" replay {statistics.median(replays):.2f} ({min(replays):.2f}-{max(replays):.2f})"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
