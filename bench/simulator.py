"""The deterministic simulator's scenario table for many seeds (issue 33): `make test` runs a
few seeds of each row (tests/unit/simulator/test_scenarios.py), this runs thousands.

    .venv/bin/python bench/simulator.py                      # 100 seeds of every row, progress per row
    .venv/bin/python bench/simulator.py --seeds 500 --rows consumer

One scenario-seed, its figures in full and second by second: `python -m kqpsim run ROW --seed N --trace`.

Each scenario-seed runs the modelled clients through the real proxy and against the broker
model that enforces the quota itself (Kafka's figure), on virtual time: the same seed gives the
same numbers on any machine and under any load. What a row must show over its seeds is
kqpsim/table.py's `violations` (kqp's figures against Kafka's, paired by rank over the seeds).
A row whose violations are all of the kinds its `Finding` shows is counted as that finding
(`make test` also asserts each finding's figures in their measured bands over its own seeds);
the exit status is 1 when any row fails otherwise. A report goes to out/simulator.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kqpsim.scenario import simulate
from kqpsim.table import ROWS, figures, sample, violations


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=100, help="seeds per row (0 .. N-1)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--rows", default="", help="only rows whose name contains this")
    parser.add_argument("--out", default="out/simulator.md")
    args = parser.parse_args()
    rows = [row for row in ROWS if args.rows in row.scenario.name]
    started = time.perf_counter()
    lines = ["| scenario | seeds | violations (by rank) | verdict | kqp admitted (min-median-max) | "
             "Kafka admitted (min-median-max) | seconds |", "|---|---|---|---|---|---|---|"]
    new_failures = 0
    total = 0
    for index, row in enumerate(rows, 1):
        row_started = time.perf_counter()
        samples = [sample(simulate(row.scenario, seed))
                   for seed in range(args.first_seed, args.first_seed + args.seeds)]
        total += len(samples)
        found = violations(row.scenario, samples)
        # Known: every violation of a kind the row's finding shows (its bands are measured over
        # the seeds of make test only, which the test asserts).
        if not found:
            verdict = "pass"
        elif row.finding is not None and all(v.kind in row.finding.kinds for v in found):
            verdict = "known finding"
        else:
            verdict = "FAIL"
            new_failures += 1
        kqp_rates = sorted(figures("over", s)[0] for s in samples)
        kafka_rates = sorted(figures("over", s)[1] for s in samples)
        spans = [f"{r[0]:.3f}-{r[len(r) // 2]:.3f}-{r[-1]:.3f}" for r in (kqp_rates, kafka_rates)]
        seconds = time.perf_counter() - row_started
        print(f"[{index}/{len(rows)}] {row.scenario.name}: {verdict}, {len(found)} violations, kqp {spans[0]}x, "
              f"Kafka {spans[1]}x, {seconds:.1f} s", flush=True)
        if verdict == "FAIL":
            print("  " + "\n  ".join(map(str, found)), flush=True)
        lines.append(f"| {row.scenario.name} | {args.seeds} | {len(found)} | {verdict} | {spans[0]} | {spans[1]} | "
                     f"{seconds:.1f} |")
    elapsed = time.perf_counter() - started
    summary = f"{total} scenario-seeds in {elapsed:.0f} s; {new_failures} rows failing outside the known findings"
    print(summary)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("# Simulator: the scenario table over many seeds\n\n" + "\n".join(lines) + f"\n\n{summary}\n")
    return 1 if new_failures else 0


if __name__ == "__main__":
    sys.exit(main())
