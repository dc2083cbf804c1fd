from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kqp.capture.schema import (
    CAPTURE_SCHEMA,
    META_PROXY_ID,
    META_RECORDS_DROPPED,
    META_RECORDS_INVALID,
    META_RECORDS_WRITTEN,
    META_SAMPLING,
    META_SCHEMA_VERSION,
    META_WINDOW_END_US,
    META_WINDOW_START_US,
    SCHEMA_VERSION,
)
from kqp.capture.writer import CaptureWriter
from kqp.config.models import CaptureSection
from tests.unit.helpers.capture_records import HOUR_US, TEN_O_CLOCK_US, fetch_record, produce_record


class FakeClock:
    """Wall clock in seconds that moves only when told; safe to read from the writer thread."""

    def __init__(self, start: float = TEN_O_CLOCK_US / 1_000_000) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


def closed_files(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.parquet"))


def footer(path: Path) -> dict[bytes, bytes]:
    metadata = pq.read_metadata(path).metadata
    assert metadata is not None
    return dict(metadata)


def make_writer(tmp_path: Path, clock: FakeClock | None = None, **kwargs: object) -> CaptureWriter:
    settings = {"proxy_id": "p1", **{k: v for k, v in kwargs.items() if k in CaptureSection.model_fields}}
    options: dict[str, object] = {"flush_interval_s": 0.0, "poll_interval_s": 0.005}
    options.update({k: v for k, v in kwargs.items() if k not in CaptureSection.model_fields})
    return CaptureWriter(CaptureSection(directory=str(tmp_path), **settings),  # type: ignore[arg-type]
                         clock=clock or FakeClock(), **options)  # type: ignore[arg-type]


def test_records_read_back_with_the_capture_schema_in_an_hour_partition(tmp_path: Path) -> None:
    writer = make_writer(tmp_path)
    writer.start()
    assert writer.submit(produce_record(1))
    assert writer.submit(fetch_record(2))
    assert writer.stop(10)

    [path] = closed_files(tmp_path)
    assert path.relative_to(tmp_path).as_posix() == "date=2024-05-01/hour=10/p1-000000.parquet"
    table = pq.read_table(path)
    assert table.schema.equals(CAPTURE_SCHEMA, check_metadata=False)
    rows = table.to_pylist()
    assert [row["correlation_id"] for row in rows] == [1, 2]
    produce, fetch = rows
    assert produce["schema_version"] == SCHEMA_VERSION == 2
    assert produce["sampling_one_in"] == 1
    assert produce["acks"] == -1
    [partition] = produce["partitions"]
    assert partition == {
        "topic": "orders",
        "partition": 0,
        "bytes": 1000,
        "records": 10,
        "batches": 1,
        "compression": 4,
        "error_code": 0,
    }
    # Fields the proxy leaves out are null, not defaults that would look like data.
    assert fetch["acks"] is None
    assert fetch["listener"] is None
    assert fetch["mutations"] is None
    assert fetch["partitions"][0]["error_code"] is None
    assert fetch["group_id"] == "readers"


def test_footer_carries_version_counts_sampling_and_window(tmp_path: Path) -> None:
    clock = FakeClock()
    writer = make_writer(tmp_path, clock, sample_one_in=4)
    writer.start()
    writer.submit(produce_record(1))
    wait_until(lambda: writer.records_written == 1)
    clock.advance(12.5)
    assert writer.stop(10)

    [path] = closed_files(tmp_path)
    meta = footer(path)
    assert meta[META_SCHEMA_VERSION] == b"2"
    assert meta[META_RECORDS_WRITTEN] == b"1"
    assert meta[META_RECORDS_DROPPED] == b"0"
    assert meta[META_RECORDS_INVALID] == b"0"
    assert meta[META_SAMPLING] == b"4"
    assert meta[META_PROXY_ID] == b"p1"
    assert int(meta[META_WINDOW_END_US]) - int(meta[META_WINDOW_START_US]) == 12_500_000
    assert pq.read_table(path).column("sampling_one_in").to_pylist() == [4]


def test_rotation_by_size_closes_a_file_after_each_row_group_over_the_limit(tmp_path: Path) -> None:
    writer = make_writer(tmp_path, rotate_bytes=1, row_group_records=10)
    for correlation_id in range(50):
        writer.submit(produce_record(correlation_id))
    writer.start()
    assert writer.stop(10)

    paths = closed_files(tmp_path)
    assert [p.name for p in paths] == [f"p1-00000{i}.parquet" for i in range(5)]
    assert [pq.read_metadata(p).num_rows for p in paths] == [10] * 5
    assert [int(footer(p)[META_RECORDS_WRITTEN]) for p in paths] == [10] * 5
    assert writer.files_closed == 5
    ids = [i for p in paths for i in pq.read_table(p).column("correlation_id").to_pylist()]
    assert ids == list(range(50))


def test_rotation_by_size_keeps_files_below_the_limit_together(tmp_path: Path) -> None:
    writer = make_writer(tmp_path, rotate_bytes=10 * 1024 * 1024, row_group_records=10)
    for correlation_id in range(50):
        writer.submit(produce_record(correlation_id))
    writer.start()
    assert writer.stop(10)
    [path] = closed_files(tmp_path)
    assert pq.ParquetFile(path).num_row_groups == 5


def test_rotation_by_age_closes_an_idle_file(tmp_path: Path) -> None:
    clock = FakeClock()
    writer = make_writer(tmp_path, clock, rotate_seconds=60)
    writer.start()
    writer.submit(produce_record(1))
    wait_until(lambda: writer.records_written == 1)
    clock.advance(59)
    writer.submit(produce_record(2))
    wait_until(lambda: writer.records_written == 2)
    assert writer.files_closed == 0
    clock.advance(1)
    # No new record needed: the writer closes the file once it is old enough.
    wait_until(lambda: writer.files_closed == 1)
    writer.submit(produce_record(3))
    assert writer.stop(10)

    first, second = closed_files(tmp_path)
    assert pq.read_table(first).column("correlation_id").to_pylist() == [1, 2]
    assert pq.read_table(second).column("correlation_id").to_pylist() == [3]


def test_a_later_hour_starts_a_file_in_the_next_partition(tmp_path: Path) -> None:
    writer = make_writer(tmp_path)
    writer.submit(produce_record(1, ts_us=TEN_O_CLOCK_US + HOUR_US - 1))
    writer.submit(produce_record(2, ts_us=TEN_O_CLOCK_US + HOUR_US))
    # Late record from the earlier hour: stays in the current file rather than reopening one.
    writer.submit(produce_record(3, ts_us=TEN_O_CLOCK_US + HOUR_US - 5))
    writer.start()
    assert writer.stop(10)

    paths = closed_files(tmp_path)
    assert [p.parent.relative_to(tmp_path).as_posix() for p in paths] == [
        "date=2024-05-01/hour=10",
        "date=2024-05-01/hour=11",
    ]
    assert pq.read_table(paths[1]).column("correlation_id").to_pylist() == [2, 3]


def test_in_progress_file_is_hidden_and_renamed_atomically_on_stop(tmp_path: Path) -> None:
    writer = make_writer(tmp_path)
    writer.start()
    writer.submit(produce_record(1))
    wait_until(lambda: writer.records_written == 1)

    [in_progress] = list(tmp_path.rglob("*.inprogress"))
    assert in_progress.name == ".p1-000000.parquet.inprogress"
    assert closed_files(tmp_path) == []
    assert writer.stop(10)
    assert list(tmp_path.rglob("*.inprogress")) == []
    assert [p.name for p in closed_files(tmp_path)] == ["p1-000000.parquet"]


def test_queue_full_drops_are_counted_and_reported_in_the_next_footer(tmp_path: Path) -> None:
    dropped_callbacks: list[int] = []
    written_callbacks: list[int] = []
    writer = make_writer(
        tmp_path,
        queue_capacity=5,
        on_dropped=dropped_callbacks.append,
        on_written=written_callbacks.append,
    )
    # Not started yet: the queue fills and the rest is dropped without blocking.
    accepted = [writer.submit(produce_record(i)) for i in range(8)]
    assert accepted == [True] * 5 + [False] * 3
    assert writer.records_dropped == 3
    writer.start()
    assert writer.stop(10)

    [path] = closed_files(tmp_path)
    meta = footer(path)
    assert meta[META_RECORDS_WRITTEN] == b"5"
    assert meta[META_RECORDS_DROPPED] == b"3"
    assert sum(dropped_callbacks) == 3
    assert sum(written_callbacks) == 5
    counters = writer.counters()
    assert (counters.records_submitted, counters.records_written, counters.records_dropped) == (5, 5, 3)


def test_drops_are_reported_once_across_files(tmp_path: Path) -> None:
    writer = make_writer(tmp_path, queue_capacity=2, rotate_bytes=1, row_group_records=2)
    writer.submit(produce_record(1))
    writer.submit(produce_record(2))
    writer.submit(produce_record(3))  # dropped
    writer.start()
    wait_until(lambda: writer.files_closed == 1)
    writer.submit(produce_record(4))
    assert writer.stop(10)

    paths = closed_files(tmp_path)
    assert [footer(p)[META_RECORDS_DROPPED] for p in paths] == [b"1", b"0"]


def test_records_missing_required_fields_are_counted_invalid_not_written(tmp_path: Path) -> None:
    writer = make_writer(tmp_path)
    broken = produce_record(2)
    del broken["api_key"]
    too_wide = produce_record(3)
    too_wide["api_version"] = 1 << 20  # does not fit int16
    for record in (produce_record(1), broken, too_wide, produce_record(4)):
        writer.submit(record)
    writer.start()
    assert writer.stop(10)

    [path] = closed_files(tmp_path)
    assert pq.read_table(path).column("correlation_id").to_pylist() == [1, 4]
    assert footer(path)[META_RECORDS_INVALID] == b"2"
    assert writer.counters().records_invalid == 2


def test_submit_after_stop_is_refused(tmp_path: Path) -> None:
    writer = make_writer(tmp_path)
    writer.start()
    assert writer.stop(10)
    assert not writer.submit(produce_record(1))
    assert writer.records_dropped == 1
    assert closed_files(tmp_path) == []


def test_a_restarted_writer_does_not_overwrite_earlier_files(tmp_path: Path) -> None:
    for run in range(2):
        writer = make_writer(tmp_path)
        writer.submit(produce_record(run))
        writer.start()
        assert writer.stop(10)
    paths = closed_files(tmp_path)
    assert [p.name for p in paths] == ["p1-000000.parquet", "p1-000001.parquet"]
    assert [pq.read_table(p).column("correlation_id").to_pylist() for p in paths] == [[0], [1]]


def test_sampling_is_deterministic_and_close_to_one_in_n() -> None:
    writer = CaptureWriter(CaptureSection(directory="unused", sample_one_in=4))
    picks = [writer.sampled(connection_id) for connection_id in range(1, 40_001)]
    assert picks == [writer.sampled(connection_id) for connection_id in range(1, 40_001)]
    assert 9_000 < sum(picks) < 11_000
    # Alternating connection kinds (bootstrap, broker, bootstrap, ...) are both sampled.
    assert 4_000 < sum(picks[0::2]) < 6_000
    assert 4_000 < sum(picks[1::2]) < 6_000
    assert all(CaptureWriter(CaptureSection(directory="unused")).sampled(i) for i in range(100))


@pytest.mark.parametrize("proxy_id", ["", ".hidden", "a/b", "x y"])
def test_proxy_id_must_be_a_plain_file_name(proxy_id: str) -> None:
    with pytest.raises(ValueError, match="proxy_id"):
        CaptureSection(proxy_id=proxy_id)
