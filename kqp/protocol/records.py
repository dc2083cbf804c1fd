"""Counting records and batches from RecordBatch headers, without touching the payload.

A records field is a sequence of entries that all start with (offset int64, length int32)
and keep the magic byte at offset 16, whatever the format: RecordBatch v2 (magic 2) has
partitionLeaderEpoch before it, legacy messages (magic 0/1) have their CRC there. So the
entries can be walked by their lengths, and a v2 batch says how many records it holds in
its header (recordCount), which is what the broker charges. Compressed payloads are never
decompressed, so a compressed legacy wrapper message counts as one record: the number of
messages inside it is only known after decompression (Kafka 4 no longer writes magic 0/1).
"""

from __future__ import annotations

import struct

from kqp.protocol.errors import ProtocolDecodeError

# offset int64, length int32: common to every format, "LOG_OVERHEAD" in Kafka.
LOG_OVERHEAD = 12
MAGIC_OFFSET = 16
ATTRIBUTES_OFFSET = 21  # int16 in RecordBatch v2
RECORD_COUNT_OFFSET = 57
BATCH_HEADER_SIZE = 61  # RecordBatch v2 header, up to and including recordCount
# A legacy v0 message: crc, magic, attributes, key length, value length.
LEGACY_MIN_SIZE = 14
COMPRESSION_MASK = 0x07

_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")


# (records, batches, compression, magic, partial_bytes): a plain tuple, as this runs once
# per partition on the data path. `compression` and `magic` are those of the first entry
# (-1 when there is none). `partial_bytes` is a truncated trailing entry: brokers cut the
# last batch of a Fetch response at the size limit, and clients ignore it.
RecordCounts = tuple[int, int, int, int, int]
EMPTY_RECORDS: RecordCounts = (0, 0, -1, -1, 0)


def summarise_records(buf: bytes | bytearray | memoryview, start: int, end: int) -> RecordCounts:
    """Walk the entries of buf[start:end] by their length fields."""
    if start == end:
        return EMPTY_RECORDS
    records = 0
    batches = 0
    compression = -1
    magic = -1
    position = start
    unpack_int32 = _INT32.unpack_from
    while end - position > MAGIC_OFFSET:
        (length,) = unpack_int32(buf, position + 8)
        entry_end = position + LOG_OVERHEAD + length
        if entry_end > end:
            break
        entry_magic = buf[position + MAGIC_OFFSET]
        if entry_magic >= 2:
            if length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
                raise ProtocolDecodeError(f"record batch length {length} is shorter than its header")
            if entry_magic != 2:
                raise ProtocolDecodeError(f"unknown record batch magic {entry_magic}")
            (count,) = unpack_int32(buf, position + RECORD_COUNT_OFFSET)
            if count < 0:
                raise ProtocolDecodeError(f"negative record count {count}")
            attributes = _INT16.unpack_from(buf, position + ATTRIBUTES_OFFSET)[0]
        else:
            if length < LEGACY_MIN_SIZE:
                raise ProtocolDecodeError(f"legacy message length {length} is shorter than its header")
            count = 1
            attributes = buf[position + MAGIC_OFFSET + 1]
        if batches == 0:
            compression = attributes & COMPRESSION_MASK
            magic = entry_magic
        records += count
        batches += 1
        position = entry_end
    return records, batches, compression, magic, end - position
