"""`kqp capture inspect DIR`: what a capture holds and how complete it is.

Coverage comes from the footers (records written and dropped per file, the sampling rate),
the rest from a column scan: only the few columns needed are read, batch by batch, so a
large capture is summarised in bounded memory (apart from the sets of distinct clients).

Two counts of the same records are compared on purpose: the footers say what the writer
meant to write (and dropped), the scan what is really readable. They differ when a file
was cut short or hand-edited, and the summary says so rather than trusting either.
"""

from __future__ import annotations

import collections
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kqp.capture.schema import (
    META_PROXY_ID,
    META_RECORDS_DROPPED,
    META_RECORDS_INVALID,
    META_RECORDS_WRITTEN,
    META_SAMPLING,
)
from kqp.capture.writer import FINAL_SUFFIX, IN_PROGRESS_SUFFIX
from kqp.protocol.api_keys import ApiKey

_SCAN_COLUMNS = [
    "ts_request_received_us",
    "ts_response_sent_us",
    "api_key",
    "client_id",
    "principal",
    "request_bytes",
    "response_bytes",
    "partitions",
]
_TOP_CLIENTS = 10


@dataclass
class CaptureSummary:
    """What `inspect` reports. Sets, not single values, for proxy ids and sampling rates:
    one directory may hold the captures of several proxies (a fleet, or --workers), or of
    one proxy reconfigured, and the reader must see that."""

    directory: str
    files: int = 0
    in_progress_files: int = 0
    unreadable_files: list[str] = field(default_factory=list)
    proxy_ids: set[str] = field(default_factory=set)
    sampling_one_in: set[int] = field(default_factory=set)
    records_written: int = 0  # from the footers
    records_dropped: int = 0
    records_invalid: int = 0  # refused by the writer as malformed: a proxy bug, not load
    rows: int = 0  # rows actually read
    first_request_us: int | None = None
    last_response_us: int | None = None
    requests_per_api: dict[str, int] = field(default_factory=dict)
    client_ids: set[str] = field(default_factory=set)
    principals: set[str] = field(default_factory=set)
    request_bytes: int = 0
    response_bytes: int = 0
    bytes_per_client: dict[str, int] = field(default_factory=dict)
    # From the RecordBatch headers of each partition: records, not requests, are what a
    # producer's throughput is measured in.
    produced_records: int = 0
    produced_batch_bytes: int = 0
    fetched_records: int = 0
    fetched_batch_bytes: int = 0

    @property
    def coverage(self) -> float | None:
        """Share of submitted records that were written (None for an empty capture)."""
        submitted = self.records_written + self.records_dropped
        return self.records_written / submitted if submitted else None


def summarize_capture(directory: str | Path) -> CaptureSummary:
    """Read a capture directory's footers and columns into a CaptureSummary."""
    # Imported here: kqp.protocol.apis loads the bundled message definitions, which
    # `kqp capture` does not otherwise need to start.
    from kqp.protocol.apis import api_name

    root = Path(directory)
    summary = CaptureSummary(directory=str(root))
    # In-progress files are counted, not read: the writer is still appending to them and
    # their footer does not exist yet.
    summary.in_progress_files = sum(1 for _ in root.rglob(f"*{IN_PROGRESS_SUFFIX}"))
    per_api: collections.Counter[int] = collections.Counter()
    per_client: collections.Counter[str] = collections.Counter()
    for path in sorted(root.rglob(f"*{FINAL_SUFFIX}")):
        if path.name.startswith("."):
            continue  # hidden files: editors' and sync tools' temporaries
        try:
            parquet = pq.ParquetFile(path)
        except (OSError, pa.ArrowException):
            summary.unreadable_files.append(str(path))
            continue
        summary.files += 1
        _read_footer(parquet, summary)
        # Older schema versions may lack a column; read what the file has.
        columns = [name for name in _SCAN_COLUMNS if name in parquet.schema_arrow.names]
        for batch in parquet.iter_batches(columns=columns):
            _scan_batch(pa.Table.from_batches([batch]), summary, per_api, per_client)
    summary.requests_per_api = {api_name(key): count for key, count in per_api.most_common()}
    summary.bytes_per_client = dict(per_client.most_common())
    return summary


def _read_footer(parquet: pq.ParquetFile, summary: CaptureSummary) -> None:
    # A file without the writer's footer keys (written by another tool) counts its rows as
    # written and nothing as dropped.
    metadata = parquet.metadata.metadata or {}
    summary.records_written += int(metadata.get(META_RECORDS_WRITTEN, parquet.metadata.num_rows))
    summary.records_dropped += int(metadata.get(META_RECORDS_DROPPED, 0))
    summary.records_invalid += int(metadata.get(META_RECORDS_INVALID, 0))
    if META_SAMPLING in metadata:
        summary.sampling_one_in.add(int(metadata[META_SAMPLING]))
    if META_PROXY_ID in metadata:
        summary.proxy_ids.add(metadata[META_PROXY_ID].decode())


