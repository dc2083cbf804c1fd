"""Forwarding a Fetch response while it streams in (cut-through), sans IO.

A Fetch response is mostly record bytes the proxy never looks at. Everything it may change
is at either end of the body: ThrottleTimeMs is its first field (patched in place, same
length), and KIP-951 NodeEndpoints, the only broker addresses a Fetch response carries, sit
in the top-level tagged fields at its very end (Fetch v16+). `FetchResponseStream` follows
the body's structure as bytes arrive, skipping records without copying them, and says how
many bytes may go to the client at once: everything before that trailing tagged-field
section. The section (a few bytes, or a few dozen with NodeEndpoints) is held until the
frame ends and rewritten by `rewrite_fetch_tail` to exactly its original length, since the
frame's size prefix went to the client first:

* NodeEndpoints rewritten to the proxy's addresses, then padded with an unknown tagged field
  (which every Kafka client skips, by the protocol's rules) if they came out shorter;
* if the rewritten endpoints would not fit, they are left out and the section padded: the
  client then finds the new leader through Metadata, as it does with older brokers.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Generator

from kqp.protocol.errors import ProtocolDecodeError
from kqp.protocol.headers import encode_uvarint, read_uvarint

# First Fetch version with NodeEndpoints (KIP-951).
FETCH_NODE_ENDPOINTS_SINCE = 16
NODE_ENDPOINTS_TAG = 0
# A tag no FetchResponse version defines (Kafka numbers tags from 0 up, a few per message):
# its field only fills room, and clients skip tags they do not know.
PADDING_TAG = 0x3FFF

AddressMapper = Callable[[int, str, int], tuple[str, int]]

# The walker yields n > 0 to receive the next n bytes, or n < 0 to skip -n bytes.
_Walker = Generator[int, bytes | None, None]
_INT32 = struct.Struct(">i")
# PartitionIndex, ErrorCode, HighWatermark, LastStableOffset, LogStartOffset.
_PARTITION_FIXED_BYTES = 4 + 2 + 8 + 8 + 8
_TOPIC_ID_BYTES = 16


def _uvarint() -> Generator[int, bytes | None, int]:
    value = shift = 0
    while True:
        byte = yield 1
        assert byte is not None
        value |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return value
        shift += 7
        if shift > 28:
            raise ProtocolDecodeError("varint longer than 5 bytes in a Fetch response")


def _skip(count: int) -> Generator[int, bytes | None, None]:
    if count > 0:
        yield -count


def _skip_tagged_fields() -> Generator[int, bytes | None, None]:
    fields = yield from _uvarint()
    for _ in range(fields):
        yield from _uvarint()  # tag
        size = yield from _uvarint()
        yield from _skip(size)


def _walk_body_with_endpoints() -> _Walker:
    """A Fetch response body (v16+) up to its top-level tagged fields."""
    yield -(4 + 2 + 4)  # ThrottleTimeMs, ErrorCode, SessionId
    topics = (yield from _uvarint()) - 1
    for _ in range(max(topics, 0)):
        yield -_TOPIC_ID_BYTES  # topics are named by id from v13
        partitions = (yield from _uvarint()) - 1
        for _ in range(max(partitions, 0)):
            yield -_PARTITION_FIXED_BYTES
            aborted = (yield from _uvarint()) - 1
            for _ in range(max(aborted, 0)):
                yield -16  # ProducerId, FirstOffset
                yield from _skip_tagged_fields()
            yield -4  # PreferredReadReplica
            yield from _skip((yield from _uvarint()) - 1)  # Records (null: length 0 - 1)
            yield from _skip_tagged_fields()
        yield from _skip_tagged_fields()


class FetchResponseStream:
    """Follows a Fetch response body as it arrives; finds where its held-back tail begins.

    Fetch versions without NodeEndpoints stream whole: their tail is empty.
    """

    __slots__ = ("_partial", "_walker", "_want", "in_tail")

    def __init__(self, version: int) -> None:
        self._partial = bytearray()
        self.in_tail = False
        self._walker: _Walker | None = None
        self._want = 0
        if version >= FETCH_NODE_ENDPOINTS_SINCE:
            self._walker = _walk_body_with_endpoints()
            self._want = next(self._walker)

    @property
    def streams_whole(self) -> bool:
        return self._walker is None

    def feed(self, data: bytes | bytearray | memoryview) -> int:
        """Take the next body bytes; returns how many of them come before the tail.

        Once the tail has begun, every later byte belongs to it (returns 0).
        """
        if self._walker is None:
            return len(data)
        view = memoryview(data)
        position, end = 0, len(view)
        while not self.in_tail and position < end:
            want = self._want
            if want < 0:
                taken = min(-want, end - position)
                position += taken
                self._want = want + taken
                if self._want == 0:
                    self._advance(None)
            else:
                taken = min(want - len(self._partial), end - position)
                self._partial += view[position : position + taken]
                position += taken
                if len(self._partial) == want:
                    chunk = bytes(self._partial)
                    self._partial.clear()
                    self._advance(chunk)
        return position

    def _advance(self, value: bytes | None) -> None:
        assert self._walker is not None
        try:
            self._want = self._walker.send(value)
        except StopIteration:
            self.in_tail = True


def _rewrite_node_endpoints(data: bytes, mapper: AddressMapper) -> bytes:
    """NodeEndpoints (compact array of NodeId, Host, Port, Rack, tags) with the proxy's addresses."""
    count, offset = read_uvarint(data, 0)
    out = bytearray(encode_uvarint(count))
    for _ in range(max(count - 1, 0)):
        node_id = _INT32.unpack_from(data, offset)[0]
        host_length, offset = read_uvarint(data, offset + 4)
        host = data[offset : offset + host_length - 1].decode()
        offset += host_length - 1
        port = _INT32.unpack_from(data, offset)[0]
        offset += 4
        rest_start = offset  # Rack and the entry's tagged fields are kept byte for byte
        rack_length, offset = read_uvarint(data, offset)
        offset += max(rack_length - 1, 0)
        tags, offset = read_uvarint(data, offset)
        for _ in range(tags):
            _tag, offset = read_uvarint(data, offset)
            size, offset = read_uvarint(data, offset)
            offset += size
        new_host, new_port = mapper(node_id, host, port)
        encoded = new_host.encode()
        out += _INT32.pack(node_id) + encode_uvarint(len(encoded) + 1) + encoded + _INT32.pack(new_port)
        out += data[rest_start:offset]
    if offset != len(data):
        raise ProtocolDecodeError(f"NodeEndpoints field has {len(data) - offset} bytes past its entries")
    return bytes(out)


