"""Walking a message body by the layout in Kafka's JSON definitions, interpreted at run time.

The proxy no longer runs this: the code it runs is generated from the same definitions
(kqp.protocol.generated, harness/kafka_codegen.py). This interpreted walk stays as the
independent reference the tests hold the generated skippers and error-code collectors to
(tests/unit/protocol/test_generated_codec.py, test_error_codes.py, test_produce_response.py).

One set of wire rules (fixed-size types, length-prefixed strings and bytes, arrays, nullable
structs, flexible versions' compact lengths and tagged-field sections) compiled once per
(API, version) into walkers. A walker takes the buffer and an offset and returns the offset
just after what it stands for; what it reads on the way goes into its optional `found` list.
Plain skippers reach a field; walkers with `collect=True` also read every ErrorCode.

Error codes come out in the order of the codec's dict form (kafka-python's `to_dict`,
walked depth first), which is not always wire order: a struct's own ErrorCode comes before
the codes nested in it even when it follows them on the wire (Metadata v13+, OffsetFetch),
and a tagged field's codes sit where the field is declared, not at the end of the struct.
Such structs walk each code-bearing field into its own list and join them in that order.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, Protocol

from kqp.protocol.apis import UNSUPPORTED_VERSION as UNSUPPORTED_VERSION
from kqp.protocol.apis import response_layout_version as response_layout_version
from kqp.protocol.errors import ProtocolDecodeError
from kqp.protocol.fast_path import read_array_length
from kqp.protocol.headers import read_uvarint, skip_tagged_fields
from kqp.protocol.wire import SHORT_READ as SHORT_READ
from kqp.protocol.wire import tagged_field_end

Buffer = bytes | bytearray | memoryview


class Walker(Protocol):
    def __call__(self, buf: Buffer, offset: int, found: list[int] | None = None, /) -> int: ...


# A fixed number of bytes, or a walker for what varies.
Step = Walker | int

ERROR_CODE_FIELD = "ErrorCode"
FIXED_SIZES = {
    "bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "float64": 8, "uuid": 16,
    "bitfield": 4,  # kafka-python renames some int32 authorized-operations fields so
}
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


def parse_versions(text: str) -> tuple[int, int] | None:
    """Kafka's version-range syntax: "none", "N", "N+" or "N-M"."""
    text = text.strip()
    if text == "none":
        return None
    if text.endswith("+"):
        return int(text[:-1]), 32767
    if "-" in text:
        low, high = text.split("-")
        return int(low), int(high)
    return int(text), int(text)


def field_in_versions(field: Mapping[str, Any], key: str, version: int) -> bool:
    text = field.get(key)
    if text is None:
        return False
    bounds = parse_versions(str(text))
    return bounds is not None and bounds[0] <= version <= bounds[1]


def wire_fields(fields: Iterable[Mapping[str, Any]], version: int) -> list[Mapping[str, Any]]:
    """Fields written in order at this version (tagged ones go in the trailing section)."""
    return [
        f for f in fields
        if field_in_versions(f, "versions", version) and not field_in_versions(f, "taggedVersions", version)
    ]


def advance(step: Step, buf: Buffer, offset: int, found: list[int] | None = None) -> int:
    return offset + step if isinstance(step, int) else step(buf, offset, found)


def _is_error_code(field: Mapping[str, Any]) -> bool:
    return bool(field["name"] == ERROR_CODE_FIELD and field["type"] == "int16")


def carries_error_code(field: Mapping[str, Any], version: int) -> bool:
    """Whether the field is, or contains at some depth, an ErrorCode present at this version."""
    if not field_in_versions(field, "versions", version):
        return False
    return _is_error_code(field) or any(carries_error_code(f, version) for f in field.get("fields") or ())


def _read_error_code(buf: Buffer, offset: int, found: list[int] | None = None) -> int:
    code: int = _INT16.unpack_from(buf, offset)[0]
    if code and found is not None:
        found.append(code)
    return offset + 2


