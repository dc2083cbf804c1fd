"""Produce and Fetch read straight off the wire, without decoding or copying record data.

The data path sees every Produce request and Fetch response, and the quota math only needs
their shape: which partitions, how many bytes, records and batches. Decoding them with the
full codec would copy every payload, so these parsers walk the bytes with struct and a
memoryview, skip the records fields by their length, and read only the RecordBatch headers
(kqp.protocol.records). Field layouts follow Kafka's ProduceRequest, FetchRequest and
FetchResponse JSON schemas, for every version from 0 on: names until Fetch v12 / Produce
v12, topic ids after; flexible versions (Produce v9+, Fetch v12+) use compact lengths and
tagged fields. Anything that does not parse raises ProtocolDecodeError.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kqp.protocol.apis import FETCH_KEY, FIELD_LOCATIONS
from kqp.protocol.errors import ProtocolDecodeError
from kqp.protocol.headers import read_uvarint, skip_tagged_fields
from kqp.protocol.records import EMPTY_RECORDS, RecordCounts, summarise_records
from kqp.protocol.wire import compact_count, compact_string, string
from kqp.protocol.wire import count as array_count

Buffer = bytes | bytearray | memoryview
S = TypeVar("S")

# The versions where the layouts change encoding: compact lengths and tagged fields (KIP-482),
# and topics named by id instead of name (KIP-516).
PRODUCE_FIRST_FLEXIBLE = 9
PRODUCE_FIRST_TOPIC_ID = 13
FETCH_FIRST_FLEXIBLE = 12
FETCH_FIRST_TOPIC_ID = 13

_INT8 = struct.Struct(">b")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_THREE_INT32 = struct.Struct(">iii")
_TWO_INT32 = struct.Struct(">ii")
_INT64 = struct.Struct(">q")
_PARTITION_HEAD = struct.Struct(">ihq")  # partition, error code, high watermark
_UUID_SIZE = 16
# The exceptions struct and memoryview raise on bytes that end too early.
_SHORT_READ = (struct.error, IndexError, ValueError)
# Fetch response version -> skipper to its top-level tagged fields (generated from the definitions).
_FETCH_TAG_SECTION = FIELD_LOCATIONS[FETCH_KEY]["TaggedFields"]


@dataclass(slots=True)
class PartitionSummary:
    """One topic-partition of a Produce request or Fetch response (not frozen: a frozen
    dataclass costs three times as much to build, and the data path builds one per partition).

    `topic` is None from the versions that name topics by `topic_id` (Produce v13+, Fetch
    v13+), and `topic_id` is None before them. `bytes` is the size of the records field.
    `error_code` and `high_watermark` are Fetch-only (0 and -1 in Produce).
    """

    topic: str | None
    topic_id: uuid.UUID | None
    partition: int
    bytes: int
    records: int
    batches: int
    compression: int
    magic: int
    error_code: int = 0
    high_watermark: int = -1

    @property
    def topic_label(self) -> str:
        return self.topic if self.topic is not None else str(self.topic_id)


class _PartitionTotals:
    """Request-wide sums, computed when asked: the data path reads them for few requests
    (capture, metrics), so they are not worth adding up while parsing."""

    __slots__ = ()
    partitions: list[PartitionSummary]

    @property
    def record_bytes(self) -> int:
        return sum(p.bytes for p in self.partitions)

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions)

    @property
    def batches(self) -> int:
        return sum(p.batches for p in self.partitions)


@dataclass(slots=True)
class ProduceSummary(_PartitionTotals):
    """What the proxy needs of a Produce request: acks (0 means no response will come),
    whether it is transactional (KIP-98), and its partitions' record figures."""

    acks: int
    timeout_ms: int
    transactional: bool
    partitions: list[PartitionSummary]


@dataclass(slots=True)
class FetchSummary(_PartitionTotals):
    """A Fetch response: the broker's own throttle, the top-level error (a fetch session
    error, KIP-227, from v7), and per partition what was returned."""

    throttle_time_ms: int
    error_code: int
    partitions: list[PartitionSummary]
    # Top-level tagged fields present (flexible versions), e.g. KIP-951 NodeEndpoints.
    tagged_fields: int = 0


@dataclass(slots=True)
class FetchPartitionRequest:
    """One partition a Fetch request asks for: where to read from and at most how much."""

    topic: str | None
    topic_id: uuid.UUID | None
    partition: int
    fetch_offset: int
    partition_max_bytes: int