def _padding(room: int) -> bytes | None:
    """An unknown tagged field of exactly `room` bytes, or None when no such field fits."""
    tag = encode_uvarint(PADDING_TAG)
    for size in range(max(room - len(tag) - 5, 0), room - len(tag)):
        field = tag + encode_uvarint(size) + bytes(size)
        if len(field) == room:
            return field
    return None


def rewrite_fetch_tail(tail: bytes, mapper: AddressMapper) -> bytes:
    """The top-level tagged fields of a Fetch response, addresses rewritten, same length.

    Raises ProtocolDecodeError when the section is malformed.
    """
    count, offset = read_uvarint(tail, 0)
    fields: list[tuple[int, bytes]] = []
    for _ in range(count):
        tag, offset = read_uvarint(tail, offset)
        size, offset = read_uvarint(tail, offset)
        if offset + size > len(tail):
            raise ProtocolDecodeError("tagged field runs past the end of the Fetch response")
        fields.append((tag, tail[offset : offset + size]))
        offset += size
    if offset != len(tail):
        raise ProtocolDecodeError(f"{len(tail) - offset} bytes after the Fetch response's tagged fields")
    if not any(tag == NODE_ENDPOINTS_TAG for tag, _ in fields):
        return tail

    def encode(kept: list[tuple[int, bytes]]) -> bytes:
        out = bytearray(encode_uvarint(len(kept)))
        for tag, data in kept:
            out += encode_uvarint(tag) + encode_uvarint(len(data)) + data
        return bytes(out)

    rewritten = [(tag, _rewrite_node_endpoints(data, mapper) if tag == NODE_ENDPOINTS_TAG else data)
                 for tag, data in fields]
    without = [(tag, data) for tag, data in fields if tag != NODE_ENDPOINTS_TAG]
    for kept in (rewritten, without):
        candidate = encode(kept)
        if len(candidate) == len(tail):
            return candidate
        padded = _fit(kept, len(tail), encode)
        if padded is not None:
            return padded
    raise ProtocolDecodeError("no same-length form of the Fetch response's tagged fields")


def _fit(
    kept: list[tuple[int, bytes]], length: int, encode: Callable[[list[tuple[int, bytes]]], bytes]
) -> bytes | None:
    """`kept` plus a padding field, encoded to exactly `length` bytes, if possible."""
    base = encode([*kept, (PADDING_TAG, b"")])
    room = length - len(base) + len(encode_uvarint(PADDING_TAG)) + 1  # bytes the padding field may use
    if room <= 0:
        return None
    field = _padding(room)
    if field is None:
        return None
    out = encode(kept)
    # Same fields plus one: the count grows by one (one byte while there are fewer than 127).
    count = encode_uvarint(len(kept) + 1)
    head_length = len(encode_uvarint(len(kept)))
    candidate = count + out[head_length:] + field
    return candidate if len(candidate) == length else None
