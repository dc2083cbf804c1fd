"""Hypothesis strategies for message bodies, built from Kafka's JSON schemas field by field.

The bytes are written in canonical form (booleans 0/1, valid UTF-8, nulls only where the
schema allows them, tagged fields in ascending tag order and only with non-default values,
as Kafka writes them), so that the codec decodes them and, when it is right, re-encodes
exactly the same bytes. Tagged-field sections are filled with the schema's tagged fields
(NodeEndpoints, CurrentLeader, the ApiVersions features, ...) in some examples, so tests of
the code that must find them can fail.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

from kqp.protocol.apis import API_SPECS, API_VERSIONS_KEY
from kqp.protocol.schema_walk import field_in_versions
from tests.unit.helpers.definitions import message_definition

_INTEGERS = {
    "int8": (">b", -(2**7), 2**7 - 1),
    "int16": (">h", -(2**15), 2**15 - 1),
    "uint16": (">H", 0, 2**16 - 1),
    "int32": (">i", -(2**31), 2**31 - 1),
    "uint32": (">I", 0, 2**32 - 1),
    "int64": (">q", -(2**63), 2**63 - 1),
}


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length(length: int | None, flexible: bool, fixed_format: str) -> bytes:
    """A length or count prefix; None is null."""
    if flexible:
        return uvarint(0 if length is None else length + 1)
    return struct.pack(fixed_format, -1 if length is None else length)


def _blob(
    data: st.SearchStrategy[bytes], nullable: bool, flexible: bool, fixed_format: str
) -> st.SearchStrategy[bytes]:
    framed = data.map(lambda raw: _length(len(raw), flexible, fixed_format) + raw)
    if nullable:
        return st.one_of(st.just(_length(None, flexible, fixed_format)), framed)
    return framed


def _value(type_name: str, field: Mapping[str, Any], version: int, flexible: bool, nullable: bool,
           max_items: int, tags: bool = True) -> st.SearchStrategy[bytes]:
    if type_name.startswith("[]"):
        element = _value(type_name[2:], field, version, flexible, False, max_items, tags)
        items = st.lists(element, max_size=max_items).map(
            lambda parts: _length(len(parts), flexible, ">i") + b"".join(parts))
        if nullable:
            return st.one_of(st.just(_length(None, flexible, ">i")), items)
        return items
    if type_name in _INTEGERS:
        fmt, low, high = _INTEGERS[type_name]
        return st.integers(low, high).map(lambda number: struct.pack(fmt, number))
    if type_name == "bitfield":  # kafka-python's name for an int32 of authorized-operation bits
        return st.integers(-(2**31), 2**31 - 1).map(lambda number: struct.pack(">i", number))
    if type_name == "bool":
        return st.sampled_from([b"\x00", b"\x01"])
    if type_name == "float64":
        return st.floats(allow_nan=False).map(lambda number: struct.pack(">d", number))
    if type_name == "uuid":
        return st.binary(min_size=16, max_size=16)
    if type_name == "string":
        return _blob(st.text(max_size=6).map(lambda text: text.encode("utf-8")), nullable, flexible, ">h")
    if type_name in ("bytes", "records"):
        return _blob(st.binary(max_size=12), nullable, flexible, ">i")
    subfields = field.get("fields")
    if subfields is None:
        raise ValueError(f"no strategy for schema type {type_name}")
    body = struct_body(subfields, version, flexible, max_items, tags=tags)
    if nullable:
        return st.one_of(st.just(b"\xff"), body.map(lambda raw: b"\x01" + raw))
    return body


def _default_int(field: Mapping[str, Any]) -> int:
    default = field.get("default")
    return 0 if default in (None, "") else int(str(default), 0)


def _tagged_value(field: Mapping[str, Any], version: int, max_items: int) -> st.SearchStrategy[bytes]:
    """A tagged field's value, never its default (Kafka leaves default-valued tags out).
    Structs inside a tagged value carry empty tag sections, as kafka-python expects."""
    type_name = str(field["type"])
    if type_name.startswith("[]"):
        element = _value(type_name[2:], field, version, True, False, max_items, tags=False)
        return st.lists(element, min_size=1, max_size=max_items).map(
            lambda parts: uvarint(len(parts) + 1) + b"".join(parts))
    if type_name in _INTEGERS:
        fmt, low, high = _INTEGERS[type_name]
        default = _default_int(field)
        return st.integers(low, high).filter(lambda n: n != default).map(lambda n: struct.pack(fmt, n))
    if type_name == "bool":
        return st.just(b"\x00" if str(field.get("default", "false")) == "true" else b"\x01")
    if type_name == "string":
        return _blob(st.text(min_size=1, max_size=6).map(lambda text: text.encode("utf-8")), False, True, ">h")
    if type_name == "uuid":
        return st.binary(min_size=16, max_size=16).filter(lambda raw: raw != bytes(16))
    return _value(type_name, field, version, True, False, max_items, tags=False)


def _tag_section(fields: list[Mapping[str, Any]], version: int, max_items: int) -> st.SearchStrategy[bytes]:
    tagged = sorted(
        (f for f in fields
         if field_in_versions(f, "versions", version) and field_in_versions(f, "taggedVersions", version)),
        key=lambda f: int(f["tag"]))
    if not tagged:
        return st.just(b"\x00")
    present = [
        st.one_of(st.none(), _tagged_value(f, version, max_items).map(
            lambda raw, tag=int(f["tag"]): uvarint(tag) + uvarint(len(raw)) + raw))
        for f in tagged
    ]

    def section(values: tuple[bytes | None, ...]) -> bytes:
        chosen = [v for v in values if v is not None]
        return uvarint(len(chosen)) + b"".join(chosen)

    return st.tuples(*present).map(section)


def struct_body(fields: list[Mapping[str, Any]], version: int, flexible: bool, max_items: int = 2,
                overrides: Mapping[str, st.SearchStrategy[bytes]] | None = None,
                tags: bool = True) -> st.SearchStrategy[bytes]:
    """Bytes of a struct; `overrides` replaces the strategy of named fields of this level.
    With `tags` false its tagged-field section (and those of the structs inside) is empty."""
    overrides = overrides or {}
    parts = [
        overrides[f["name"]] if f["name"] in overrides else _value(
            str(f["type"]), f, version, flexible, field_in_versions(f, "nullableVersions", version), max_items,
            tags)
        for f in fields
        if field_in_versions(f, "versions", version) and not field_in_versions(f, "taggedVersions", version)
    ]
    if flexible:
        parts.append(_tag_section(fields, version, max_items) if tags else st.just(b"\x00"))
    return st.tuples(*parts).map(b"".join)


def body_strategy(api_key: int, version: int, *, is_request: bool, max_items: int = 2,
                  overrides: Mapping[str, st.SearchStrategy[bytes]] | None = None) -> st.SearchStrategy[bytes]:
    spec = API_SPECS[api_key]
    if not is_request and api_key == API_VERSIONS_KEY and version > 0:
        # Any error turns the body into v0 (kafka-python decodes it so); keep the version's own form.
        overrides = {"ErrorCode": st.just(b"\x00\x00"), **(overrides or {})}
    fields = message_definition(api_key, is_request)["fields"]
    return struct_body(fields, version, spec.is_flexible(version), max_items, overrides)


def every_version(api_key: int) -> list[tuple[int, int]]:
    spec = API_SPECS[api_key]
    return [(api_key, version) for version in range(spec.min_version, spec.max_version + 1)]
