from __future__ import annotations

import io
from pathlib import Path

import pytest

from kqp.capture.inspect import inspect_command, summarize_capture
from kqp.capture.writer import CaptureWriter
from kqp.cli import main
from kqp.config.models import CaptureSection
from tests.unit.helpers.capture_records import HOUR_US, TEN_O_CLOCK_US, fetch_record, produce_record


def write_capture(directory: Path) -> None:
    """Two proxies' worth of files: 40 Produce + 10 Fetch written, 5 dropped, two hours."""
    writer = CaptureWriter(CaptureSection(directory=str(directory), queue_capacity=45, proxy_id="p1", sample_one_in=2),
                           flush_interval_s=0.0)
    for i in range(30):
        writer.submit(produce_record(i, ts_us=TEN_O_CLOCK_US + i * 1_000, client_id=f"producer-{i % 3}"))
    for i in range(10):
        writer.submit(fetch_record(100 + i, ts_us=TEN_O_CLOCK_US + HOUR_US + i))
    for i in range(10):  # 5 fit, 5 are dropped
        writer.submit(produce_record(200 + i, ts_us=TEN_O_CLOCK_US + HOUR_US + 100 + i, principal="User:carol"))
    writer.start()
    assert writer.stop(10)


def test_summary_counts_coverage_span_apis_clients_and_bytes(tmp_path: Path) -> None:
    write_capture(tmp_path)
    summary = summarize_capture(tmp_path)

    assert summary.files == 2
    assert summary.in_progress_files == 0
    assert summary.proxy_ids == {"p1"}
    assert summary.sampling_one_in == {2}
    assert (summary.records_written, summary.records_dropped, summary.rows) == (45, 5, 45)
    assert summary.coverage == pytest.approx(0.9)
    assert summary.requests_per_api == {"Produce": 35, "Fetch": 10}
    assert summary.client_ids == {"producer-0", "producer-1", "producer-2", "consumer-1"}
    assert summary.principals == {"User:alice", "User:bob", "User:carol"}
    assert summary.first_request_us == TEN_O_CLOCK_US
    # The last record's response was sent 2,040 us after its request arrived.
    assert summary.last_response_us == TEN_O_CLOCK_US + HOUR_US + 104 + 2_040
    assert summary.request_bytes == 35 * 1_120 + 10 * 90
    assert summary.response_bytes == 35 * 60 + 10 * 5_000
    assert summary.produced_records == 35 * 10
    assert summary.produced_batch_bytes == 35 * 1_000
    assert summary.fetched_records == 10 * 49
    assert summary.bytes_per_client["consumer-1"] == 10 * 5_090


def test_inspect_prints_a_readable_report(tmp_path: Path) -> None:
    write_capture(tmp_path)
    out = io.StringIO()
    assert inspect_command(str(tmp_path), out) == 0
    text = out.getvalue()
    assert "2 closed, 0 in progress, 0 unreadable; proxies p1" in text
    assert "45 records written, 5 dropped (90.00% of submitted)" in text
    assert "1 in 2 connections (counts below cover the sampled connections only)" in text
    assert "2024-05-01T10:00:00.000Z .. 2024-05-01T11:00:00.002Z" in text
    assert "4 client-ids, 3 principals" in text
    assert "Produce" in text and "Fetch" in text


def test_in_progress_and_unreadable_files_are_reported(tmp_path: Path) -> None:
    write_capture(tmp_path)
    partition = next(tmp_path.glob("date=*/hour=10"))
    (partition / ".p1-000009.parquet.inprogress").write_bytes(b"PAR1 no footer yet")
    (partition / "broken.parquet").write_bytes(b"not parquet at all")
    out = io.StringIO()
    assert inspect_command(str(tmp_path), out) == 1
    assert "2 closed, 1 in progress, 1 unreadable" in out.getvalue()
    assert "broken.parquet" in out.getvalue()


def test_an_empty_or_missing_directory_is_an_error(tmp_path: Path) -> None:
    assert inspect_command(str(tmp_path), io.StringIO()) == 1
    assert inspect_command(str(tmp_path / "missing"), io.StringIO()) == 1


def test_cli_runs_capture_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_capture(tmp_path)
    assert main(["capture", "inspect", str(tmp_path)]) == 0
    assert "45 records written" in capsys.readouterr().out