@dataclass(slots=True)
class FetchRequestSummary:
    """The limits a Fetch request sets. `max_bytes_offset` is where the int32 MaxBytes
    field sits in the body (None before v3, which has no such field)."""

    max_wait_ms: int
    min_bytes: int
    max_bytes: int | None
    max_bytes_offset: int | None
    isolation_level: int
    partitions: list[FetchPartitionRequest]
    # KIP-227's fetch session, as the request names it: SessionEpoch 0 (a full fetch that asks
    # for a session) or -1 (sessionless, and every version before v7, Kafka's LEGACY
    # metadata) is a full fetch; above 0, an incremental fetch of session `session_id`.
    session_id: int = 0
    session_epoch: int = -1


def parse_share_fetch_request(body: Buffer, api_version: int) -> FetchRequestSummary:
    """The limits of a ShareFetch request (KIP-932; flexible in every version): MaxWaitMs,
    MinBytes and MaxBytes follow GroupId, MemberId and ShareSessionEpoch. Partitions are not
    read (the capture does not record them)."""
    return _guarded(_parse_share_fetch_request, body, api_version, "ShareFetch request")


def _parse_share_fetch_request(body: Buffer, version: int) -> FetchRequestSummary:
    offset = 0
    for _ in range(2):  # GroupId, MemberId: compact nullable strings
        length_plus_one, offset = read_uvarint(body, offset)
        offset += max(length_plus_one - 1, 0)
    offset += 4  # ShareSessionEpoch
    max_wait_ms, min_bytes, max_bytes = _THREE_INT32.unpack_from(body, offset)
    return FetchRequestSummary(max_wait_ms, min_bytes, max_bytes, offset + 8, 0, [])


def read_array_length(buf: Buffer, offset: int, flexible: bool) -> tuple[int, int]:
    """Element count of an array (0 for null), checked against the bytes left."""
    count, offset = compact_count(buf, offset) if flexible else array_count(buf, offset)
    return max(count, 0), offset


def _string(buf: Buffer, offset: int, flexible: bool) -> tuple[str | None, int]:
    """A nullable string: int16 length, or unsigned varint length + 1 (0 = null) in flexible
    versions. Topic names are decoded (they become labels); nothing else is."""
    return compact_string(buf, offset) if flexible else string(buf, offset)


def _topic(
    buf: Buffer, offset: int, flexible: bool, by_id: bool
) -> tuple[str | None, uuid.UUID | None, int, int]:
    """A topic's name (before the topic-id versions) or its 16-byte id (after), and the count of
    its partitions that follows in Produce and Fetch alike; returns the offset of the first."""
    if by_id:
        end = offset + _UUID_SIZE
        if end > len(buf):
            raise ProtocolDecodeError("topic id runs past the end of the message")
        topic_id = uuid.UUID(bytes=bytes(buf[offset:end]))
        partitions, offset = read_array_length(buf, end, flexible)
        return None, topic_id, partitions, offset
    name, offset = _string(buf, offset, flexible)
    partitions, offset = read_array_length(buf, offset, flexible)
    return name, None, partitions, offset


def _records(buf: Buffer, offset: int, flexible: bool) -> tuple[int, RecordCounts, int]:
    """Size and header summary of a nullable records field; returns the offset after it."""
    if flexible:
        size_plus_one, offset = read_uvarint(buf, offset)
        size = size_plus_one - 1
    else:
        (size,) = _INT32.unpack_from(buf, offset)
        offset += 4
        if size < -1:
            raise ProtocolDecodeError(f"invalid records length {size}")
    if size <= 0:
        return 0, EMPTY_RECORDS, offset
    end = offset + size
    if end > len(buf):
        raise ProtocolDecodeError("records run past the end of the message")
    return size, summarise_records(buf, offset, end), end


def _guarded(parser: Callable[[Buffer, int], S], body: Buffer, version: int, what: str) -> S:
    """Run a parser, turning the errors of reading past the end into ProtocolDecodeError."""
    try:
        return parser(body, version)
    except _SHORT_READ as exc:
        raise ProtocolDecodeError(f"truncated {what} v{version}: {exc}") from exc


def _expect_end(buf: Buffer, offset: int, what: str) -> None:
    # A message that parses but leaves bytes over was read with the wrong layout: better
    # to refuse it than to charge a quota by misread figures.
    if offset != len(buf):
        raise ProtocolDecodeError(f"{len(buf) - offset} unread bytes after {what}")


