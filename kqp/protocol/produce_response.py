"""Where ThrottleTimeMs sits in a Produce response, found by a walk written for Produce.

In a Produce response ThrottleTimeMs follows every topic's and partition's result, so finding
it means walking them all, once per response on the proxy's commonest path. The generic walk
(kqp.protocol.schema_walk, compiled from Kafka's JSON definitions) does that with one Python
call per array and per variable-length field; this walk does the same in one function, with the
one-byte varints nearly every count and length uses read inline. The layout, v3-13 (what the
bundled definitions describe):

    Responses [TopicProduceResponse]
        Name string (v3-12) | TopicId uuid (v13+)
        PartitionResponses [PartitionProduceResponse]
            Index int32, ErrorCode int16, BaseOffset int64, LogAppendTimeMs int64,
            LogStartOffset int64 (v5+)
            RecordErrors [BatchIndex int32, BatchIndexErrorMessage nullable string] (v8+)
            ErrorMessage nullable string (v8+)
            <tagged fields> (v9+: CurrentLeader, v10+)
        <tagged fields> (v9+)
    ThrottleTimeMs int32
    <tagged fields> (v9+: NodeEndpoints, v10+)

Flexible versions (v9+) use compact (varint) lengths and counts. The walk follows the generic
one's checks step for step, so that on any bytes both give the same offset or both fail
(tests/unit/protocol/test_produce_response.py holds them to it): an array's count is checked
against the bytes left, a string's end against the buffer's, fixed-size fields are skipped
unread (the caller checks the final offset). What runs past the end raises ProtocolDecodeError,
or struct.error / IndexError, which the caller turns into ProtocolDecodeError as it does for
the generic walk's.
"""

from __future__ import annotations

import struct

from kqp.protocol.errors import ProtocolDecodeError
from kqp.protocol.headers import read_uvarint, skip_tagged_fields

Buffer = bytes | bytearray | memoryview

FIRST_VERSION = 3
LAST_VERSION = 13
_FIRST_FLEXIBLE = 9
_FIRST_TOPIC_ID = 13
_FIRST_RECORD_ERRORS = 8
_UUID_SIZE = 16
# Index, ErrorCode, BaseOffset, LogAppendTimeMs; LogStartOffset from v5 (KIP-107).
_PARTITION_FIXED_V3 = 4 + 2 + 8 + 8
_PARTITION_FIXED_V5 = _PARTITION_FIXED_V3 + 8
_BATCH_INDEX = 4

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


def walks(api_version: int) -> bool:
    """Whether `throttle_offset` knows this version's layout."""
    return FIRST_VERSION <= api_version <= LAST_VERSION


def throttle_offset(buf: Buffer, offset: int, api_version: int) -> int:
    """The offset of ThrottleTimeMs in a Produce response whose body starts at `offset`
    (`walks(api_version)` must hold). The returned offset is not checked against the end."""
    if api_version >= _FIRST_FLEXIBLE:
        return _flexible(buf, offset, api_version >= _FIRST_TOPIC_ID)
    return _classic(buf, offset, api_version)


def _classic(buf: Buffer, offset: int, version: int) -> int:
    """v3-8: int32 counts, int16 string lengths, no tagged fields."""
    end = len(buf)
    fixed = _PARTITION_FIXED_V5 if version >= 5 else _PARTITION_FIXED_V3
    record_errors = version >= _FIRST_RECORD_ERRORS
    topics, offset = _int32_count(buf, offset, end)
    for _ in range(topics):
        offset = _int16_string(buf, offset, end)
        partitions, offset = _int32_count(buf, offset, end)
        if not record_errors:
            # Fixed-size elements: skipped in one step, as the generic walk skips them.
            offset += partitions * fixed
            continue
        for _ in range(partitions):
            errors, offset = _int32_count(buf, offset + fixed, end)
            for _ in range(errors):
                offset = _int16_string(buf, offset + _BATCH_INDEX, end)
            offset = _int16_string(buf, offset, end)  # ErrorMessage
    return offset


def _int32_count(buf: Buffer, offset: int, end: int) -> tuple[int, int]:
    (count,) = _INT32.unpack_from(buf, offset)
    offset += 4
    if count < -1:
        raise ProtocolDecodeError(f"invalid array length {count}")
    # Every element takes at least one byte: absurd counts stop here, before any loop.
    if count > end - offset:
        raise ProtocolDecodeError(f"array of {count} elements in {end - offset} bytes")
    return (count if count > 0 else 0), offset


def _int16_string(buf: Buffer, offset: int, end: int) -> int:
    (length,) = _INT16.unpack_from(buf, offset)
    offset += 2
    if length < -1:
        raise ProtocolDecodeError(f"invalid length {length}")
    if length > 0:
        offset += length
        if offset > end:
            raise ProtocolDecodeError("field runs past the end of the message")
    return offset


def _flexible(buf: Buffer, offset: int, by_id: bool) -> int:
    """v9-13: compact counts and lengths (unsigned varint of the value + 1, 0 for null) and a
    tagged-field section closing every struct. Counts, lengths and empty tag sections nearly
    always fit one byte (< 0x80) and are read inline; anything longer goes to read_uvarint."""
    end = len(buf)
    byte = buf[offset]
    if byte < 0x80:
        topics, offset = byte - 1, offset + 1
    else:
        topics, offset = read_uvarint(buf, offset)
        topics -= 1
    if topics > end - offset:
        raise ProtocolDecodeError(f"array of {topics} elements in {end - offset} bytes")
    for _ in range(topics):
        if by_id:
            offset += _UUID_SIZE
        else:
            offset = _compact_string(buf, offset, end)
        byte = buf[offset]
        if byte < 0x80:
            partitions, offset = byte - 1, offset + 1
        else:
            partitions, offset = read_uvarint(buf, offset)
            partitions -= 1
        if partitions > end - offset:
            raise ProtocolDecodeError(f"array of {partitions} elements in {end - offset} bytes")
        for _ in range(partitions):
            offset += _PARTITION_FIXED_V5
            byte = buf[offset]
            if byte < 0x80:
                errors, offset = byte - 1, offset + 1
            else:
                errors, offset = read_uvarint(buf, offset)
                errors -= 1
            if errors > end - offset:
                raise ProtocolDecodeError(f"array of {errors} elements in {end - offset} bytes")
            for _ in range(errors):
                offset = _compact_string(buf, offset + _BATCH_INDEX, end)
                offset = offset + 1 if buf[offset] == 0 else skip_tagged_fields(buf, offset)
            offset = _compact_string(buf, offset, end)  # ErrorMessage
            # The partition's tags (CurrentLeader, KIP-951): usually none.
            offset = offset + 1 if buf[offset] == 0 else skip_tagged_fields(buf, offset)
        offset = offset + 1 if buf[offset] == 0 else skip_tagged_fields(buf, offset)
    return offset


def _compact_string(buf: Buffer, offset: int, end: int) -> int:
    byte = buf[offset]
    if byte < 0x80:
        length, offset = byte - 1, offset + 1
    else:
        length, offset = read_uvarint(buf, offset)
        length -= 1
    if length > 0:
        offset += length
        if offset > end:
            raise ProtocolDecodeError("field runs past the end of the message")
    return offset
