"""Reading and patching ThrottleTimeMs in a response frame, in place, for any API and version.

Where the field sits comes from Kafka's own JSON response schemas (bundled with
kafka-python, reached through kqp.protocol.apis), not from a hand-written table: most
responses have it first in the body, ApiVersions has it after ErrorCode and ApiKeys,
Produce after its Responses array, and some versions have none. For each (API, version)
the fields that precede it are compiled once into a skipper: a constant offset when they
all have a fixed size, else a small walk over the variable-length ones (strings, arrays,
structs, tagged-field sections) that never decodes them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import Any

from kqp.protocol.apis import API_SPECS, API_VERSIONS_KEY, parse_versions
from kqp.protocol.errors import ProtocolDecodeError
from kqp.protocol.fast_path import read_array_length
from kqp.protocol.headers import read_uvarint, skip_tagged_fields

Buffer = bytes | bytearray | memoryview
# Reads nothing, returns the offset just after the field(s) it stands for.
Skipper = Callable[[Buffer, int], int]

THROTTLE_FIELD = "ThrottleTimeMs"
UNSUPPORTED_VERSION = 35
MAX_THROTTLE_MS = 0x7FFFFFFF

_FIXED_SIZES = {
    "bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "float64": 8, "uuid": 16,
    "bitfield": 4,  # kafka-python renames some int32 authorized-operations fields so
}
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_SHORT_READ = (struct.error, IndexError, ValueError)


def field_in_versions(field: Mapping[str, Any], key: str, version: int) -> bool:
    text = field.get(key)
    if text is None:
        return False
    bounds = parse_versions(str(text))
    return bounds is not None and bounds[0] <= version <= bounds[1]


def _wire_fields(fields: Iterable[Mapping[str, Any]], version: int) -> list[Mapping[str, Any]]:
    """Fields written in order at this version (tagged ones go in the trailing section)."""
    return [
        f for f in fields
        if field_in_versions(f, "versions", version) and not field_in_versions(f, "taggedVersions", version)
    ]


def _length_prefixed(length_size: int, flexible: bool) -> Skipper:
    """Skipper of a string (int16 length) or bytes/records (int32 length); -1 means null."""
    unpack = _INT16.unpack_from if length_size == 2 else _INT32.unpack_from

    def skip(buf: Buffer, offset: int) -> int:
        if flexible:
            length_plus_one, offset = read_uvarint(buf, offset)
            length = length_plus_one - 1
        else:
            length = unpack(buf, offset)[0]
            offset += length_size
            if length < -1:
                raise ProtocolDecodeError(f"invalid length {length}")
        end = offset + max(length, 0)
        if end > len(buf):
            raise ProtocolDecodeError("field runs past the end of the message")
        return end

    return skip


def _array(element: Skipper | int, flexible: bool) -> Skipper:
    if isinstance(element, int):
        size = element

        def skip_fixed(buf: Buffer, offset: int) -> int:
            count, offset = read_array_length(buf, offset, flexible)
            return offset + count * size

        return skip_fixed

    def skip(buf: Buffer, offset: int) -> int:
        count, offset = read_array_length(buf, offset, flexible)
        for _ in range(count):
            offset = element(buf, offset)
        return offset

    return skip


def _sequence(steps: list[Skipper | int]) -> Skipper | int:
    """Fold consecutive fixed sizes together; a plain int when nothing varies."""
    folded: list[Skipper | int] = []
    for step in steps:
        if isinstance(step, int) and folded and isinstance(folded[-1], int):
            folded[-1] += step
        else:
            folded.append(step)
    if not folded:
        return 0
    if len(folded) == 1:
        return folded[0]
    plan = tuple(folded)

    def skip(buf: Buffer, offset: int) -> int:
        for step in plan:
            offset = offset + step if isinstance(step, int) else step(buf, offset)
        return offset

    return skip


def _struct(fields: Iterable[Mapping[str, Any]], version: int, flexible: bool) -> Skipper | int:
    steps = [_field(f, version, flexible) for f in _wire_fields(fields, version)]
    if flexible:
        steps.append(skip_tagged_fields)
    return _sequence(steps)


def _type_skipper(
    type_name: str, subfields: list[Mapping[str, Any]] | None, version: int, flexible: bool
) -> Skipper | int:
    if type_name.startswith("[]"):
        return _array(_type_skipper(type_name[2:], subfields, version, flexible), flexible)
    if type_name in _FIXED_SIZES:
        return _FIXED_SIZES[type_name]
    if type_name == "string":
        return _length_prefixed(2, flexible)
    if type_name in ("bytes", "records"):
        return _length_prefixed(4, flexible)
    if subfields is not None:
        return _struct(subfields, version, flexible)
    raise ValueError(f"schema type {type_name!r} has no known wire form")


def _field(field: Mapping[str, Any], version: int, flexible: bool) -> Skipper | int:
    inner = _type_skipper(str(field["type"]), field.get("fields"), version, flexible)
    is_struct = not str(field["type"]).startswith("[]") and "fields" in field
    if is_struct and field_in_versions(field, "nullableVersions", version):
        # A nullable struct is preceded by an int8: -1 for null, 1 when present.
        def skip_nullable(buf: Buffer, offset: int) -> int:
            if offset >= len(buf):
                raise ProtocolDecodeError("truncated nullable struct")
            present = buf[offset] != 0xFF
            offset += 1
            if not present:
                return offset
            return offset + inner if isinstance(inner, int) else inner(buf, offset)

        return skip_nullable
    return inner


@cache
def field_location(api_key: int, api_version: int, name: str) -> Skipper | int | None:
    """How to reach a top-level response field from the start of the body: a constant offset,
    a skipper over the fields before it, or None when this version has no such field (or the
    definitions do not describe the version: its layout is then unknown)."""
    spec = API_SPECS.get(api_key)
    if spec is None or not spec.supports(api_version):
        return None
    fields: list[Mapping[str, Any]] = spec.response_class.json["fields"]
    flexible = spec.is_flexible(api_version)
    before: list[Skipper | int] = []
    for field in _wire_fields(fields, api_version):
        if field["name"] == name:
            return _sequence(before)
        before.append(_field(field, api_version, flexible))
    return None


def throttle_location(api_key: int, api_version: int) -> Skipper | int | None:
    return field_location(api_key, api_version, THROTTLE_FIELD)


def has_throttle_field(api_key: int, api_version: int) -> bool:
    return throttle_location(api_key, api_version) is not None


def throttle_field_offset(frame: Buffer, body_offset: int, api_key: int, api_version: int) -> int | None:
    # A broker that does not support the requested ApiVersions version answers with a v0 body.
    if (
        api_key == API_VERSIONS_KEY
        and len(frame) >= body_offset + 2
        and _INT16.unpack_from(frame, body_offset)[0] == UNSUPPORTED_VERSION
    ):
        api_version = 0
    location = throttle_location(api_key, api_version)
    if location is None:
        return None
    try:
        offset = body_offset + location if isinstance(location, int) else location(frame, body_offset)
    except _SHORT_READ as exc:
        raise ProtocolDecodeError(f"truncated response before {THROTTLE_FIELD}: {exc}") from exc
    if offset + 4 > len(frame):
        raise ProtocolDecodeError(f"response too short for {THROTTLE_FIELD} at offset {offset}")
    return offset


def read_throttle_time(frame: Buffer, body_offset: int, api_key: int, api_version: int) -> int | None:
    """ThrottleTimeMs of a response frame (without its size prefix); None if it has none."""
    offset = throttle_field_offset(frame, body_offset, api_key, api_version)
    if offset is None:
        return None
    value: int = _INT32.unpack_from(frame, offset)[0]
    return value


def patch_throttle_time(buf: bytearray, body_offset: int, api_key: int, api_version: int, value: int) -> None:
    """Overwrite ThrottleTimeMs in place (clamped to int32); a no-op for versions without it."""
    offset = throttle_field_offset(buf, body_offset, api_key, api_version)
    if offset is not None:
        _INT32.pack_into(buf, offset, max(0, min(value, MAX_THROTTLE_MS)))


def write_throttle_time(buf: bytearray, offset: int, value: int) -> None:
    """Overwrite the ThrottleTimeMs found at `offset` (clamped to int32)."""
    _INT32.pack_into(buf, offset, max(0, min(value, MAX_THROTTLE_MS)))