def _length_prefixed(length_size: int, flexible: bool) -> Walker:
    """A string (int16 length) or bytes/records (int32 length); -1 means null."""
    unpack = _INT16.unpack_from if length_size == 2 else _INT32.unpack_from

    def skip(buf: Buffer, offset: int, found: list[int] | None = None) -> int:
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


def _array(element: Step | _Plain, flexible: bool) -> Walker:
    if isinstance(element, _Plain) and isinstance(element.step(), int):
        element = element.step()  # a struct of fixed-size fields only
    if isinstance(element, int):
        size = element

        def skip_fixed(buf: Buffer, offset: int, found: list[int] | None = None) -> int:
            if flexible and 0 < buf[offset] < 0x80:
                # A one-byte compact count (nearly all of them), read inline: these arrays of
                # int32 (replicas, ISR) are the bulk of a Metadata walk. A count past the end
                # leaves the offset past the end, which every caller checks.
                return offset + 1 + (buf[offset] - 1) * size
            count, offset = read_array_length(buf, offset, flexible)
            return offset + count * size

        return skip_fixed

    if isinstance(element, _Plain):
        # The element's steps run inline: one call less per element of the big arrays.
        pairs, tail, tagged = element.pairs, element.tail, element.tagged

        def walk_structs(buf: Buffer, offset: int, found: list[int] | None = None) -> int:
            count, offset = read_array_length(buf, offset, flexible)
            for _ in range(count):
                for fixed, step in pairs:
                    offset = step(buf, offset + fixed, found)
                offset += tail
                if tagged:
                    offset = skip_tagged_fields(buf, offset)
            return offset

        return walk_structs

    walker = element

    def walk(buf: Buffer, offset: int, found: list[int] | None = None) -> int:
        count, offset = read_array_length(buf, offset, flexible)
        for _ in range(count):
            offset = walker(buf, offset, found)
        return offset

    return walk


def sequence(steps: list[Step]) -> Step:
    """Fields one after the other; a plain int when nothing varies."""
    return _Plain.of(steps, tagged=False).step()


class _Plain(NamedTuple):
    """A struct walked field after field in wire order, then its tagged-field section if
    `tagged`. Fixed sizes are folded into the next walker's offset (`pairs`) or the `tail`,
    so the loop over the fields tests no types."""

    pairs: tuple[tuple[int, Walker], ...]
    tail: int
    tagged: bool

    @classmethod
    def of(cls, steps: Iterable[Step], tagged: bool) -> _Plain:
        pairs: list[tuple[int, Walker]] = []
        fixed = 0
        for step in steps:
            if isinstance(step, int):
                fixed += step
            else:
                pairs.append((fixed, step))
                fixed = 0
        return cls(tuple(pairs), fixed, tagged)

    def step(self) -> Step:
        pairs, tail, tagged = self.pairs, self.tail, self.tagged
        if not tagged and not pairs:
            return tail
        if not tagged and len(pairs) == 1 and pairs[0][0] == 0 and tail == 0:
            return pairs[0][1]

        def walk(buf: Buffer, offset: int, found: list[int] | None = None) -> int:
            for fixed, step in pairs:
                offset = step(buf, offset + fixed, found)
            offset += tail
            return skip_tagged_fields(buf, offset) if tagged else offset

        return walk


def _reordered(
    plan: list[tuple[Step, int | None]], tagged: Mapping[int, tuple[Step, int]] | None, slots: int
) -> Walker:
    """A struct whose codes are not in wire order: each code-bearing field (slot) walks into its
    own list, joined in declaration order at the end; slot None marks a field without codes.
    `tagged` (flexible versions) maps the code-bearing tags to their step and slot."""
    steps = tuple(plan)

    def walk(buf: Buffer, offset: int, found: list[int] | None = None) -> int:
        parts: list[list[int]] = [[] for _ in range(slots)]
        for step, slot in steps:
            offset = advance(step, buf, offset, None if slot is None else parts[slot])
        if tagged is not None:
            offset = _walk_tagged_section(tagged, parts, buf, offset)
        if found is not None:
            for part in parts:
                found.extend(part)
        return offset

    return walk


