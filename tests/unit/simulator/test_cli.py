"""`python -m kqpsim`: one scenario-seed's verdict, and its per-second trace adding up to the
figures the verdict is computed from."""

from __future__ import annotations

import math

import pytest

from kqpsim import cli
from kqpsim.scenario import parse_scenario, simulate
from kqpsim.table import ROWS

# A cheap row with no finding: an admin client creating a topic of 10 partitions every 2 s.
CHEAP_ROW = "admin-1x1conn-q5-r10-jitter0.2ms"


def test_list_names_every_row_and_the_seed_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(row.scenario.name in out for row in ROWS)
    assert f"{sum(row.seeds for row in ROWS)} scenario-seeds" in out


def test_run_prints_the_verdict_of_make_test_and_the_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", CHEAP_ROW, "--seed", "1", "--trace"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "verdict over seed 1 alone: PASS" in out
    # One line per connection per second, then the second's total, for every virtual second.
    scenario = next(row.scenario for row in ROWS if row.scenario.name == CHEAP_ROW)
    seconds = math.ceil(scenario.warmup + scenario.measure)
    assert sum(1 for line in out if line.split()[1:2] == ["all"]) == seconds


def test_the_trace_adds_up_to_the_measured_figures() -> None:
    outcome = simulate(next(row.scenario for row in ROWS if row.scenario.name == CHEAP_ROW), 1)
    start, end = outcome.kqp.span
    for figures, side in ((outcome.kqp, "kqp"), (outcome.kafka, "kafka")):
        columns = cli._Columns(figures, int(end), end)
        traced = sum(columns.total(second) for second in range(int(start), int(end))) * 1024
        assert traced == pytest.approx(figures.rate_of("client-0") * (end - start)), side


def test_a_scenario_given_as_fields_gets_its_rows_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    # The fields of the row of a fleet with a slow exchange, judged over its first five seeds (seed 4
    # shows the finding).
    fields = "connections=4,instances=2,exchange_lag_s=0.5"
    assert next(row for row in ROWS if row.scenario == parse_scenario(fields)).finding is not None
    assert cli.main(["run", fields, "--seeds", "5"]) == 0
    assert "verdict over seeds 0-4: KNOWN FINDING, its figures in their bands (over kqp" in capsys.readouterr().out


def test_a_scenario_that_is_not_a_row_passes_on_no_violation(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_scenario("model=admin,rate=5,request_bytes=20") not in [row.scenario for row in ROWS]
    assert cli.main(["run", "model=admin,rate=5,request_bytes=20", "--seed", "0"]) == 0
    assert "verdict over seed 0 alone: PASS (not a row of the table: no violation)" in capsys.readouterr().out


def test_an_unknown_row_is_named_back() -> None:
    with pytest.raises(SystemExit, match="no row is named 'nope'"):
        cli.main(["run", "nope"])


def test_digests_fingerprint_every_seed_of_make_test(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["digests", "--rows", CHEAP_ROW]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(row for row in ROWS if row.scenario.name == CHEAP_ROW)
    assert len(lines) == row.seeds + 1 and lines[-1].startswith("all: ")
    assert lines[1].split()[:4] == [CHEAP_ROW, simulate(row.scenario, 1).digest(), "seed", "1:"]
