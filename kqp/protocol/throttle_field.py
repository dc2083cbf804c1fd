"""Reading and patching ThrottleTimeMs in a response frame, in place, for any API and version.

Where the field sits is generated from Kafka's own JSON response schemas
(kqp.protocol.generated.walks, by harness/kafka_codegen.py), not written by hand: most responses have
it first in the body, ApiVersions has it after ErrorCode and ApiKeys, Produce after its
Responses array, and some versions have none. For each (API, version) the generator emits a
constant offset when every field before it has a fixed size, else a straight-line skipper
over the variable-length ones (strings, arrays, structs, tagged-field sections) that never
decodes them. Produce's, which every producer's request gets back, is one of them: it walks
every topic and partition in one function, one-byte varints read inline.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from kqp.protocol.apis import API_VERSIONS_KEY, FIELD_LOCATIONS, THROTTLE_TIME_MS, response_layout_version

# Re-exported: they lived here once.
from kqp.protocol.apis import UNSUPPORTED_VERSION as UNSUPPORTED_VERSION
from kqp.protocol.errors import ProtocolDecodeError

Buffer = bytes | bytearray | memoryview
# Reads nothing but lengths and counts; returns the offset of the field from the body's offset.
Skipper = Callable[[Buffer, int], int]

THROTTLE_FIELD = "ThrottleTimeMs"
MAX_THROTTLE_MS = 0x7FFFFFFF

_INT32 = struct.Struct(">i")
# What a skipper raises when the bytes end early (besides ProtocolDecodeError).
_SHORT_READ = (struct.error, IndexError)
_NONE: dict[int, Any] = {}


def field_location(api_key: int, api_version: int, name: str) -> Skipper | int | None:
    """How to reach a top-level response field from the start of the body: a constant offset,
    a skipper over the fields before it, or None when this version has no such field (or the
    definitions do not describe the version: its layout is then unknown). The fields are
    ThrottleTimeMs and those harness/kafka_codegen.py's LOCATED_FIELDS lists."""
    if name == THROTTLE_FIELD:
        return throttle_location(api_key, api_version)
    location: Skipper | int | None = FIELD_LOCATIONS[api_key].get(name, _NONE).get(api_version)
    return location


def throttle_location(api_key: int, api_version: int) -> Skipper | int | None:
    location: Skipper | int | None = THROTTLE_TIME_MS[api_key].get(api_version)
    return location


def throttle_field_offset(frame: Buffer, body_offset: int, api_key: int, api_version: int) -> int | None:
    if api_key == API_VERSIONS_KEY:
        # A broker that does not support the requested ApiVersions version answers with a v0 body.
        api_version = response_layout_version(api_key, api_version, frame, body_offset)
    location = THROTTLE_TIME_MS[api_key].get(api_version)
    if location is None:
        return None
    if location.__class__ is int:
        offset: int = body_offset + location
    else:
        try:
            offset = location(frame, body_offset)
        except _SHORT_READ as exc:
            raise ProtocolDecodeError(f"truncated response before {THROTTLE_FIELD}: {exc}") from exc
    if offset + 4 > len(frame):
        raise ProtocolDecodeError(f"response too short for {THROTTLE_FIELD} at offset {offset}")
    return offset


def read_throttle_time(frame: Buffer, body_offset: int, api_key: int, api_version: int) -> int | None:
    """ThrottleTimeMs of a response frame (without its size prefix); None if it has none."""
    offset = throttle_field_offset(frame, body_offset, api_key, api_version)
    return None if offset is None else read_throttle_time_at(frame, offset)


def patch_throttle_time(buf: bytearray, body_offset: int, api_key: int, api_version: int, value: int) -> None:
    """Overwrite ThrottleTimeMs in place (clamped to int32); a no-op for versions without it."""
    offset = throttle_field_offset(buf, body_offset, api_key, api_version)
    if offset is not None:
        _INT32.pack_into(buf, offset, max(0, min(value, MAX_THROTTLE_MS)))


def read_throttle_time_at(frame: Buffer, offset: int) -> int:
    """The ThrottleTimeMs found at `offset` (by throttle_field_offset)."""
    value: int = _INT32.unpack_from(frame, offset)[0]
    return value


def write_throttle_time(buf: bytearray, offset: int, value: int) -> None:
    """Overwrite the ThrottleTimeMs found at `offset` (clamped to int32)."""
    _INT32.pack_into(buf, offset, max(0, min(value, MAX_THROTTLE_MS)))
