"""Reading and patching ThrottleTimeMs in a response frame, in place, for any API and version.

Where the field sits comes from Kafka's own JSON response schemas (bundled with
kafka-python, reached through kqp.protocol.apis), not from a hand-written table: most
responses have it first in the body, ApiVersions has it after ErrorCode and ApiKeys,
Produce after its Responses array, and some versions have none. For each (API, version)
the fields that precede it are compiled once into a skipper: a constant offset when they
all have a fixed size, else a small walk over the variable-length ones (strings, arrays,
structs, tagged-field sections) that never decodes them. The wire rules are
kqp.protocol.schema_walk's, shared with kqp.protocol.error_codes. Produce, whose field
follows every partition and which every producer's request gets back, is walked by hand
instead (kqp.protocol.produce_response), held by a test to the compiled walk's results.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from functools import cache
from typing import Any

from kqp.protocol import produce_response
from kqp.protocol.apis import API_SPECS, PRODUCE_KEY
from kqp.protocol.errors import ProtocolDecodeError
from kqp.protocol.schema_walk import (
    SHORT_READ,
    Buffer,
    Step,
    Walker,
    field_step,
    response_layout_version,
    sequence,
    wire_fields,
)

# Re-exported: they lived here before the walking rules moved to kqp.protocol.schema_walk.
from kqp.protocol.schema_walk import UNSUPPORTED_VERSION as UNSUPPORTED_VERSION
from kqp.protocol.schema_walk import field_in_versions as field_in_versions

# Reads nothing, returns the offset just after the field(s) it stands for.
Skipper = Walker

THROTTLE_FIELD = "ThrottleTimeMs"
MAX_THROTTLE_MS = 0x7FFFFFFF

_INT32 = struct.Struct(">i")


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
    before: list[Step] = []
    for field in wire_fields(fields, api_version):
        if field["name"] == name:
            return sequence(before)
        before.append(field_step(field, api_version, flexible))
    return None


def throttle_location(api_key: int, api_version: int) -> Skipper | int | None:
    return field_location(api_key, api_version, THROTTLE_FIELD)


def throttle_field_offset(frame: Buffer, body_offset: int, api_key: int, api_version: int) -> int | None:
    if api_key == PRODUCE_KEY and produce_response.walks(api_version):
        # Every Produce response comes here, and its field follows all the partitions: a walk
        # written for Produce, in one call, instead of the generic one's call per array and
        # string (same offsets and failures; tests/unit/protocol/test_produce_response.py).
        try:
            offset = produce_response.throttle_offset(frame, body_offset, api_version)
        except SHORT_READ as exc:
            raise ProtocolDecodeError(f"truncated response before {THROTTLE_FIELD}: {exc}") from exc
        if offset + 4 > len(frame):
            raise ProtocolDecodeError(f"response too short for {THROTTLE_FIELD} at offset {offset}")
        return offset
    # A broker that does not support the requested ApiVersions version answers with a v0 body.
    api_version = response_layout_version(api_key, api_version, frame, body_offset)
    location = throttle_location(api_key, api_version)
    if location is None:
        return None
    try:
        offset = body_offset + location if isinstance(location, int) else location(frame, body_offset)
    except SHORT_READ as exc:
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
