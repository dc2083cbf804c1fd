"""The deterministic simulator's scenario table for many seeds (issue 33): `make test` runs a
few seeds of each row (tests/unit/simulator/test_scenarios.py), this runs thousands.

    .venv/bin/python bench/simulator.py                      # 100 seeds of every row, progress per row
    .venv/bin/python bench/simulator.py --seeds 500 --rows consumer
    .venv/bin/python bench/simulator.py --replay 'connections=5' --seed 7   # one scenario-seed, figures in full

Each scenario-seed runs the modelled clients through the real proxy and against the broker
model that enforces the quota itself (Kafka's figure), on virtual time: the same seed gives the
same numbers on any machine and under any load. What a seed must show is
kqpsim/table.py's `violations`. A seed whose violations are all of the
kinds its row's `Finding` shows is counted as that finding, apart from new failures (`make test`
also asserts each finding's figures in their measured bands on its own seeds); the exit status
is 1 when any seed fails otherwise. A report goes to out/simulator.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kqpsim.scenario import parse_scenario, simulate
from kqpsim.table import ROWS, violations


def replay(text: str, seed: int) -> int:
    outcome = simulate(parse_scenario(text), seed)
    print(outcome.describe())
    found = violations(outcome)
    for violation in found:
        print("  VIOLATION:", violation)
    print(f"  digest {outcome.digest()}")
    return 1 if found else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=100, help="seeds per row (0 .. N-1)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--rows", default="", help="only rows whose name contains this")
    parser.add_argument("--replay", default=None, help="a scenario as the failing test printed it")
    parser.add_argument("--seed", type=int, default=0, help="with --replay: the seed")
    parser.add_argument("--out", default="out/simulator.md")
    args = parser.parse_args()
    if args.replay is not None:
        return replay(args.replay, args.seed)
    rows = [row for row in ROWS if args.rows in row.scenario.name]
    started = time.perf_counter()
    lines = ["| scenario | seeds | failing | of which known findings | kqp admitted (min-max) | "
             "Kafka admitted (min-max) | seconds |", "|---|---|---|---|---|---|---|"]
    new_failures = 0
    total = 0
    for index, row in enumerate(rows, 1):
        row_started = time.perf_counter()
        failing: list[int] = []
        known = 0
        kqp_rates, kafka_rates = [], []
        first_new: str | None = None
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            outcome = simulate(row.scenario, seed)
            total += 1
            kqp_rates.append(outcome.kqp.admitted)
            kafka_rates.append(outcome.kafka.admitted)
            found = violations(outcome)
            if found:
                failing.append(seed)
                # Known: every violation of a kind the row's finding shows (its bands are measured
                # on the seeds of make test only, which the test asserts).
                if row.finding is not None and all(v.kind in row.finding.kinds for v in found):
                    known += 1
                elif first_new is None:
                    first_new = "\n".join([outcome.describe(), *map(str, found)])
        new_failures += len(failing) - known
        seconds = time.perf_counter() - row_started
        print(f"[{index}/{len(rows)}] {row.scenario.name}: {len(failing)}/{args.seeds} seeds fail "
              f"({known} a known finding), kqp {min(kqp_rates):.3f}-{max(kqp_rates):.3f}x, "
              f"Kafka {min(kafka_rates):.3f}-{max(kafka_rates):.3f}x, {seconds:.1f} s", flush=True)
        if first_new is not None:
            print("  first new failure:\n  " + first_new.replace("\n", "\n  "), flush=True)
        lines.append(f"| {row.scenario.name} | {args.seeds} | {len(failing)} | {known} | "
                     f"{min(kqp_rates):.3f}-{max(kqp_rates):.3f} | {min(kafka_rates):.3f}-{max(kafka_rates):.3f} | "
                     f"{seconds:.1f} |")
    elapsed = time.perf_counter() - started
    summary = f"{total} scenario-seeds in {elapsed:.0f} s; {new_failures} failing seeds outside the known findings"
    print(summary)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("# Simulator: the scenario table over many seeds\n\n" + "\n".join(lines) + f"\n\n{summary}\n")
    return 1 if new_failures else 0


if __name__ == "__main__":
    sys.exit(main())