def parse_produce_request(body: Buffer, api_version: int) -> ProduceSummary:
    """Summarise a Produce request body (the bytes after the request header)."""
    return _guarded(_parse_produce_request, body, api_version, "Produce request")


def _parse_produce_request(body: Buffer, version: int) -> ProduceSummary:
    flexible = version >= PRODUCE_FIRST_FLEXIBLE
    by_id = version >= PRODUCE_FIRST_TOPIC_ID
    offset = 0
    transactional = False
    if version >= 3:  # TransactionalId (KIP-98)
        transactional_id, offset = _string(body, offset, flexible)
        transactional = transactional_id is not None
    (acks,) = _INT16.unpack_from(body, offset)
    (timeout_ms,) = _INT32.unpack_from(body, offset + 2)
    offset += 6
    partitions: list[PartitionSummary] = []
    topic_count, offset = read_array_length(body, offset, flexible)
    for _ in range(topic_count):
        topic, topic_id, partition_count, offset = _topic(body, offset, flexible, by_id)
        for _ in range(partition_count):
            (partition,) = _INT32.unpack_from(body, offset)
            size, (records, batches, compression, magic, _), offset = _records(body, offset + 4, flexible)
            if flexible:
                offset = skip_tagged_fields(body, offset)
            partitions.append(
                PartitionSummary(topic, topic_id, partition, size, records, batches, compression, magic))
        if flexible:
            offset = skip_tagged_fields(body, offset)
    if flexible:
        offset = skip_tagged_fields(body, offset)
    _expect_end(body, offset, f"Produce v{version} request")
    return ProduceSummary(acks, timeout_ms, transactional, partitions)


def parse_fetch_response(body: Buffer, api_version: int) -> FetchSummary:
    """Summarise a Fetch response body (the bytes after the response header)."""
    return _guarded(_parse_fetch_response, body, api_version, "Fetch response")


def _fetch_layout(version: int) -> tuple[bool, bool]:
    """(flexible, topics named by id) for a Fetch version: request and response change
    encoding at the same versions, v12 (KIP-482 compact fields) and v13 (KIP-516 topic ids)."""
    return version >= FETCH_FIRST_FLEXIBLE, version >= FETCH_FIRST_TOPIC_ID


def _parse_fetch_response(body: Buffer, version: int) -> FetchSummary:
    flexible, by_id = _fetch_layout(version)
    offset = 0
    throttle_time_ms = 0
    error_code = 0
    if version >= 1:  # ThrottleTimeMs (KIP-13)
        (throttle_time_ms,) = _INT32.unpack_from(body, 0)
        offset = 4
    if version >= 7:  # fetch sessions (KIP-227)
        (error_code,) = _INT16.unpack_from(body, offset)
        offset += 6  # error code, session id
    # Fixed fields between the high watermark and the aborted transactions: LastStableOffset
    # (v4, KIP-98) and LogStartOffset (v5, KIP-107).
    offsets_after_watermark = (8 if version >= 4 else 0) + (8 if version >= 5 else 0)
    partitions: list[PartitionSummary] = []
    topic_count, offset = read_array_length(body, offset, flexible)
    for _ in range(topic_count):
        topic, topic_id, partition_count, offset = _topic(body, offset, flexible, by_id)
        for _ in range(partition_count):
            partition, partition_error, high_watermark = _PARTITION_HEAD.unpack_from(body, offset)
            offset += _PARTITION_HEAD.size + offsets_after_watermark
            if version >= 4:  # AbortedTransactions (KIP-98), null unless read_committed
                aborted, offset = read_array_length(body, offset, flexible)
                for _ in range(aborted):
                    offset += 16  # producer id, first offset
                    if flexible:
                        offset = skip_tagged_fields(body, offset)
            if version >= 11:
                offset += 4  # preferred read replica (KIP-392, fetch from followers)
            size, (records, batches, compression, magic, _), offset = _records(body, offset, flexible)
            if flexible:
                offset = skip_tagged_fields(body, offset)
            partitions.append(PartitionSummary(
                topic, topic_id, partition, size, records, batches, compression, magic, partition_error,
                high_watermark))
        if flexible:
            offset = skip_tagged_fields(body, offset)
    # The top-level tagged fields are counted: KIP-951 NodeEndpoints live there, and a
    # response that has any must go through the address rewrite.
    tagged_fields = 0
    if flexible:
        tagged_fields = read_uvarint(body, offset)[0]
        offset = skip_tagged_fields(body, offset)
    _expect_end(body, offset, f"Fetch v{version} response")
    return FetchSummary(throttle_time_ms, error_code, partitions, tagged_fields)


