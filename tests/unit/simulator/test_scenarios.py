"""The scenario table, seed by seed: kqp's admitted rate against the quota and against Kafka's
figure for the same clients, fairness between a client's connections, and no request time-out
that Kafka would not also cause (kqpsim/table.py). A seed that shows a
known finding asserts that finding's figures, each in its measured band, and nothing else. A
failure prints both figures and the one command that replays the seed."""

from __future__ import annotations

import shlex

import pytest

from kqpsim import table
from kqpsim.scenario import KIB, Scenario, parse_scenario, simulate
from kqpsim.table import ROWS, Band, Finding, Row, Violation, figures, unexplained


def _cases() -> list[object]:
    return [pytest.param(row, seed, id=f"{row.scenario.name}-seed{seed}{'-finding' if _shows(row, seed) else ''}")
            for row in ROWS for seed in range(row.seeds)]


def _shows(row: Row, seed: int) -> bool:
    return row.finding is not None and seed in row.finding.seeds


@pytest.mark.parametrize(("row", "seed"), _cases())
def test_scenario_seed(row: Row, seed: int) -> None:
    outcome = simulate(row.scenario, seed)
    problems = unexplained(row, seed, outcome)
    finding = f"\n  known finding: {row.finding.text}" if row.finding is not None and _shows(row, seed) else ""
    assert not problems, "\n".join([outcome.describe() + finding, *problems])


def test_every_finding_names_seeds_that_make_test_runs_and_a_band_for_each_figure() -> None:
    for row in ROWS:
        if row.finding is None:
            continue
        assert row.finding.seeds and max(row.finding.seeds) < row.seeds, row.scenario.name
        assert row.finding.bands, row.scenario.name
        for band in row.finding.bands:
            assert band.kqp[0] <= band.kqp[1] and band.kafka[0] <= band.kafka[1], (row.scenario.name, band)


def test_every_rows_replay_command_names_its_scenario_exactly() -> None:
    for row in ROWS:
        argument = shlex.split(row.scenario.replay_command(3))[3]
        assert parse_scenario(argument) == row.scenario


def test_a_seed_of_a_finding_fails_on_another_violation_a_figure_out_of_band_or_no_violation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Any scenario-seed will do (this one is cheap); the violations are planted, so the test
    # does not hang on what kqp does in it today.
    scenario = Scenario("librdkafka", 1, quota=64 * KIB, request_bytes=192 * KIB)
    outcome = simulate(scenario, 1)
    kqp, kafka = figures("over", outcome)
    measured = Band("over", kqp=(kqp, kqp), kafka=(kafka, kafka))
    row = Row(scenario, 2, Finding("planted", frozenset({1}), (measured,)))
    over = Violation("over", "client-0 admitted too much")

    def planted(*found: Violation) -> None:
        monkeypatch.setattr(table, "violations", lambda _outcome: list(found))

    planted(over)
    assert unexplained(row, 1, outcome) == []
    assert unexplained(row, 0, outcome) == ["client-0 admitted too much"]  # not one of the finding's seeds
    planted(over, Violation("timeouts", "2 request time-outs"))
    assert unexplained(row, 1, outcome) == ["not the finding's kind: 2 request time-outs"]
    planted()
    assert [p.split(":")[0] for p in unexplained(row, 1, outcome)] == ["the finding no longer shows on seed 1"]
    planted(over)
    narrow = Band("over", kqp=(kqp + 0.001, kqp + 0.01), kafka=(kafka, kafka))
    (problem,) = unexplained(Row(scenario, 2, Finding("planted", frozenset({1}), (narrow,))), 1, outcome)
    assert problem.startswith("out of the finding's band: over: kqp")
