"""Rows/s of the Spark replay jobs (`analyze`, `whatif`, `advise`) on synthetic captures of growing size.

    .venv/bin/python bench/spark_replay.py --sizes 1000000 10000000 --master 'local[2]'

For every size the script writes a synthetic capture once (not timed: it stands for a capture
the proxy already wrote), then runs each job in a fresh Python process exactly as an operator
would (`python -m kqp.spark_jobs.<job> ...`), so the wall time includes the JVM and Spark
start-up. The jobs' own progress lines are relayed with a prefix, so a 10M run shows where it
is. At the end: a table of seconds and rows/s per (job, size), and for every job the growth
exponent between consecutive sizes (time ~ size^k; k = 1 is linear), as text and as JSON.

The capture keeps a constant request rate (`--rate` requests/s), so a bigger capture is a
longer window, as a longer real capture would be.

`floor` is the floor the jobs are measured against: the plain Spark SQL query analyze's headline
figures need (per broker and second: NW_IN, NW_OUT, requests; p50/p99/max of each per broker;
bytes per client-id), run the same way (a fresh process, `--master` alike, Spark start-up
included). The table gives analyze's time relative to it (target: 2.5x); naming `floor` twice in
`--jobs` (before and after the others) shows how much the machine moved meanwhile.

`whatif` replays QUOTAS_YAML in `--whatif-mode` (deferral by default, the mode advise's
verification runs). `advise` runs against ADVISE_CAPACITY (NW_IN/NW_OUT low enough that the
heavy clients of the synthetic capture are limited, so the water-filling and the verification
replay both work). The table gives both relative to `analyze` on the same capture (target: 1.5x).

Every run records the load average (/proc/loadavg, 1 min) when it starts and ends: on a shared
machine a ratio is only as good as the loads of its two runs were alike.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CAPACITY_FILE = REPO / "config" / "capacity.json"
TARGET_10M_ANALYZE_S = 180.0
# whatif --mode deferral and advise, each against analyze on the same capture (issue 43).
TARGET_REPLAY_OVER_ANALYZE = 1.5
TARGET_ANALYZE_OVER_FLOOR = 2.5
JOBS = ("floor", "analyze", "whatif", "advise")
# The floor query, in Spark SQL over the capture's own columns (docs/capture-schema.md).
FLOOR_PER_SECOND = """
SELECT upstream_node_id AS broker, CAST(floor(ts_request_received_us / 1000000) AS BIGINT) AS second,
       SUM(request_bytes) AS nw_in, SUM(COALESCE(response_bytes, 0)) AS nw_out, COUNT(*) AS requests
FROM capture GROUP BY 1, 2
"""
FLOOR_PER_BROKER = """
SELECT broker,
       percentile(nw_in, array(0.5, 0.99)) AS nw_in_p50_p99, MAX(nw_in) AS nw_in_max,
       percentile(nw_out, array(0.5, 0.99)) AS nw_out_p50_p99, MAX(nw_out) AS nw_out_max,
       percentile(requests, array(0.5, 0.99)) AS requests_p50_p99, MAX(requests) AS requests_max
FROM per_second GROUP BY broker ORDER BY broker
"""
FLOOR_PER_CLIENT = """
SELECT client_id, SUM(request_bytes + COALESCE(response_bytes, 0)) AS bytes FROM capture GROUP BY client_id
"""
# 2,000 KB/s per broker (1.6 MB/s at Cruise Control's 0.8): below what the synthetic capture's
# heaviest clients put on a broker at 2,000 requests/s.
ADVISE_CAPACITY = {
    "brokerCapacities": [
        {"brokerId": "-1", "capacity": {"DISK": "100000", "CPU": "100", "NW_IN": "2000", "NW_OUT": "2000"}}
    ]
}

# A what-if config in the proxy's YAML: every client-id gets a produce and a consume budget
# low enough that the Zipf-heavy clients of the synthetic capture get throttled.
QUOTAS_YAML = """\
quotas:
  entries:
    - entity: {client-id: "<default>"}
      producer_byte_rate: 2000000
      consumer_byte_rate: 4000000