def fetch_response_tag_count(body: Buffer, api_version: int) -> int:
    """How many top-level tagged fields a Fetch response v13+ has (KIP-951 NodeEndpoints live
    there), walking it as `parse_fetch_response` does but skipping each records field by its
    length: every small Fetch response from v16 is checked for NodeEndpoints, and summarising
    its batches, which the check does not need, was most of the cost. Raises
    ProtocolDecodeError on what `parse_fetch_response` refuses for its layout; bad batches
    inside a well-formed records field are not looked at."""
    if api_version < FETCH_FIRST_TOPIC_ID:
        return parse_fetch_response(body, api_version).tagged_fields
    return _guarded(_fetch_response_tag_count, body, api_version, "Fetch response")


def _fetch_response_tag_count(body: Buffer, version: int) -> int:
    # The generated skipper over every field before the top-level tag section: records are
    # skipped by their length, nothing is decoded.
    offset = _FETCH_TAG_SECTION[version](body, 0)
    tagged_fields = read_uvarint(body, offset)[0]
    _expect_end(body, skip_tagged_fields(body, offset), f"Fetch v{version} response")
    return tagged_fields


def parse_fetch_request(body: Buffer, api_version: int) -> FetchRequestSummary:
    """Summarise a Fetch request body (the bytes after the request header)."""
    return _guarded(_parse_fetch_request, body, api_version, "Fetch request")


def _parse_fetch_request(body: Buffer, version: int) -> FetchRequestSummary:
    flexible, by_id = _fetch_layout(version)
    # ReplicaId until v14; from v15 it moved into a tagged field at the end of the body
    # (ReplicaState, KIP-903).
    offset = 4 if version <= 14 else 0
    (max_wait_ms,) = _INT32.unpack_from(body, offset)
    (min_bytes,) = _INT32.unpack_from(body, offset + 4)
    offset += 8
    max_bytes: int | None = None
    max_bytes_offset: int | None = None
    if version >= 3:  # MaxBytes (KIP-74), which the fetch quota may cap in place
        max_bytes_offset = offset
        (max_bytes,) = _INT32.unpack_from(body, offset)
        offset += 4
    isolation_level = 0
    if version >= 4:  # IsolationLevel (KIP-98)
        (isolation_level,) = _INT8.unpack_from(body, offset)
        offset += 1
    session_id, session_epoch = 0, -1
    if version >= 7:  # session id, session epoch (KIP-227)
        session_id, session_epoch = _TWO_INT32.unpack_from(body, offset)
        offset += 8
    partitions: list[FetchPartitionRequest] = []
    topic_count, offset = read_array_length(body, offset, flexible)
    for _ in range(topic_count):
        topic, topic_id, partition_count, offset = _topic(body, offset, flexible, by_id)
        for _ in range(partition_count):
            (partition,) = _INT32.unpack_from(body, offset)
            offset += 4
            if version >= 9:
                offset += 4  # current leader epoch (KIP-320)
            (fetch_offset,) = _INT64.unpack_from(body, offset)
            offset += 8
            if version >= 12:
                offset += 4  # last fetched epoch (KIP-595)
            if version >= 5:
                offset += 8  # log start offset (KIP-107)
            (partition_max_bytes,) = _INT32.unpack_from(body, offset)
            offset += 4
            if flexible:
                offset = skip_tagged_fields(body, offset)
            partitions.append(FetchPartitionRequest(topic, topic_id, partition, fetch_offset, partition_max_bytes))
        if flexible:
            offset = skip_tagged_fields(body, offset)
    # ForgottenTopicsData and RackId follow; the proxy has no use for them.
    return FetchRequestSummary(max_wait_ms, min_bytes, max_bytes, max_bytes_offset, isolation_level, partitions,
                               session_id, session_epoch)


def patch_fetch_max_bytes(buf: bytearray, offset: int, value: int) -> None:
    """Overwrite a Fetch request's MaxBytes in place; `offset` indexes `buf` itself, so a
    caller holding the whole frame adds the body offset to `max_bytes_offset`."""
    if offset < 0 or offset + 4 > len(buf):
        raise ProtocolDecodeError(f"MaxBytes offset {offset} is outside a buffer of {len(buf)} bytes")
    _INT32.pack_into(buf, offset, max(0, min(value, 0x7FFFFFFF)))
