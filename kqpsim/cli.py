"""`python -m kqpsim`: run one scenario-seed and read it second by second.

    python -m kqpsim list                                   # the table's rows, their seeds, their findings
    python -m kqpsim run ROW                                # every seed of the row and its verdict
    python -m kqpsim run ROW --seed N                       # one seed: both figures, judged alone
    python -m kqpsim run ROW --seed N --trace               # ... and every second of both runs
    python -m kqpsim run 'model=consumer,connections=3' --seeds 5  # a scenario that is not a row
    python -m kqpsim digests > before.txt                   # every scenario-seed of make test, fingerprinted

ROW is a row's name as `list` prints it, or a scenario as `field=value,...` (what a failing
test's replay command gives). `make test` judges a row over its seeds, kqp's figures against
Kafka's paired by rank (kqpsim/table.py): without `--seed` this runs the same seeds (`--seeds N`:
0 .. N-1) and gives the same verdict: the row passes, shows its known finding with every figure
in its band, or fails; a scenario that is not a row passes when it shows no violation. With
`--seed N` the verdict is that seed's alone (a sample of one), which can differ from the row's.
The exit status is 0 unless it fails.
"""

from __future__ import annotations

import argparse
import hashlib
import math
from collections.abc import Sequence

from kqpsim import table
from kqpsim.clients import ConnectionRecord
from kqpsim.scenario import Figures, Outcome, Scenario, parse_scenario, simulate
from kqpsim.table import Sample


def _find(text: str) -> tuple[Scenario, table.Row | None]:
    for row in table.ROWS:
        if row.scenario.name == text:
            return row.scenario, row
    if "=" not in text:
        raise SystemExit(f"no row is named {text!r} (`python -m kqpsim list` names them), and it is not a "
                         "scenario's field=value,... either")
    scenario = parse_scenario(text)
    rows = [row for row in table.ROWS if row.scenario == scenario]
    return scenario, (rows[0] if rows else None)


def list_rows() -> int:
    print(f"{'seeds':>5}  {'finding':<7}  row")
    for row in table.ROWS:
        finding = "yes" if row.finding is not None else "-"
        print(f"{row.seeds:>5}  {finding:<7}  {row.scenario.name}")
    print(f"{len(table.ROWS)} rows, {sum(row.seeds for row in table.ROWS)} scenario-seeds in `make test`")
    return 0


def verdict(scenario: Scenario, samples: Sequence[Sample], row: table.Row | None) -> tuple[bool, list[str]]:
    """(passes, what to print): the verdict `make test` gives these scenario-seeds."""
    if row is None:
        found = [str(v) for v in table.violations(scenario, samples)]
        return not found, (["PASS (not a row of the table: no violation)"] if not found
                           else ["FAIL (not a row of the table)", *(f"  {v}" for v in found)])
    problems = table.unexplained(row, samples)
    if problems:
        return False, ["FAIL", *(f"  {p}" for p in problems)]
    if row.finding is not None:
        bands = "; ".join(f"{b.kind} kqp {b.kqp[0]}-{b.kqp[1]}, Kafka {b.kafka[0]}-{b.kafka[1]}"
                          for b in row.finding.bands)
        return True, [f"KNOWN FINDING, its figures in their bands ({bands}): {row.finding.text}"]
    return True, ["PASS"]


def digests(rows_containing: str) -> int:
    """Every scenario-seed `make test` runs (the rows whose name contains `rows_containing`), one
    line each: its digest (every acknowledgement of both runs) and its figures. Two runs of this
    that print the same lines ran the same simulation: what a change meant to be only faster
    (docs/testing.md, "What it costs") is checked with it, before and after."""
    whole = hashlib.sha256()
    for row in table.ROWS:
        if rows_containing not in row.scenario.name:
            continue
        for seed in range(row.seeds):
            outcome = simulate(row.scenario, seed)
            line = f"{row.scenario.name} {outcome.digest()} {table.sample(outcome).describe()}"
            whole.update(line.encode())
            print(line, flush=True)
    print(f"all: {whole.hexdigest()[:16]}")
    return 0


def _per_second(times: Sequence[float], values: Sequence[float], seconds: int) -> list[float]:
    totals = [0.0] * seconds
    for at, value in zip(times, values, strict=True):
        second = int(at)
        if 0 <= second < seconds:
            totals[second] += value
    return totals


def _unread_per_second(record: ConnectionRecord, seconds: int, end: float) -> list[float]:
    """Seconds within each second that the server's end of this client's connections did not
    read it: kqp's mute of a throttled connection, Kafka's muted channel, back-pressure."""
    totals = [0.0] * seconds
    for pauses in record.server_read_pauses:
        for start, stop in pauses:
            stop = end if stop is None else stop
            second = int(start)
            while second < seconds and second < stop:
                totals[second] += max(0.0, min(stop, second + 1) - max(start, second))
                second += 1
    return totals


