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


class FrameDecoder:
    """Turns a byte stream into whole frames (without their size prefix)."""

    __slots__ = ("_buffer", "_max_frame_bytes", "_needed")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._buffer = bytearray()
        self._max_frame_bytes = max_frame_bytes
        # Size of the frame being assembled, or -1 while its prefix is incomplete.
        self._needed = -1

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add received bytes; return every frame completed by them, in order.

        Raises FrameTooLargeError or ProtocolDecodeError on an impossible size prefix; the
        stream cannot be resynchronised after that, so the caller closes the connection.
        """
        buffer = self._buffer
        if not buffer and self._needed < 0 and len(data) >= SIZE_PREFIX:
            # The commonest read of all is exactly one whole frame (a small request, a small
            # response): one slice, no memoryview, no loop. bytes(data[4:]) of bytes is that
            # slice itself (one copy); of a memoryview, the one copy of its bytes.
            size: int = _INT32.unpack_from(data, 0)[0]
            if len(data) - SIZE_PREFIX == size and size <= self._max_frame_bytes:
                return [bytes(data[SIZE_PREFIX:])]
        # Read straight from `data` when nothing is buffered (the usual case: whole frames per
        # read), so each frame is copied once, not appended to the buffer and copied out.
        if buffer:
            buffer += data
            source: bytes | bytearray | memoryview = buffer
        else:
            source = data
        frames: list[bytes] = []
        start = 0
        end = len(source)
        with memoryview(source) as view:
            while True:
                if self._needed < 0:
                    if end - start < SIZE_PREFIX:
                        break
                    size = int.from_bytes(view[start : start + SIZE_PREFIX], "big", signed=True)
                    if size < 0:
                        raise ProtocolDecodeError(f"negative frame size {size}")
                    if size > self._max_frame_bytes:
                        raise FrameTooLargeError(
                            f"frame of {size} bytes exceeds the limit of {self._max_frame_bytes} bytes"
                        )
                    self._needed = size
                    start += SIZE_PREFIX
                if end - start < self._needed:
                    break
                frames.append(bytes(view[start : start + self._needed]))
                start += self._needed
                self._needed = -1
            # Keep only the unfinished remainder: copied from `data`, or left in the buffer
            # and trimmed below (one deletion per feed, not one per frame).
            if source is not buffer and start < end:
                buffer += view[start:end]
        if source is buffer and start:
            del buffer[:start]
        return frames

    def incomplete_frame(self) -> tuple[int, int]:
        """(size, bytes received) of the frame being assembled; (-1, 0) before its size is known."""
        if self._needed < 0:
            return -1, 0
        return self._needed, len(self._buffer)

    def detach_incomplete(self) -> bytes:
        """Hand over the frame being assembled (its bytes so far); the caller takes the rest of
        it straight from the stream (cut-through), and the next byte fed starts a new frame."""
        if self._needed < 0:
            raise ValueError("no frame in progress")
        partial = bytes(self._buffer)
        self._buffer.clear()
        self._needed = -1
        return partial


def frame(payload: bytes | bytearray | memoryview) -> bytes:
    """Prefix a payload with its size (a copy: for tests and rare paths; the data path
    writes the prefix and the frame separately)."""
    return len(payload).to_bytes(SIZE_PREFIX, "big") + bytes(payload)
