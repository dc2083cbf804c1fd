"""kafka-python's JSON-driven codec, compiled from kqp's bundled definitions: a second, independent
decoder that tests hold kqp's generated codec and schema walks to. It reaches into kafka-python
3.0.12's internals (`_struct`, its tagged-field sections), which is why it lives with the tests
and not in kqp.

`KafkaMessage` compiles a definition without registering the class as kafka-python's own
response class; `keep_unknown_tags` gives its structs tagged-field sections that write unknown
tags back as the same bytes (kafka-python decodes them, then drops them when it encodes).
"""

from __future__ import annotations

from functools import cache
from types import MethodType
from typing import Any

from kafka.protocol.api_message import ApiMessage, ApiMessageData
from kafka.protocol.schemas import BaseField
from kafka.protocol.schemas.fields.codecs.tagged_fields import TaggedFields
from kafka.protocol.schemas.fields.codecs.types import UnsignedVarInt32

from tests.unit.helpers.definitions import DEFINITIONS_PACKAGE


class KafkaMessage(ApiMessage, init=False):  # type: ignore[misc,call-arg]
    """Base of the codec classes compiled from the bundled definitions.

    kafka-python's own message classes register themselves as the response class of their
    API key (its client decodes with them); ours must not replace them, so this repeats
    ApiMessage's set-up without the registration.
    """

    # Placeholder that lets ApiMessage's own subclass hook accept this abstract base.
    _json = {"name": "KafkaMessage", "type": "request", "validVersions": "none", "flexibleVersions": "none"}

    def __init_subclass__(cls, **kw: Any) -> None:
        if "_json" not in cls.__dict__:  # versioned views (cls[3]) inherit everything
            super(ApiMessage, cls).__init_subclass__(**kw)
            return
        super(ApiMessage, cls).__init_subclass__(**kw)
        cls._flexible_versions = BaseField.parse_versions(cls._json["flexibleVersions"])
        cls._valid_versions = BaseField.parse_versions(cls._json["validVersions"])


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


@cache
def message_class(name: str) -> Any:
    """kafka-python's codec class for one bundled definition (e.g. "MetadataResponse")."""
    cls = ApiMessageData(name, (KafkaMessage,), {"__module__": __name__}, load_json=DEFINITIONS_PACKAGE)
    keep_unknown_tags(cls._struct)
    return cls


def decode(name: str, version: int, flexible: bool, body: bytes) -> tuple[dict[str, Any], int]:
    """A body decoded by kafka-python: its raw dict form (fields of this version only) and the
    bytes it used."""
    cls = message_class(name)
    decoder = cls._struct.compiled_decode_from(version, compact=flexible, tagged=flexible, data_class=cls)
    message, used = decoder(memoryview(body), 0)
    message._version = version
    return message.to_dict(json=False), int(used)