class _Columns:
    """One run's per-second figures for each connection."""

    def __init__(self, figures: Figures, seconds: int, end: float) -> None:
        self.kib = [_per_second([t for t, _ in r.acks], [b / 1024 for _, b in r.acks], seconds)
                    for r in figures.records]
        self.throttles = [_per_second([t for t, _ in r.throttles], [1.0] * len(r.throttles), seconds)
                          for r in figures.records]
        self.throttle_ms = [_per_second([t for t, _ in r.throttles], [ms for _, ms in r.throttles], seconds)
                            for r in figures.records]
        self.unread = [_unread_per_second(r, seconds, end) for r in figures.records]
        self.timeouts = [_per_second(r.timeout_times, [1.0] * len(r.timeout_times), seconds)
                         for r in figures.records]

    def cell(self, connection: int, second: int) -> str:
        return (f"{self.kib[connection][second]:8.0f} {self.throttles[connection][second]:4.0f} "
                f"{self.throttle_ms[connection][second]:6.0f} {self.unread[connection][second] * 1000:6.0f} "
                f"{self.timeouts[connection][second]:3.0f}")

    def total(self, second: int) -> float:
        return sum(kib[second] for kib in self.kib)


def trace(outcome: Outcome) -> list[str]:
    """Every second of both runs, connection by connection: what was admitted (KiB acknowledged or
    delivered), how many answers carried a throttle and its milliseconds, how long the server's
    end did not read the connection (ms), and request time-outs."""
    scenario = outcome.scenario
    end = scenario.warmup + scenario.measure
    seconds = math.ceil(end)
    kqp, kafka = _Columns(outcome.kqp, seconds, end), _Columns(outcome.kafka, seconds, end)
    unit = "partitions" if scenario.clients.model == "admin" else "KiB"
    header = f"{unit:>8} thr. thr-ms unread t/o"
    lines = [f"each second (measured from {scenario.warmup:g} s to {end:g} s), per connection: "
             f"{unit} admitted, throttled answers (thr.), their ThrottleTimeMs (thr-ms), ms the server's end "
             "did not read it (unread: a mute, back-pressure), request time-outs (t/o)",
             f"{'s':>4} {'conn':>4} {'client-id':>10} | kqp {header} | Kafka {header}"]
    quota = scenario.quota.rate if scenario.clients.model == "admin" else scenario.quota.rate / 1024
    client_ids = scenario.clients.client_ids
    for second in range(seconds):
        for index, record in enumerate(outcome.kqp.records):
            lines.append(f"{second:>4} {index:>4} {record.client_id:>10} |     {kqp.cell(index, second)} |       "
                         f"{kafka.cell(index, second)}")
        mark = " (measured)" if scenario.warmup <= second < end else ""
        lines.append(f"{second:>4}  all {'':>10} | kqp {kqp.total(second) / quota / client_ids:.3f}x the "
                     f"quota, Kafka {kafka.total(second) / quota / client_ids:.3f}x{mark}")
    return lines


def run(text: str, seed: int | None, seeds: int | None, with_trace: bool) -> int:
    scenario, row = _find(text)
    if seed is not None:
        chosen = [seed]
    else:
        chosen = list(range(seeds if seeds is not None else row.seeds if row is not None else 1))
    samples = []
    for one in chosen:
        outcome = simulate(scenario, one)
        if with_trace:
            print("\n".join(trace(outcome)))
        print(outcome.describe())
        print(f"  digest {outcome.digest()}")
        samples.append(table.sample(outcome))
    passes, lines = verdict(scenario, samples, row)
    judged = f"seed {seed} alone" if seed is not None else f"seeds 0-{len(chosen) - 1}"
    print(f"verdict over {judged}: " + "\n".join(lines))
    return 0 if passes else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kqpsim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the scenario table's rows")
    one = commands.add_parser("run", help="run one scenario-seed through kqp and Kafka's model")
    one.add_argument("row", help="a row's name (see `list`), or a scenario as field=value,...")
    which = one.add_mutually_exclusive_group()
    which.add_argument("--seed", type=int, help="one seed, judged alone")
    which.add_argument("--seeds", type=int, help="seeds 0 .. N-1, judged together (default: the row's)")
    one.add_argument("--trace", action="store_true", help="print every second of both runs")
    fingerprints = commands.add_parser("digests", help="every scenario-seed of make test: its digest and figures")
    fingerprints.add_argument("--rows", default="", help="only rows whose name contains this")
    args = parser.parse_args(argv)
    if args.command == "list":
        return list_rows()
    if args.command == "digests":
        return digests(args.rows)
    return run(args.row, args.seed, args.seeds, args.trace)
