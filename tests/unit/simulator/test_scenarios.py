"""The scenario table, seed by seed: kqp's admitted rate against the quota and against Kafka's
figure for the same clients, fairness between a client's connections, and no request time-out
that Kafka would not also cause (tests/unit/helpers/simulator/table.py). A failure prints both
figures and the one command that replays the seed."""

from __future__ import annotations

import shlex

import pytest

from tests.unit.helpers.simulator.scenario import parse_scenario, simulate
from tests.unit.helpers.simulator.table import ROWS, Row, violations


def _cases() -> list[object]:
    cases: list[object] = []
    for row in ROWS:
        for seed in range(row.seeds):
            marks = []
            if seed in row.failing_seeds:
                marks.append(pytest.mark.xfail(strict=True, reason=f"finding: {row.finding}"))
            cases.append(pytest.param(row, seed, id=f"{row.scenario.name}-seed{seed}", marks=marks))
    return cases


@pytest.mark.parametrize(("row", "seed"), _cases())
def test_scenario_seed(row: Row, seed: int) -> None:
    outcome = simulate(row.scenario, seed)
    found = violations(outcome)
    assert not found, "\n".join([outcome.describe(), *found])


def test_the_table_has_the_scenario_seeds_the_issue_asks_for() -> None:
    assert sum(row.seeds for row in ROWS) >= 300
    assert all(seed < row.seeds for row in ROWS for seed in row.failing_seeds)


def test_every_rows_replay_command_names_its_scenario_exactly() -> None:
    for row in ROWS:
        argument = shlex.split(row.scenario.replay_command(3))[3]
        assert parse_scenario(argument) == row.scenario
