"""Incremental length-prefixed framing, as Kafka's network layer does it.

Every Kafka message is a 4-byte big-endian size followed by that many bytes. The size is
checked against a limit before anything is allocated for the frame, because a peer can
claim up to 2 GiB in four bytes (Kafka's socket.request.max.bytes guards the broker the
same way).
"""

from __future__ import annotations

import struct

from kqp.protocol.errors import FrameTooLargeError, ProtocolDecodeError

SIZE_PREFIX = 4
_INT32 = struct.Struct(">i")
DEFAULT_MAX_FRAME_BYTES = 104_857_600  # Kafka's socket.request.max.bytes default
# Pieces of a frame smaller than this are copied together rather than kept one by one: a peer
# that sends a large frame a few bytes per read must not cost an object per read.
COALESCE_BELOW_BYTES = 16 * 1024


class FrameDecoder:
    """Turns a byte stream into whole frames (without their size prefix).

    A frame that arrives whole in one read is copied out of it once. A frame that spans reads
    is kept as the pieces it came in (the reads' own bytes, which nothing changes) and joined
    once when its last piece arrives: each of its bytes is copied once, not appended to a
    buffer and then copied out of it. Small pieces are copied together as they come
    (COALESCE_BELOW_BYTES), so the pieces of a frame are never many.
    """

    __slots__ = ("_max_frame_bytes", "_needed", "_parts", "_parts_bytes", "_prefix")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._max_frame_bytes = max_frame_bytes
        # The first bytes of a size prefix split across reads (fewer than four).
        self._prefix = bytearray()
        # Size of the frame being assembled, or -1 while its prefix is incomplete.
        self._needed = -1
        # The frame being assembled: its bytes so far, in the pieces they came in.
        self._parts: list[bytes | bytearray | memoryview] = []
        self._parts_bytes = 0

    @property
    def buffered_bytes(self) -> int:
        return len(self._prefix) + self._parts_bytes

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add received bytes; return every frame completed by them, in order.

        Raises FrameTooLargeError or ProtocolDecodeError on an impossible size prefix; the
        stream cannot be resynchronised after that, so the caller closes the connection.
        """
        if self._needed < 0 and not self._prefix and len(data) >= SIZE_PREFIX:
            # The commonest read of all is exactly one whole frame (a small request, a small
            # response): one slice, no memoryview, no loop. bytes(data[4:]) of bytes is that
            # slice itself (one copy); of a memoryview, the one copy of its bytes.
            size: int = _INT32.unpack_from(data, 0)[0]
            if len(data) - SIZE_PREFIX == size and size <= self._max_frame_bytes:
                return [bytes(data[SIZE_PREFIX:])]
        # Pieces of immutable bytes are kept as they are; anything else is copied, since its
        # owner may reuse it once this call returns.
        immutable = isinstance(data, bytes) or (isinstance(data, memoryview) and isinstance(data.obj, bytes))
        view = memoryview(data)
        frames: list[bytes] = []
        start = 0
        end = len(view)
        while True:
            needed = self._needed
            if needed < 0:
                prefix = self._prefix
                if prefix or end - start < SIZE_PREFIX:
                    take = min(SIZE_PREFIX - len(prefix), end - start)
                    prefix += view[start : start + take]
                    start += take
                    if len(prefix) < SIZE_PREFIX:
                        break
                    size = int.from_bytes(prefix, "big", signed=True)
                    prefix.clear()
                else:
                    size = int.from_bytes(view[start : start + SIZE_PREFIX], "big", signed=True)
                    start += SIZE_PREFIX
                if size < 0:
                    raise ProtocolDecodeError(f"negative frame size {size}")
                if size > self._max_frame_bytes:
                    raise FrameTooLargeError(
                        f"frame of {size} bytes exceeds the limit of {self._max_frame_bytes} bytes"
                    )
                self._needed = needed = size
            have = self._parts_bytes
            if not have and end - start >= needed:
                frames.append(bytes(view[start : start + needed]))  # whole in this read
                start += needed
                self._needed = -1
                continue
            if start == end:
                break
            take = min(needed - have, end - start)
            piece = view[start : start + take]
            parts = self._parts
            if take < COALESCE_BELOW_BYTES:
                last = parts[-1] if parts else None
                if isinstance(last, bytearray):
                    last += piece
                else:
                    parts.append(bytearray(piece))
            else:
                parts.append(piece if immutable else bytes(piece))
            self._parts_bytes = have + take
            start += take
            if have + take < needed:
                break
            frames.append(b"".join(self._parts))
            self._parts.clear()
            self._parts_bytes = 0
            self._needed = -1
        return frames

    def incomplete_frame(self) -> tuple[int, int]:
        """(size, bytes received) of the frame being assembled; (-1, 0) before its size is known."""
        if self._needed < 0:
            return -1, 0
        return self._needed, self._parts_bytes

    def detach_incomplete(self) -> bytes:
        """Hand over the frame being assembled (its bytes so far); the caller takes the rest of
        it straight from the stream (cut-through), and the next byte fed starts a new frame."""
        if self._needed < 0:
            raise ValueError("no frame in progress")
        partial = b"".join(self._parts)
        self._parts.clear()
        self._parts_bytes = 0
        self._needed = -1
        return partial


def frame(payload: bytes | bytearray | memoryview) -> bytes:
    """Prefix a payload with its size (a copy: for tests and rare paths; the data path
    writes the prefix and the frame separately)."""
    return len(payload).to_bytes(SIZE_PREFIX, "big") + bytes(payload)
