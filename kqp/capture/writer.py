"""Writes capture records to rotating Parquet files without ever blocking the data path.

Strategy: the proxy calls `submit()` on the event loop. It only appends to a bounded
deque (or counts a drop when full), so the data path pays well under a microsecond per
record and never waits for the disk. One writer thread drains the deque, converts batches
to Arrow with the capture schema and writes them as row groups.

Files live under Hive-style partitions, `DIR/date=YYYY-MM-DD/hour=HH/<proxy_id>-<seq>.parquet`,
chosen from each record's `ts_request_received_us` (UTC) so Spark can prune by time. A file
being written is hidden as `.<name>.parquet.inprogress`: Spark and pyarrow.dataset skip names
that start with a dot, so a reader never sees a file without its footer. Closing writes the
footer, fsyncs and renames atomically.

SASL frames are never captured: the proxy does not submit SaslHandshake/SaslAuthenticate
pairs, and nothing here could redact credentials if it did. Record payloads are not captured
either; records carry sizes and counts only.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

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
    REQUIRED_FIELDS,
    SCHEMA_VERSION,
)
from kqp.config.models import CaptureSection

log = logging.getLogger(__name__)

Record = dict[str, Any]

FINAL_SUFFIX = ".parquet"
IN_PROGRESS_SUFFIX = ".parquet.inprogress"
_US_PER_HOUR = 3_600_000_000
# Fibonacci hashing constant (2**64 / golden ratio): spreads sequential connection ids so
# 1-in-N sampling does not line up with patterns in how clients open connections (a client
# that opens a bootstrap connection and then one per broker would otherwise be sampled on
# the same kind of connection every time).
_GOLDEN_64 = 0x9E3779B97F4A7C15
_MASK_64 = (1 << 64) - 1

# Parquet favours row groups of many thousand rows (fewer footers entries, better encoding);
# the flush interval bounds how much a crash can lose when traffic is light.
DEFAULT_ROW_GROUP_RECORDS = 20_000
DEFAULT_FLUSH_INTERVAL_S = 5.0
DEFAULT_POLL_INTERVAL_S = 0.05


@dataclass(frozen=True, slots=True)
class CaptureCounters:
    """A snapshot of the writer's counters since it was created."""

    records_submitted: int
    records_written: int
    records_dropped: int
    records_invalid: int
    files_closed: int


@dataclass(slots=True)
class _OpenFile:
    final_path: Path
    temp_path: Path
    sink: pa.NativeFile
    writer: pq.ParquetWriter
    opened_at: float
    records: int = 0


