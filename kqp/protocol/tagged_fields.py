"""Tagged-field sections that survive decode and re-encode unchanged.

kafka-python decodes tags it has no schema for into `unknown_tags` but drops them when it
encodes. A rewritten response must not lose what a newer broker added, so the codec classes
get sections that write unknown tags back as the same bytes, merged with the known ones
(written, as Kafka writes them, when they differ from their default) in ascending tag order.
"""

from __future__ import annotations

from types import MethodType
from typing import Any

from kafka.protocol.schemas.fields.codecs.tagged_fields import TaggedFields
from kafka.protocol.schemas.fields.codecs.types import UnsignedVarInt32


class PreservingTaggedFields(TaggedFields):  # type: ignore[misc]
    def _entries(self, item: Any, version: int | None) -> list[tuple[int, bytes]]:
        entries: list[tuple[int, bytes]] = []
        for name, field in self._names.items():
            if not hasattr(item, name):
                continue
            value = getattr(item, name)
            if value != field.default:
                # Struct tags carry an empty nested section (tagged=None), as in kafka-python.
                entries.append((field.tag, bytes(field.encode(value, version=version, compact=True, tagged=None))))
        for key, raw in (getattr(item, "unknown_tags", None) or {}).items():
            entries.append((int(key.lstrip("_")), bytes(raw)))
        entries.sort(key=lambda entry: entry[0])
        return entries

    def encode(self, item: Any, version: int | None = None) -> bytes:
        if isinstance(item, dict):
            return bytes(super().encode(item, version=version))
        parts = [UnsignedVarInt32.encode(len(entries := self._entries(item, version)))]
        for tag, raw in entries:
            parts += [UnsignedVarInt32.encode(tag), UnsignedVarInt32.encode(len(raw)), raw]
        return b"".join(parts)

    def encode_into(self, item: Any, out: Any, version: int | None = None) -> None:
        data = self.encode(item, version=version)
        out.ensure(len(data))
        out.buf[out.pos : out.pos + len(data)] = data
        out.pos += len(data)


def _preserving_tagged_fields(struct: Any, version: int) -> TaggedFields:
    cache: dict[int, TaggedFields] = struct._tagged_fields_cache
    if version not in cache:
        cache[version] = PreservingTaggedFields(
            [f for f in struct._fields if f.for_version_q(version) and f.tagged_field_q(version)])
    return cache[version]


def keep_unknown_tags(struct: Any) -> None:
    """Give a kafka-python StructField (and every struct inside it) preserving tag sections."""
    struct.tagged_fields = MethodType(_preserving_tagged_fields, struct)
    for field in struct._fields or ():
        if field.is_struct():
            keep_unknown_tags(field)
        elif field.is_struct_array():
            keep_unknown_tags(field.array_of)
