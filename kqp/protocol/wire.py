"""The primitives of Kafka's wire format that the generated codec (kqp.protocol.generated) calls.

Everything specific to a message (which fields, in which order, in which version) is in the
generated code; what is here is the same for every message: varints, length-prefixed
strings and bytes, array counts, tagged-field sections, and `Message`, the base of the
generated classes. Reads raise ProtocolDecodeError on bytes that cannot be a message; a read
past the end may also raise struct.error or IndexError, which kqp.protocol.codec reports as
ProtocolDecodeError.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

from kqp.protocol.errors import ProtocolDecodeError

Buffer = bytes | bytearray | memoryview

INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
ZERO_UUID = uuid.UUID(int=0)
_ZERO_UUID_BYTES = bytes(16)
_NULL_INT16 = INT16.pack(-1)
_NULL_INT32 = INT32.pack(-1)
# What a read or walk raises besides ProtocolDecodeError when the bytes end early or are not a
# message; callers turn these into ProtocolDecodeError.
SHORT_READ = (struct.error, IndexError, ValueError)


def read_uvarint(buf: Buffer, offset: int) -> tuple[int, int]:
    """Unsigned LEB128 varint; returns (value, next offset)."""
    if offset < len(buf) and buf[offset] < 0x80:
        return buf[offset], offset + 1  # one byte: nearly every length, count and tag section
    value = 0
    shift = 0
    while True:
        if offset >= len(buf):
            raise ProtocolDecodeError("truncated varint")
        byte = buf[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7
        if shift > 28:
            raise ProtocolDecodeError("varint longer than 5 bytes")


def write_uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def encode_uvarint(value: int) -> bytes:
    """Unsigned LEB128 varint, as read by `read_uvarint`."""
    out = bytearray()
    write_uvarint(out, value)
    return bytes(out)


def skip_tagged_fields(buf: Buffer, offset: int) -> int:
    """The offset after a tagged-field section, its fields unread."""
    if offset < len(buf) and buf[offset] == 0:
        return offset + 1  # the usual empty section
    count, offset = read_uvarint(buf, offset)
    for _ in range(count):
        _tag, offset = read_uvarint(buf, offset)
        size, offset = read_uvarint(buf, offset)
        offset += size
        if offset > len(buf):
            raise ProtocolDecodeError("truncated tagged field")
    return offset


def _checked_count(buf: Buffer, number: int, offset: int) -> tuple[int, int]:
    # Every element takes at least one byte: absurd counts stop here, before any loop.
    if number > len(buf) - offset:
        raise ProtocolDecodeError(f"array of {number} elements in {len(buf) - offset} bytes")
    return number, offset


def count(buf: Buffer, offset: int) -> tuple[int, int]:
    """An int32 array count (-1 for null), checked against the bytes left."""
    (number,) = INT32.unpack_from(buf, offset)
    if number < -1:
        raise ProtocolDecodeError(f"invalid array length {number}")
    return _checked_count(buf, number, offset + 4)


def compact_count(buf: Buffer, offset: int) -> tuple[int, int]:
    """A compact array count (varint of count + 1, 0 for null, returned as -1), checked likewise."""
    number, offset = read_uvarint(buf, offset)
    return _checked_count(buf, number - 1, offset)


def _length(buf: Buffer, offset: int, prefix: struct.Struct) -> tuple[int, int]:
    """An int16 (string) or int32 (bytes) length; -1 is null."""
    (length,) = prefix.unpack_from(buf, offset)
    if length < -1:
        raise ProtocolDecodeError(f"invalid length {length}")
    return length, offset + prefix.size


def _compact_length(buf: Buffer, offset: int) -> tuple[int, int]:
    """A compact length: unsigned varint of the length + 1, 0 (returned as -1) for null."""
    length, offset = read_uvarint(buf, offset)
    return length - 1, offset


def _raw(buf: Buffer, start: int, length: int) -> bytes:
    end = start + length
    if end > len(buf):
        raise ProtocolDecodeError("field runs past the end of the message")
    return bytes(buf[start:end])


def _text(buf: Buffer, length_and_offset: tuple[int, int]) -> tuple[str | None, int]:
    length, offset = length_and_offset
    if length < 0:
        return None, offset
    try:
        return _raw(buf, offset, length).decode("utf-8"), offset + length
    except UnicodeDecodeError as exc:
        raise ProtocolDecodeError("string is not valid UTF-8") from exc


def _bytes(buf: Buffer, length_and_offset: tuple[int, int]) -> tuple[bytes | None, int]:
    length, offset = length_and_offset
    if length < 0:
        return None, offset
    return _raw(buf, offset, length), offset + length


def string(buf: Buffer, offset: int) -> tuple[str | None, int]:
    return _text(buf, _length(buf, offset, INT16))


def compact_string(buf: Buffer, offset: int) -> tuple[str | None, int]:
    return _text(buf, _compact_length(buf, offset))


def blob(buf: Buffer, offset: int) -> tuple[bytes | None, int]:
    return _bytes(buf, _length(buf, offset, INT32))


def compact_blob(buf: Buffer, offset: int) -> tuple[bytes | None, int]:
    return _bytes(buf, _compact_length(buf, offset))


def read_uuid(raw: bytes) -> uuid.UUID:
    return ZERO_UUID if raw == _ZERO_UUID_BYTES else uuid.UUID(bytes=raw)


def uuid_bytes(value: uuid.UUID | None) -> bytes:
    return _ZERO_UUID_BYTES if value is None else value.bytes


def write_string(out: bytearray, value: str | None) -> None:
    if value is None:
        out += _NULL_INT16
        return
    raw = value.encode("utf-8")
    out += INT16.pack(len(raw))
    out += raw


def write_compact_string(out: bytearray, value: str | None) -> None:
    write_compact_blob(out, None if value is None else value.encode("utf-8"))


def write_blob(out: bytearray, value: bytes | None) -> None:
    if value is None:
        out += _NULL_INT32
        return
    out += INT32.pack(len(value))
    out += value


def write_compact_blob(out: bytearray, value: bytes | None) -> None:
    if value is None:
        out.append(0)
        return
    write_uvarint(out, len(value) + 1)
    out += value


def write_count(out: bytearray, items: list[Any] | None) -> None:
    out += _NULL_INT32 if items is None else INT32.pack(len(items))


def write_compact_count(out: bytearray, items: list[Any] | None) -> None:
    write_uvarint(out, 0 if items is None else len(items) + 1)


def write_tags(out: bytearray, known: list[tuple[int, bytes | bytearray]], unknown: dict[int, bytes] | None) -> None:
    """A tagged-field section: the known tags that differ from their default and the unknown
    ones a decode kept (so a rewritten message loses nothing a newer broker added), ascending."""
    entries = known if not unknown else sorted([*known, *unknown.items()], key=lambda entry: entry[0])
    write_uvarint(out, len(entries))
    for tag, raw in entries:
        write_uvarint(out, tag)
        write_uvarint(out, len(raw))
        out += raw


def tagged_field_end(buf: Buffer, offset: int) -> tuple[int, int, int]:
    """One entry of a tagged-field section: (tag, start of its value, end of its value)."""
    tag, offset = read_uvarint(buf, offset)
    size, offset = read_uvarint(buf, offset)
    end = offset + size
    if end > len(buf):
        raise ProtocolDecodeError("truncated tagged field")
    return tag, offset, end


def check_tag_end(tag: int, offset: int, end: int) -> None:
    if offset != end:
        raise ProtocolDecodeError(f"tagged field {tag} does not fill its size")


def bad_nullable(marker: int) -> ProtocolDecodeError:
    return ProtocolDecodeError(f"invalid nullable struct marker {marker}")


class Message:
    """Base of the generated message and struct classes.

    Fields are attributes named as kafka-python names them (snake_case of Kafka's names), so
    code written against either reads the same. An object belongs to no version: the version
    is an argument of `decode` and `encode`, and fields a version lacks keep their defaults.
    `unknown_tags` keeps the tagged fields this codec has no schema for, as raw bytes by tag.
    """

    __slots__ = ("unknown_tags",)
    # Set by the generated code: field names in declaration order, their defaults (a callable
    # makes a fresh value: lists and structs), and per-version decoders and encoders.
    FIELDS: ClassVar[tuple[str, ...]] = ()
    DEFAULTS: ClassVar[tuple[Any, ...]] = ()
    DECODERS: ClassVar[dict[int, Callable[[Buffer, int], tuple[Any, int]]]] = {}
    ENCODERS: ClassVar[dict[int, Callable[[Any, bytearray], None]]] = {}
    # The version `encode` writes by default: set on the views `Cls[version]` makes.
    VERSION: ClassVar[int | None] = None

    unknown_tags: dict[int, bytes] | None

    def __init__(self, **fields: Any) -> None:
        self.unknown_tags = None
        for name, default in zip(self.FIELDS, self.DEFAULTS, strict=True):
            if name in fields:
                setattr(self, name, fields.pop(name))
            else:
                setattr(self, name, default() if callable(default) else default)
        if fields:
            raise TypeError(f"{type(self).__name__} has no fields {sorted(fields)}")

    def __class_getitem__(cls, version: int) -> type[Message]:
        """`Cls[version]`, as with kafka-python's classes: the same class, whose objects encode
        in that version when `encode` is given none."""
        if version not in cls.DECODERS:
            raise KeyError(f"{cls.__name__} has no version {version}")
        view = _VERSIONED.get((cls, version))
        if view is None:
            view = _VERSIONED[(cls, version)] = type(cls.__name__, (cls,), {"__slots__": (), "VERSION": version})
        return view

    @classmethod
    def decode(cls, data: Buffer, version: int) -> Any:
        message, _ = cls.DECODERS[version](data, 0)
        return message

    def encode(self, version: int | None = None) -> bytes:
        if version is None:
            version = self.VERSION
            if version is None:
                raise TypeError(f"{type(self).__name__}.encode needs a version")
        out = bytearray()
        self.ENCODERS[version](self, out)
        return bytes(out)

    def to_dict(self) -> dict[str, Any]:
        return {name: _plain(getattr(self, name)) for name in self.FIELDS}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message) or other.FIELDS is not self.FIELDS:
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.FIELDS)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.FIELDS)
        return f"{type(self).__name__}({fields})"


_VERSIONED: dict[tuple[type[Message], int], type[Message]] = {}


def _plain(value: Any) -> Any:
    if isinstance(value, Message):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value