class CaptureWriter:
    """A bounded queue plus one thread that writes capture records to rotating Parquet files.

    Args:
        directory: root of the capture; partitions are created below it.
        rotate_bytes: close a file once it has grown to at least this size.
        rotate_seconds: close a file once it has been open this long (writer clock).
        queue_capacity: records waiting for the writer thread; more are dropped and counted.
        sample_one_in: capture 1 in N connections (1 = all); see `sampled`.
        proxy_id: names the files, so several proxies can share one capture directory.
        clock: wall clock in seconds, injected by tests.
        on_written / on_dropped / on_file_closed: counters to feed (e.g. ProxyMetrics);
            on_written and on_file_closed run on the writer thread, on_dropped on the caller's.
    """

    def __init__(
        self,
        settings: CaptureSection,
        clock: Callable[[], float] = time.time,
        *,
        row_group_records: int = DEFAULT_ROW_GROUP_RECORDS,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        on_written: Callable[[int], None] | None = None,
        on_dropped: Callable[[int], None] | None = None,
        on_file_closed: Callable[[int], None] | None = None,
    ) -> None:
        # The settings are the `capture` section's, validated there (its `enabled` is the caller's).
        if row_group_records <= 0:
            raise ValueError("row_group_records must be positive")
        self.directory = Path(settings.directory)
        self.rotate_bytes = settings.rotate_bytes
        self.rotate_seconds = settings.rotate_seconds
        self.queue_capacity = settings.queue_capacity
        self.sample_one_in = settings.sample_one_in
        self.proxy_id = settings.proxy_id
        self._clock = clock
        self._row_group_records = row_group_records
        self._flush_interval_s = flush_interval_s
        self._poll_interval_s = poll_interval_s
        self._on_written = on_written
        self._on_dropped = on_dropped
        self._on_file_closed = on_file_closed

        # deque.append/popleft are atomic in CPython, so the caller and the writer thread
        # share it without a lock; the capacity check is exact with one submitting thread.
        self._queue: collections.deque[Record] = collections.deque()
        self._accepting = True
        self._stop_requested = threading.Event()
        self._thread: threading.Thread | None = None

        self._submitted = 0
        self._dropped = 0  # queue full or stopped; written by the submitting thread only
        self._lost = 0  # disk errors; written by the writer thread only
        self._written = 0
        self._invalid = 0
        self._files_closed = 0
        self._dropped_in_footers = 0
        self._invalid_in_footers = 0

        # Writer-thread state: records taken from the queue but not yet written (one row
        # group's worth at most), the hour partition being filled, and the open file.
        self._pending: list[Record] = []
        self._pending_since = 0.0
        self._hour: int | None = None  # partition (hours since the epoch) being filled
        self._file: _OpenFile | None = None
        self._next_seq = 0

    # ---- caller side (event loop) -------------------------------------------------------

    def sampled(self, connection_id: int) -> bool:
        """Whether records of this connection are captured: deterministic 1 in `sample_one_in`."""
        if self.sample_one_in == 1:
            return True
        # Per connection, not per record: a sampled client's whole conversation is kept, so
        # replays see its real request sequence; the hash keeps the choice stable across
        # calls without storing it.
        spread = ((connection_id * _GOLDEN_64) & _MASK_64) >> 32
        return spread % self.sample_one_in == 0

    def submit(self, record: Record) -> bool:
        """Queue one record for writing; never blocks. False when it was dropped (queue full or stopped)."""
        # Drop rather than wait: a slow disk must cost capture completeness (counted, and
        # written into the next footer), never latency on the data path.
        if not self._accepting or len(self._queue) >= self.queue_capacity:
            self._dropped += 1
            if self._on_dropped is not None:
                self._on_dropped(1)
            return False
        self._submitted += 1
        self._queue.append(record)
        return True

    def counters(self) -> CaptureCounters:
        return CaptureCounters(
            records_submitted=self._submitted,
            records_written=self._written,
            records_dropped=self._dropped + self._lost,
            records_invalid=self._invalid,
            files_closed=self._files_closed,
        )

    @property
    def records_written(self) -> int:
        return self._written

    @property
    def records_dropped(self) -> int:
        return self._dropped + self._lost

    @property
    def files_closed(self) -> int:
        return self._files_closed

    @property
    def queued(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("capture writer already started")
        self.directory.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="kqp-capture-writer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 30.0) -> bool:
        """Stop accepting records, write what is queued, close the open file.

        Returns False if the writer thread did not finish within `timeout` seconds (it keeps
        going in the background; its file stays `.inprogress` until it does).
        """
        self._accepting = False
        self._stop_requested.set()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ---- writer thread --------------------------------------------------------------------

    def _run(self) -> None:
        """The writer thread: drain the queue into row groups, flush by size or age, rotate
        files by age, and on stop write everything queued before closing.

        It polls (`poll_interval_s`) instead of being woken per record: a condition variable
        notified from `submit` would cost the data path a lock per record."""
        try:
            while True:
                stopping = self._stop_requested.is_set()
                took = self._take_from_queue()
                now = self._clock()
                if self._pending and (
                    stopping
                    or len(self._pending) >= self._row_group_records
                    or now - self._pending_since >= self._flush_interval_s
                ):
                    self._write_pending(now)
                if self._file is not None and now - self._file.opened_at >= self.rotate_seconds:
                    self._write_pending(now)
                    self._close_file(now)
                if stopping and not self._queue and not self._pending:
                    break
                if not took:
                    self._stop_requested.wait(self._poll_interval_s)
        except Exception:
            # A bug here must not take the proxy down: capture stops (and says so), traffic
            # keeps flowing, and later submits count as drops.
            log.exception("capture writer failed; capture stops here")
            self._accepting = False
        finally:
            if self._file is not None:
                self._close_file(self._clock())

    def _take_from_queue(self) -> int:
        queue = self._queue
        took = 0
        while queue and len(self._pending) < self._row_group_records:
            record = queue.popleft()
            took += 1
            # Checked here, off the data path: a record missing a required field is a proxy
            # bug, counted apart from load-shedding drops.
            if any(record.get(name) is None for name in REQUIRED_FIELDS):
                self._invalid += 1
                continue
            hour = int(record["ts_request_received_us"]) // _US_PER_HOUR
            if self._hour is None:
                self._hour = hour
            elif hour > self._hour:
                # A later hour starts a new file in the new partition. Records from an
                # earlier hour (a slow response completing after the turn) stay in the
                # current file, so a partition holds its hour plus a few late records.
                self._write_pending(self._clock())
                if self._file is not None:
                    self._close_file(self._clock())
                self._hour = hour
            if not self._pending:
                self._pending_since = self._clock()
            self._pending.append(record)
        return took

    def _write_pending(self, now: float) -> None:
        if not self._pending:
            return
        records, self._pending = self._pending, []
        table = self._to_table(records)
        if table.num_rows == 0:
            return
        if self._file is None:
            self._file = self._open_file(now)
        try:
            # One row group per batch, as sized by row_group_records or the flush interval
            # (pyarrow would otherwise split it at its own default size).
            self._file.writer.write_table(table, row_group_size=table.num_rows)
        except OSError:
            log.exception("capture: writing %s failed; its records count as dropped", self._file.temp_path)
            self._abandon_file()
            self._lost += table.num_rows
            return
        self._file.records += table.num_rows
        self._written += table.num_rows
        if self._on_written is not None:
            self._on_written(table.num_rows)
        if self._file.sink.tell() >= self.rotate_bytes:
            self._close_file(now)

    def _to_table(self, records: list[Record]) -> pa.Table:
        for record in records:
            record["schema_version"] = SCHEMA_VERSION
            record.setdefault("sampling_one_in", self.sample_one_in)
        try:
            return pa.Table.from_pylist(records, schema=CAPTURE_SCHEMA)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            # One bad record must not cost the whole batch: convert one by one.
            good = []
            for record in records:
                try:
                    pa.Table.from_pylist([record], schema=CAPTURE_SCHEMA)
                except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                    self._invalid += 1
                    log.warning("capture: record does not fit schema v%d: %s", SCHEMA_VERSION, exc)
                else:
                    good.append(record)
            return pa.Table.from_pylist(good, schema=CAPTURE_SCHEMA)

    def _open_file(self, now: float) -> _OpenFile:
        # The partition is the hour of the records in it, not of the wall clock: a backlog
        # written after the hour turned still lands where Spark's time pruning looks for it.
        hour = self._hour if self._hour is not None else int(now * 1_000_000) // _US_PER_HOUR
        start = datetime.fromtimestamp(hour * 3600, tz=UTC)
        partition = self.directory / f"date={start:%Y-%m-%d}" / f"hour={start:%H}"
        partition.mkdir(parents=True, exist_ok=True)
        while True:
            name = f"{self.proxy_id}-{self._next_seq:06d}"
            self._next_seq += 1
            final_path = partition / f"{name}{FINAL_SUFFIX}"
            temp_path = partition / f".{name}{IN_PROGRESS_SUFFIX}"
            # A restarted proxy must not overwrite the files of its previous run.
            if not final_path.exists() and not temp_path.exists():
                break
        sink = pa.OSFile(str(temp_path), "wb")
        # zstd: capture columns (ids, sizes, repeated client ids) compress several-fold, and
        # zstd decodes fast enough that Spark jobs are not slowed by it.
        writer = pq.ParquetWriter(sink, CAPTURE_SCHEMA, compression="zstd")
        return _OpenFile(final_path=final_path, temp_path=temp_path, sink=sink, writer=writer, opened_at=now)

    def _close_file(self, now: float) -> None:
        current, self._file = self._file, None
        if current is None:
            return
        # Each footer carries the drops since the previous footer, so summing the footers of a
        # capture gives every drop once, whichever file was open when it happened.
        dropped = self._dropped + self._lost - self._dropped_in_footers
        invalid = self._invalid - self._invalid_in_footers
        metadata = {
            META_SCHEMA_VERSION: str(SCHEMA_VERSION),
            META_RECORDS_WRITTEN: str(current.records),
            META_RECORDS_DROPPED: str(dropped),
            META_RECORDS_INVALID: str(invalid),
            META_SAMPLING: str(self.sample_one_in),
            META_PROXY_ID: self.proxy_id,
            META_WINDOW_START_US: str(int(current.opened_at * 1_000_000)),
            META_WINDOW_END_US: str(int(now * 1_000_000)),
        }
        try:
            current.writer.add_key_value_metadata({k.decode(): v for k, v in metadata.items()})
            current.writer.close()
            current.sink.close()
            # fsync the data, rename, fsync the directory: after a crash the final name
            # exists only with its complete content (the rename itself is made durable).
            _fsync(current.temp_path)
            os.replace(current.temp_path, current.final_path)
            _fsync(current.final_path.parent)
        except OSError:
            log.exception("capture: closing %s failed", current.temp_path)
            return
        self._dropped_in_footers += dropped
        self._invalid_in_footers += invalid
        self._files_closed += 1
        if self._on_file_closed is not None:
            self._on_file_closed(1)

    def _abandon_file(self) -> None:
        current, self._file = self._file, None
        if current is None:
            return
        try:
            current.writer.close()
            current.sink.close()
        except OSError:
            pass
        current.temp_path.unlink(missing_ok=True)
        # Its rows never reach a readable file: they also count as dropped (and stay in
        # records_written, which counts rows handed to Parquet).
        self._lost += current.records


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
