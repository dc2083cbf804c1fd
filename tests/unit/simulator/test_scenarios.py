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


def test_make_test_runs_at_least_400_scenario_seeds() -> None:
    # Issue 39, acceptance 1: at least 400 scenario-seeds in make test (and in under 2 minutes:
    # docs/testing.md, "What it costs").
    assert sum(row.seeds for row in ROWS) >= 400


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


def test_time_outs_are_compared_as_counts_with_their_sampling_error() -> None:
    scenario = Scenario(Clients("librdkafka", 1, request_bytes=192 * KIB), Quota(64 * KIB))

    def timeouts(kqp: list[int], kafka: list[int]) -> list[Violation]:
        return table.violations(scenario, [_sample(seed, 1.1, 1.1, k, f)
                                           for seed, (k, f) in enumerate(zip(kqp, kafka, strict=True))])

    # Where Kafka's model times out too: kqp's 0 and 2 against its 1 and 1 is as many in all
    # (by rank it was one too many at the top); row (e) at 48 seeds crossed so at 3 ranks.
    assert timeouts([0, 2], [1, 1]) == []
    # Three on every one of 12 seeds against one: a chance of 4e-7 that it is the same distribution.
    (many,) = timeouts([3] * 12, [1] * 12)
    assert many.kind == "timeouts" and many.text.startswith("36 request time-outs through kqp over 12 seeds, 12")
    # Where Kafka's model has none, a single one through kqp is a violation, whatever its chance.
    (one,) = timeouts([0, 0, 1], [0, 0, 0])
    assert one.text.startswith("1 request time-outs through kqp over 3 seeds (seed: count 2: 1), none against Kafka")


def test_the_chance_of_as_many_time_outs_is_the_exact_permutation_test() -> None:
    # Every way to deal {0, 2, 1, 1} into two pairs: 4 of 6 give the first pair 2 or more.
    assert table.excess_chance([0, 2], [1, 1]) == pytest.approx(4 / 6)
    assert table.excess_chance([1], [0]) == 0.5
    assert table.excess_chance([0, 0], [1, 1]) == 1.0
    # Seeds are dealt whole: one seed's chain of 3 goes with its seed (35 of the 70 deals), where
    # three independent time-outs would each go their own way; the three 1s together give 4 more.
    assert table.excess_chance([3, 0, 0, 0], [1, 1, 1, 0]) == pytest.approx(39 / 70)
    # Row (c) over seeds 0-399 as docs/quotas.md counts it: 36 seeds with a time-out each side,
    # 46 in all through kqp (2 on 6 seeds, 3 on 2), 37 against Kafka's model (2 on one seed).
    kqp = [1] * 28 + [2] * 6 + [3] * 2 + [0] * 364
    kafka = [1] * 35 + [2] + [0] * 364
    assert 0.2 < table.excess_chance(kqp, kafka) < 0.22


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