def _walk_tagged_section(
    tagged: Mapping[int, tuple[Step, int]], parts: list[list[int]], buf: Buffer, offset: int
) -> int:
    """Walk the listed tags of a tagged-field section (each bounded by its size), skip the rest."""
    count, offset = read_uvarint(buf, offset)
    for _ in range(count):
        tag, offset, end = tagged_field_end(buf, offset)
        entry = tagged.get(tag)
        if entry is not None:
            step, slot = entry
            if advance(step, memoryview(buf)[:end], offset, parts[slot]) > end:
                raise ProtocolDecodeError(f"tagged field {tag} runs past its size")
        offset = end
    return offset


def struct_step(fields: Iterable[Mapping[str, Any]], version: int, flexible: bool, collect: bool) -> Step:
    struct = _struct(fields, version, flexible, collect)
    return struct.step() if isinstance(struct, _Plain) else struct


def _struct(fields: Iterable[Mapping[str, Any]], version: int, flexible: bool, collect: bool) -> _Plain | Walker:
    fields = [f for f in fields if field_in_versions(f, "versions", version)]
    wire = wire_fields(fields, version)
    steps = [field_step(f, version, flexible, collect) for f in wire]
    plain = _Plain.of(steps, tagged=flexible)
    if not collect:
        return plain
    # Slots in the order the codec's dict form lists the codes: own ErrorCode, then the other
    # code-bearing fields as declared (tagged ones included).
    bearing = sorted((f for f in fields if carries_error_code(f, version)), key=lambda f: not _is_error_code(f))
    slot_of = {id(f): slot for slot, f in enumerate(bearing)}
    on_wire = {id(f) for f in wire}
    tagged = {
        int(f["tag"]): (field_step(f, version, flexible, collect), slot_of[id(f)])
        for f in bearing if id(f) not in on_wire
    }
    if not tagged and [f for f in wire if id(f) in slot_of] == bearing:
        return plain  # wire order is already the dict order: append as we go
    plan: list[tuple[Step, int | None]] = [(step, slot_of.get(id(f))) for f, step in zip(wire, steps, strict=True)]
    return _reordered(plan, tagged if flexible else None, len(bearing))


def _type_step(
    type_name: str, subfields: list[Mapping[str, Any]] | None, version: int, flexible: bool, collect: bool
) -> Step:
    if type_name.startswith("[]"):
        element = type_name[2:]
        if subfields is not None and element not in FIXED_SIZES:
            return _array(_struct(subfields, version, flexible, collect), flexible)
        return _array(_type_step(element, subfields, version, flexible, collect), flexible)
    if type_name in FIXED_SIZES:
        return FIXED_SIZES[type_name]
    if type_name == "string":
        return _length_prefixed(2, flexible)
    if type_name in ("bytes", "records"):
        return _length_prefixed(4, flexible)
    if subfields is not None:
        return struct_step(subfields, version, flexible, collect)
    raise ValueError(f"schema type {type_name!r} has no known wire form")


def field_step(field: Mapping[str, Any], version: int, flexible: bool, collect: bool = False) -> Step:
    """How to walk one field; with `collect`, code-bearing fields also read their ErrorCodes."""
    if collect and _is_error_code(field):
        return _read_error_code
    collect = collect and carries_error_code(field, version)
    inner = _type_step(str(field["type"]), field.get("fields"), version, flexible, collect)
    is_struct = not str(field["type"]).startswith("[]") and "fields" in field
    if is_struct and field_in_versions(field, "nullableVersions", version):
        # A nullable struct is preceded by an int8: -1 for null, 1 when present.
        def walk_nullable(buf: Buffer, offset: int, found: list[int] | None = None) -> int:
            if offset >= len(buf):
                raise ProtocolDecodeError("truncated nullable struct")
            if buf[offset] == 0xFF:
                return offset + 1
            return advance(inner, buf, offset + 1, found)

        return walk_nullable
    return inner
