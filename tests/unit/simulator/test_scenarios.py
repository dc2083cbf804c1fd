"""The scenario table, row by row over its seeds: kqp's admitted rate against the quota and
against Kafka's figures for the same clients, fairness between a client's connections, and no
request time-out that Kafka would not also cause, kqp's figures and Kafka's compared as
distributions over the row's seeds, paired by rank (kqpsim/table.py). A row that shows a known
finding asserts that finding's figures, each in its measured band, and nothing else. A failure
prints every seed's figures and the command that replays a seed.

The selected rows run in two worker processes at the lowest priority from the first row's test on
(kqpsim/pool.py says why; KQP_SIM_PROCESSES=1 runs each row in its own test instead)."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from typing import cast

import pytest

from kqpsim import table
from kqpsim.pool import Background, table_rows
from kqpsim.scenario import KIB, Clients, Quota, Scenario, parse_scenario, simulate
from kqpsim.table import ROWS, Band, Finding, Row, Sample, Violation, figures, sample, unexplained


@pytest.fixture(scope="module")
def row_runs(request: pytest.FixtureRequest) -> Iterator[Background[Row, list[Sample]]]:
    # Every row this session will test (after -k), started at once, in the order they are tested.
    selected = [cast(Row, item.callspec.params["row"]) for item in request.session.items
                if isinstance(item, pytest.Function) and item.originalname == "test_scenario_row"]
    runs = table_rows(selected)
    yield runs
    runs.close()


@pytest.mark.parametrize("row", [pytest.param(row, id=f"{row.scenario.name}{'-finding' if row.finding else ''}")
                                 for row in ROWS])
def test_scenario_row(row: Row, row_runs: Background[Row, list[Sample]]) -> None:
    samples = row_runs.get(row)
    problems = unexplained(row, samples)
    finding = [f"  known finding: {row.finding.text}"] if row.finding is not None else []
    assert not problems, "\n".join([row.scenario.name, *(f"  {s.describe()}" for s in samples), *finding,
                                    f"  replay: {row.scenario.replay_command(0)}", *problems])


def test_every_finding_has_a_band_for_each_figure() -> None:
    for row in ROWS:
        if row.finding is None:
            continue
        assert row.finding.bands, row.scenario.name
        for band in row.finding.bands:
            assert band.kqp[0] <= band.kqp[1] and band.kafka[0] <= band.kafka[1], (row.scenario.name, band)


def test_every_rows_replay_command_names_its_scenario_exactly() -> None:
    for row in ROWS:
        argument = shlex.split(row.scenario.replay_command(3))[4]
        assert parse_scenario(argument) == row.scenario


def _sample(seed: int, kqp: float, kafka: float, kqp_timeouts: int = 0, kafka_timeouts: int = 0) -> Sample:
    return Sample(seed, 1.0, (kqp,), (kafka,), 1.0, 1.0, kqp_timeouts, kafka_timeouts, 0.0, 0.0)


def test_figures_are_compared_by_rank_not_by_seed() -> None:
    # Seed 0 through kqp lands in the high phase and seed 1 against Kafka does, the other way
    # round on the other seed: seed by seed kqp's 1.14x would be held to Kafka's 1.07x (the
    # finding of a fixed broker); by rank each distribution's highest meets the other's.
    scenario = Scenario(Clients("librdkafka", 1, request_bytes=192 * KIB), Quota(64 * KIB))
    assert scenario.tolerance < 0.14 - 0.07
    phases = [_sample(0, 1.14, 1.07), _sample(1, 1.07, 1.14)]
    assert table.violations(scenario, phases) == []
    # kqp in the high phase on both seeds, Kafka on one: kqp's lowest is over Kafka's lowest.
    (over,) = table.violations(scenario, [_sample(0, 1.14, 1.14), _sample(1, 1.14, 1.07)])
    assert over.kind == "over" and over.text.startswith("the lowest of 2 seeds")
    # Time-outs by rank: kqp's 0 and 2 against Kafka's 1 and 1 is one too many at the top.
    (timeouts,) = table.violations(scenario, [_sample(0, 1.1, 1.1, 0, 1), _sample(1, 1.1, 1.1, 2, 1)])
    assert timeouts.kind == "timeouts" and timeouts.text.startswith("the highest of 2 seeds (kqp's seed 1")


def test_a_finding_fails_on_another_violation_a_figure_out_of_band_or_no_violation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Any scenario-seeds will do (this one is cheap); the violations are planted, so the test
    # does not hang on what kqp does in it today.
    scenario = Scenario(Clients("librdkafka", 1, request_bytes=192 * KIB), Quota(64 * KIB))
    samples = [sample(simulate(scenario, seed)) for seed in (0, 1)]
    kqp = [figures("over", s)[0] for s in samples]
    kafka = [figures("over", s)[1] for s in samples]
    measured = Band("over", kqp=(min(kqp), max(kqp)), kafka=(min(kafka), max(kafka)))
    row = Row(scenario, 2, Finding("planted", (measured,)))
    over = Violation("over", "client-0 admitted too much")

    def planted(*found: Violation) -> None:
        monkeypatch.setattr(table, "violations", lambda _scenario, _samples: list(found))

    planted(over)
    assert unexplained(row, samples) == []
    assert unexplained(Row(scenario, 2), samples) == ["client-0 admitted too much"]  # a row without the finding
    planted(over, Violation("timeouts", "2 request time-outs"))
    assert unexplained(row, samples) == ["not the finding's kind: 2 request time-outs"]
    planted()
    assert [p.split(":")[0] for p in unexplained(row, samples)] == ["the finding no longer shows"]
    planted(over)
    narrow = Band("over", kqp=(min(kqp) + 0.001, max(kqp)), kafka=(min(kafka), max(kafka)))
    (problem,) = unexplained(Row(scenario, 2, Finding("planted", (narrow,))), samples)
    assert problem.startswith("out of the finding's band: over: kqp")