def _scan_batch(
    table: pa.Table,
    summary: CaptureSummary,
    per_api: collections.Counter[int],
    per_client: collections.Counter[str],
) -> None:
    if table.num_rows == 0:
        return
    summary.rows += table.num_rows
    first = pc.min(table["ts_request_received_us"]).as_py()
    # acks=0 Produce has no response: its request time ends the span instead.
    ends = pc.coalesce(table["ts_response_sent_us"], table["ts_request_received_us"])
    last = pc.max(ends).as_py()
    if first is not None and (summary.first_request_us is None or first < summary.first_request_us):
        summary.first_request_us = first
    if last is not None and (summary.last_response_us is None or last > summary.last_response_us):
        summary.last_response_us = last
    for entry in pc.value_counts(table["api_key"]).to_pylist():
        per_api[entry["values"]] += entry["counts"]
    request_bytes = pc.fill_null(table["request_bytes"], 0)
    response_bytes = pc.fill_null(table["response_bytes"], 0)
    summary.request_bytes += pc.sum(request_bytes).as_py() or 0
    summary.response_bytes += pc.sum(response_bytes).as_py() or 0
    summary.client_ids.update(v for v in pc.unique(table["client_id"]).to_pylist() if v is not None)
    summary.principals.update(v for v in pc.unique(table["principal"]).to_pylist() if v is not None)
    per_row_bytes = pc.add(request_bytes, response_bytes)
    grouped = (
        pa.table({"client_id": pc.fill_null(table["client_id"], ""), "bytes": per_row_bytes})
        .group_by("client_id")
        .aggregate([("bytes", "sum")])
    )
    for client_id, total in zip(grouped["client_id"].to_pylist(), grouped["bytes_sum"].to_pylist(), strict=True):
        per_client[client_id] += total
    if "partitions" in table.column_names:
        for api_key in (ApiKey.PRODUCE, ApiKey.FETCH):
            selected = table.filter(pc.equal(table["api_key"], api_key))["partitions"]
            flat = pc.list_flatten(selected)
            if len(flat) == 0:
                continue
            records = pc.sum(pc.struct_field(flat, "records")).as_py() or 0
            batch_bytes = pc.sum(pc.struct_field(flat, "bytes")).as_py() or 0
            if api_key == ApiKey.PRODUCE:
                summary.produced_records += records
                summary.produced_batch_bytes += batch_bytes
            else:
                summary.fetched_records += records
                summary.fetched_batch_bytes += batch_bytes


def format_summary(summary: CaptureSummary) -> str:
    """The summary as aligned text for a terminal (the layout is for people, not parsers)."""
    lines = [f"capture {summary.directory}"]
    lines.append(
        f"  files        {summary.files} closed, {summary.in_progress_files} in progress, "
        f"{len(summary.unreadable_files)} unreadable"
        + (f"; proxies {', '.join(sorted(summary.proxy_ids))}" if summary.proxy_ids else "")
    )
    for path in summary.unreadable_files:
        lines.append(f"    unreadable: {path}")
    coverage = summary.coverage
    coverage_text = "n/a" if coverage is None else f"{coverage:.2%}"
    lines.append(
        f"  coverage     {summary.records_written:,} records written, {summary.records_dropped:,} dropped "
        f"({coverage_text} of submitted), {summary.records_invalid:,} invalid"
    )
    if summary.sampling_one_in:
        rates = ", ".join(f"1 in {n}" for n in sorted(summary.sampling_one_in))
        note = "" if summary.sampling_one_in == {1} else " (counts below cover the sampled connections only)"
        lines.append(f"  sampling     {rates} connections{note}")
    if summary.rows != summary.records_written:
        lines.append(
            f"  warning      footers say {summary.records_written:,} records but {summary.rows:,} rows were read"
        )
    if summary.first_request_us is not None and summary.last_response_us is not None:
        start, end = _iso(summary.first_request_us), _iso(summary.last_response_us)
        seconds = (summary.last_response_us - summary.first_request_us) / 1_000_000
        lines.append(f"  time span    {start} .. {end} ({seconds:,.1f} s)")
    lines.append(f"  bytes        {summary.request_bytes:,} in (requests), {summary.response_bytes:,} out (responses)")
    if summary.produced_records or summary.fetched_records:
        lines.append(
            f"  records      {summary.produced_records:,} produced in {summary.produced_batch_bytes:,} batch bytes, "
            f"{summary.fetched_records:,} fetched in {summary.fetched_batch_bytes:,} batch bytes"
        )
    lines.append(f"  clients      {len(summary.client_ids):,} client-ids, {len(summary.principals):,} principals")
    if summary.requests_per_api:
        lines.append(f"  requests     {summary.rows:,}")
        width = max(len(name) for name in summary.requests_per_api)
        for name, count in summary.requests_per_api.items():
            lines.append(f"    {name:<{width}}  {count:>12,}")
    if summary.bytes_per_client:
        lines.append(f"  top client-ids by bytes (of {len(summary.bytes_per_client):,})")
        for client_id, total in list(summary.bytes_per_client.items())[:_TOP_CLIENTS]:
            lines.append(f"    {client_id or '(none)':<30}  {total:>15,}")
    return "\n".join(lines)


def _iso(us: int) -> str:
    return datetime.fromtimestamp(us / 1_000_000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def inspect_command(directory: str, out: TextIO | None = None) -> int:
    """Print a capture's summary; 1 when there is nothing to inspect or files are unreadable."""
    stream = out if out is not None else sys.stdout
    root = Path(directory)
    if not root.is_dir():
        print(f"kqp capture inspect: {directory} is not a directory", file=sys.stderr)
        return 1
    summary = summarize_capture(root)
    print(format_summary(summary), file=stream)
    if summary.files == 0:
        print(f"kqp capture inspect: no capture files under {directory}", file=sys.stderr)
        return 1
    return 1 if summary.unreadable_files else 0
