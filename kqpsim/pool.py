"""The simulator's scenario-seeds run in worker processes, at the lowest priority on the host.

A scenario-seed is pure CPU on virtual time: the same seed gives the same numbers in any process
(the cross-process digest test holds it), so it can run anywhere and only its figures come back.
`make test` runs the scenario table's 400 scenario-seeds and the guard's rows in two workers
beside the real-time tests (tests/run_suite.sh): at nice 19, so that a test measuring rates on
the wall clock gets the CPU it asks for first and the simulator only the rest. Before, the same
work ran in the unit tests' own process at full priority, a core's worth competing with the
real-time tests.

Everything asked for is submitted at once, in the order given (the order the tests will read
it), so each test waits only for its own part. Rows of the table whose Kafka runs are the same
(`scenario.kafka_sees`: they differ only in what acts on kqp alone) go to one worker together,
in table order, so that its cache of Kafka's runs shares them as a single process does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Generic, TypeVar

from kqpsim import guard_rows
from kqpsim.scenario import kafka_sees, simulate
from kqpsim.table import Row, Sample, sample

# How many worker processes: KQP_SIM_PROCESSES, or by default two (one on a host that gives this
# process a single CPU). 1: everything runs in the caller's process, when asked for, at its priority.
PROCESSES_VARIABLE = "KQP_SIM_PROCESSES"
WORKER_NICENESS = 19

Key = TypeVar("Key")
Value = TypeVar("Value")


def default_processes() -> int:
    configured = os.environ.get(PROCESSES_VARIABLE, "")
    if configured:
        return max(1, int(configured))
    return min(2, len(os.sched_getaffinity(0)))


def _lowest_priority() -> None:
    os.nice(WORKER_NICENESS)


class Background(Generic[Key, Value]):
    """`work(task)` for each task (a list of keys; it returns one value per key), run by worker
    processes from the moment this is made; `get(key)` waits for that key's value. With one
    process nothing runs ahead: `get` computes its key in this process."""

    def __init__(self, work: Callable[[Sequence[Key]], list[Value]], tasks: Sequence[Sequence[Key]],
                 name: Callable[[Key], Hashable], processes: int | None = None) -> None:
        self._work = work
        self._name = name
        self.processes = default_processes() if processes is None else processes
        self._executor: ProcessPoolExecutor | None = None
        self._futures: dict[Hashable, tuple[Future[list[Value]], int]] = {}
        if self.processes > 1 and tasks:
            self._executor = ProcessPoolExecutor(self.processes, initializer=_lowest_priority)
            for task in tasks:
                future = self._executor.submit(work, task)
                for index, key in enumerate(task):
                    self._futures[name(key)] = (future, index)

    def get(self, key: Key) -> Value:
        submitted = self._futures.get(self._name(key))
        if submitted is None:
            return self._work([key])[0]
        future, index = submitted
        return future.result()[index]

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(cancel_futures=True)
            self._executor = None


def row_samples(rows: Sequence[Row]) -> list[list[Sample]]:
    """What `make test` reads of each row: each of its seeds' figures."""
    return [[sample(simulate(row.scenario, seed)) for seed in range(row.seeds)] for row in rows]


def table_rows(rows: Sequence[Row], processes: int | None = None) -> Background[Row, list[Sample]]:
    """The scenario table's rows, consecutive rows that share Kafka's runs in one task."""
    tasks: list[list[Row]] = []
    for row in rows:
        if tasks and kafka_sees(tasks[-1][-1].scenario) == kafka_sees(row.scenario):
            tasks[-1].append(row)
        else:
            tasks.append([row])
    return Background(row_samples, tasks, lambda row: row, processes)


GuardCase = tuple[guard_rows.GuardRow, int]


def guard_outcomes(cases: Sequence[GuardCase]) -> list[guard_rows.Outcome]:
    return [guard_rows.simulate(row, seed) for row, seed in cases]


def guard_cases(cases: Sequence[GuardCase], processes: int | None = None) -> Background[GuardCase, guard_rows.Outcome]:
    """The guard's rows (kqpsim/guard_rows.py), one scenario-seed a task."""
    return Background(guard_outcomes, [[case] for case in cases], lambda case: (case[0].name, case[1]), processes)