"""


@dataclass
class Measurement:
    job: str
    rows: int
    seconds: float
    rows_per_s: float
    exit_code: int
    load_before: float  # 1 min load average when the job started
    load_after: float


def load_average() -> float:
    """The machine's 1 min load average, read from the kernel."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def generate(rows: int, rate: int, directory: Path) -> None:
    if (directory / "_complete").exists():
        log(f"reusing capture {directory}")
        return
    seconds = max(60, rows // rate)
    log(f"generating {rows:,} requests over {seconds} s in {directory}")
    started = time.monotonic()
    command = [sys.executable, "-m", "kqp.spark_jobs.synthetic", str(directory)]
    subprocess.run(
        [*command, "--requests", str(rows), "--seconds", str(seconds)],
        check=True,
        cwd=REPO,
    )
    (directory / "_complete").write_text("")
    log(f"generated in {time.monotonic() - started:.1f} s (not counted)")


def floor_query(capture: str, master: str) -> int:
    """The floor: analyze's headline aggregation in plain Spark SQL, in this (fresh) process."""
    from kqp.spark_jobs.session import get_spark

    started = time.monotonic()
    spark = get_spark("kqp-floor", master)
    print(f"[floor 1/3 {time.monotonic() - started:6.1f}s] Spark started", file=sys.stderr, flush=True)
    spark.read.parquet(capture).createOrReplaceTempView("capture")
    spark.sql(FLOOR_PER_SECOND).createOrReplaceTempView("per_second")
    brokers = spark.sql(FLOOR_PER_BROKER).collect()
    clients = spark.sql(FLOOR_PER_CLIENT).collect()
    print(
        f"[floor 2/3 {time.monotonic() - started:6.1f}s] {len(brokers)} brokers, {len(clients)} client-ids",
        file=sys.stderr,
        flush=True,
    )
    for row in brokers:
        print(f"[floor 3/3 {time.monotonic() - started:6.1f}s] {row.asDict()}", file=sys.stderr, flush=True)
    spark.stop()
    return 0


def job_command(job: str, capture: Path, output: Path, master: str, quotas: Path, whatif_mode: str) -> list[str]:
    if job == "floor":
        return [sys.executable, str(Path(__file__).resolve()), "--floor-query", str(capture), "--master", master]
    command = [sys.executable, "-m", f"kqp.spark_jobs.{job}", str(capture), "--output", str(output), "--master", master]
    if job == "analyze":
        command += ["--capacity", str(CAPACITY_FILE)]
    elif job == "whatif":
        command += ["--quotas", str(quotas), "--mode", whatif_mode]
    elif job == "advise":
        command += ["--capacity", str(quotas.parent / "advise-capacity.json")]
    return command


def run_job(
    job: str, rows: int, capture: Path, output: Path, master: str, quotas: Path, whatif_mode: str
) -> Measurement:
    """Run one job in a fresh process, relaying its progress lines; wall time includes start-up."""
    load_before = load_average()
    log(f"{job} on {rows:,} requests ({master}), load average {load_before:.2f}")
    started = time.monotonic()
    process = subprocess.Popen(
        job_command(job, capture, output, master, quotas, whatif_mode),
        cwd=REPO,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stderr is not None
    tail: list[str] = []
    for line in process.stderr:
        # Spark's console progress bar ends its updates with a carriage return, not a newline:
        # a progress line written after one shares its line, behind the bar.
        line = line.rstrip().rsplit("\r", 1)[-1]
        tail = [*tail, line][-20:]
        # Progress lines only; Spark's own logging is noise here.
        if line.startswith(f"[{job} "):
            log(f"  {line}")
    code = process.wait()
    elapsed = time.monotonic() - started
    load_after = load_average()
    if code not in (0, 3):  # 3 = a budget was violated, still a complete run
        log(f"{job} failed with exit code {code}; last lines:\n" + "\n".join(tail))
    log(f"{job} on {rows:,}: {elapsed:.1f} s, {rows / elapsed:,.0f} rows/s, load {load_before:.2f} -> {load_after:.2f}")
    return Measurement(
        job=job,
        rows=rows,
        seconds=elapsed,
        rows_per_s=rows / elapsed,
        exit_code=code,
        load_before=load_before,
        load_after=load_after,
    )


def growth_exponents(measurements: list[Measurement]) -> dict[str, list[dict[str, float]]]:
    """Per job, k in time ~ size^k between each pair of consecutive sizes (a job run twice at a
    size, as `--jobs floor ... floor` does, counts with its first run there)."""
    result: dict[str, list[dict[str, float]]] = {}
    for job in sorted({m.job for m in measurements}):
        first_at: dict[int, Measurement] = {}
        for m in measurements:
            if m.job == job and m.exit_code in (0, 3):
                first_at.setdefault(m.rows, m)
        runs = sorted(first_at.values(), key=lambda m: m.rows)
        result[job] = [
            {
                "from_rows": a.rows,
                "to_rows": b.rows,
                "time_ratio": b.seconds / a.seconds,
                "exponent": math.log(b.seconds / a.seconds) / math.log(b.rows / a.rows),
            }
            for a, b in itertools.pairwise(runs)
        ]
    return result


def ratio_lines(measurements: list[Measurement]) -> list[str]:
    """The issue's targets: analyze against every floor run of its size, whatif and advise against analyze."""
    completed = [m for m in measurements if m.exit_code in (0, 3)]
    lines = []
    for analyze in (m for m in completed if m.job == "analyze"):
        for floor in (m for m in completed if m.job == "floor" and m.rows == analyze.rows):
            ratio = analyze.seconds / floor.seconds
            lines.append(
                f"analyze / floor on {analyze.rows:,} rows: x{ratio:.2f} ({analyze.seconds:.1f} s vs"
                f" {floor.seconds:.1f} s, loads {analyze.load_before:.2f}-{analyze.load_after:.2f} vs"
                f" {floor.load_before:.2f}-{floor.load_after:.2f}; target x{TARGET_ANALYZE_OVER_FLOOR}):"
                f" {'met' if ratio <= TARGET_ANALYZE_OVER_FLOOR else 'MISSED'}"
            )
        for replay in (m for m in completed if m.job in ("whatif", "advise") and m.rows == analyze.rows):
            ratio = replay.seconds / analyze.seconds
            lines.append(
                f"{replay.job} / analyze on {analyze.rows:,} rows: x{ratio:.2f} ({replay.seconds:.1f} s vs"
                f" {analyze.seconds:.1f} s, loads {replay.load_before:.2f}-{replay.load_after:.2f} vs"
                f" {analyze.load_before:.2f}-{analyze.load_after:.2f}; target x{TARGET_REPLAY_OVER_ANALYZE}):"
                f" {'met' if ratio <= TARGET_REPLAY_OVER_ANALYZE else 'MISSED'}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument(
        "--jobs", nargs="+", choices=JOBS, default=list(JOBS), help="jobs to time, in this order (a job may repeat)"
    )
    parser.add_argument("--whatif-mode", choices=("deferral", "open_loop"), default="deferral")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--rate", type=int, default=2_000, help="requests/s of the synthetic capture")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kqp-bench"))
    parser.add_argument("--quotas", type=Path, help="quota YAML for whatif (default: a client-id default quota)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--floor-query", metavar="CAPTURE", help=argparse.SUPPRESS)  # the `floor` job's process
    args = parser.parse_args(argv)
    if args.floor_query:
        return floor_query(args.floor_query, args.master)

    args.workdir.mkdir(parents=True, exist_ok=True)
    quotas = args.quotas or args.workdir / "quotas.yaml"
    if args.quotas is None:
        quotas.write_text(QUOTAS_YAML)
    (quotas.parent / "advise-capacity.json").write_text(json.dumps(ADVISE_CAPACITY))
    measurements: list[Measurement] = []
    for rows in sorted(args.sizes):
        capture = args.workdir / f"capture-{rows}"
        generate(rows, args.rate, capture)
        for job in args.jobs:
            output = args.workdir / f"{job}-{rows}"
            measurements.append(run_job(job, rows, capture, output, args.master, quotas, args.whatif_mode))

    print(f"\nSpark replay jobs, master {args.master}, {os.cpu_count()} CPUs visible; wall time incl. Spark start-up")
    print(f"whatif mode: {args.whatif_mode}; load: 1 min load average at the job's start -> end")
    print(f"{'job':<8} {'requests':>12} {'seconds':>9} {'rows/s':>10}  exit  load")
    for m in measurements:
        print(
            f"{m.job:<8} {m.rows:>12,} {m.seconds:>9.1f} {m.rows_per_s:>10,.0f}  {m.exit_code:>4}"
            f"  {m.load_before:.2f} -> {m.load_after:.2f}"
        )
    exponents = growth_exponents(measurements)
    for job, steps in exponents.items():
        for step in steps:
            print(
                f"{job}: {step['from_rows']:,} -> {step['to_rows']:,} rows: time x{step['time_ratio']:.2f} "
                f"(time ~ size^{step['exponent']:.2f})"
            )
    ten_million = [m for m in measurements if m.job == "analyze" and m.rows == 10_000_000]
    if ten_million:
        verdict = "met" if ten_million[0].seconds < TARGET_10M_ANALYZE_S else "MISSED"
        print(f"target: 10M analysed in < {TARGET_10M_ANALYZE_S:.0f} s: {verdict} ({ten_million[0].seconds:.1f} s)")
    for line in ratio_lines(measurements):
        print(line)
    if args.json:
        document = {"master": args.master, "runs": [asdict(m) for m in measurements], "growth": exponents}
        args.json.write_text(json.dumps(document, indent=2))
    return 0 if all(m.exit_code in (0, 3) for m in measurements) else 1


if __name__ == "__main__":
    sys.exit(main())
