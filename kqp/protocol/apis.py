"""The catalogue of Kafka APIs, read from Kafka's own JSON message definitions.

The definitions are Kafka 4.3.1's (kqp/protocol/kafka_message_definitions, copied from the
kafka-clients jar); the codec is generated from them (kqp/protocol/generated, by
harness/kafka_codegen.py), so version ranges, flexible versions and field layouts are the
brokers', not hand-copied. A key or
version missing here is not an error: the proxy forwards what it does not need to read as
opaque bytes. Only the APIs in `DECODED_APIS` must be readable, and only they are capped in
the ApiVersions answer.
"""

from __future__ import annotations

import importlib.resources
import json
import re
import struct
from dataclasses import dataclass
from functools import cache
from typing import Any

from kqp.protocol.api_keys import ApiKey
from kqp.protocol.errors import UnsupportedApiError
from kqp.protocol.generated import kafka_messages
from kqp.protocol.wire import Message

# The names the protocol code uses; the values are kqp.protocol.api_keys.ApiKey's.
API_VERSIONS_KEY = ApiKey.API_VERSIONS
PRODUCE_KEY = ApiKey.PRODUCE
FETCH_KEY = ApiKey.FETCH
METADATA_KEY = ApiKey.METADATA
FIND_COORDINATOR_KEY = ApiKey.FIND_COORDINATOR
SASL_HANDSHAKE_KEY = ApiKey.SASL_HANDSHAKE
CREATE_TOPICS_KEY = ApiKey.CREATE_TOPICS
DELETE_TOPICS_KEY = ApiKey.DELETE_TOPICS
SASL_AUTHENTICATE_KEY = ApiKey.SASL_AUTHENTICATE
CREATE_PARTITIONS_KEY = ApiKey.CREATE_PARTITIONS
DESCRIBE_CLIENT_QUOTAS_KEY = ApiKey.DESCRIBE_CLIENT_QUOTAS
ALTER_CLIENT_QUOTAS_KEY = ApiKey.ALTER_CLIENT_QUOTAS
DESCRIBE_QUORUM_KEY = ApiKey.DESCRIBE_QUORUM
DESCRIBE_CLUSTER_KEY = ApiKey.DESCRIBE_CLUSTER
SHARE_FETCH_KEY = ApiKey.SHARE_FETCH
SHARE_ACKNOWLEDGE_KEY = ApiKey.SHARE_ACKNOWLEDGE

# What the proxy itself reads or writes: responses with broker addresses, the requests quotas
# act on (byte rates, partition mutations), the quota admin APIs it answers, SASL (for the
# principal) and ApiVersions. Every other API is forwarded without being decoded.
DECODED_APIS = frozenset({
    API_VERSIONS_KEY, PRODUCE_KEY, FETCH_KEY, METADATA_KEY, FIND_COORDINATOR_KEY, DESCRIBE_CLUSTER_KEY,
    DESCRIBE_QUORUM_KEY, SHARE_FETCH_KEY, SHARE_ACKNOWLEDGE_KEY, CREATE_TOPICS_KEY, DELETE_TOPICS_KEY,
    CREATE_PARTITIONS_KEY, DESCRIBE_CLIENT_QUOTAS_KEY, ALTER_CLIENT_QUOTAS_KEY, SASL_HANDSHAKE_KEY,
    SASL_AUTHENTICATE_KEY,
})

DEFINITIONS_PACKAGE = "kqp.protocol.kafka_message_definitions"
# Kafka's definitions are JSON with // comments (the license header, notes on fields), which
# the json module does not accept: whole-line comments are removed before parsing.
_COMMENT = re.compile(r"(?m)^\s*//.*\n?")


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


def _read_definition(name: str) -> dict[str, Any]:
    text = importlib.resources.files(DEFINITIONS_PACKAGE).joinpath(f"{name}.json").read_text()
    definition: dict[str, Any] = json.loads(_COMMENT.sub("", text))
    return definition


@cache
def message_class(name: str) -> type[Message]:
    """The generated codec class of one bundled definition (e.g. "MetadataResponse"), with its
    definition as `json` (what the tests' schema-driven encoder reads)."""
    cls: type[Message] = getattr(kafka_messages, name)
    cls.json = _with_common_structs(_read_definition(name))
    return cls


def _with_common_structs(definition: dict[str, Any]) -> dict[str, Any]:
    """The definition with every use of a common struct given that struct's fields, so that a
    reader of `fields` finds every layout in place (as kafka-python's loader gives it)."""
    common = {str(struct["name"]): struct["fields"] for struct in definition.get("commonStructs", ())}

    def resolved(fields: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for field in fields:
            struct_fields = field.get("fields") or common.get(str(field["type"]).removeprefix("[]"))
            out.append(field if struct_fields is None else {**field, "fields": resolved(struct_fields)})
        return out

    return {**definition, "fields": resolved(definition.get("fields", []))}


@dataclass(frozen=True, slots=True)
class ApiSpec:
    """One API as the bundled definitions describe it: the versions a broker of that release
    accepts (validVersions) and the first flexible version (KIP-482: compact strings and
    arrays, tagged fields, request header v2 and response header v1)."""

    key: int
    name: str
    min_version: int
    max_version: int
    first_flexible: int | None

    def is_flexible(self, version: int) -> bool:
        return self.first_flexible is not None and version >= self.first_flexible

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def response_header_version(self, version: int) -> int:
        """0 (correlation id only) or 1 (with a tagged-field section) for this version."""
        # ApiVersionsResponse keeps header v0 in every version so that a client can always
        # read the error of a version it does not support.
        if self.key == API_VERSIONS_KEY:
            return 0
        return 1 if self.is_flexible(version) else 0

    @property
    def request_class(self) -> Any:
        return message_class(f"{self.name}Request")

    @property
    def response_class(self) -> Any:
        return message_class(f"{self.name}Response")


def _build_catalogue() -> dict[int, ApiSpec]:
    catalogue: dict[int, ApiSpec] = {}
    for entry in importlib.resources.files(DEFINITIONS_PACKAGE).iterdir():
        if not entry.name.endswith("Request.json"):
            continue
        request = _read_definition(entry.name.removesuffix(".json"))
        valid = parse_versions(str(request["validVersions"]))
        if valid is None:  # removed APIs (LeaderAndIsr, ...) keep a stub definition
            continue
        flexible = parse_versions(str(request["flexibleVersions"]))
        key = int(request["apiKey"])
        catalogue[key] = ApiSpec(
            key=key,
            name=str(request["name"]).removesuffix("Request"),
            min_version=valid[0],
            max_version=valid[1],
            first_flexible=None if flexible is None else flexible[0],
        )
    return dict(sorted(catalogue.items()))


API_SPECS: dict[int, ApiSpec] = _build_catalogue()


def supported_spec(api_key: int, api_version: int) -> ApiSpec:
    """The definition of an API whose version the definitions describe (raises UnsupportedApiError)."""
    spec = API_SPECS.get(api_key)
    if spec is None:
        raise UnsupportedApiError(f"unknown API key {api_key}")
    if not spec.supports(api_version):
        raise UnsupportedApiError(
            f"{spec.name} v{api_version} is outside the known range {spec.min_version}-{spec.max_version}")
    return spec


def can_decode(api_key: int, api_version: int) -> bool:
    spec = API_SPECS.get(api_key)
    return spec is not None and spec.supports(api_version)


def api_name(api_key: int) -> str:
    spec = API_SPECS.get(api_key)
    return spec.name if spec is not None else f"Unknown{api_key}"


# Kafka's Errors.UNSUPPORTED_VERSION.
UNSUPPORTED_VERSION = 35
_INT16 = struct.Struct(">h")


def response_layout_version(api_key: int, api_version: int, buf: bytes | bytearray | memoryview,
                            body_offset: int) -> int:
    """The version whose layout a response body has: a broker that does not support the
    requested ApiVersions version answers UNSUPPORTED_VERSION with a v0 body."""
    if (
        api_key == API_VERSIONS_KEY
        and len(buf) >= body_offset + 2
        and _INT16.unpack_from(buf, body_offset)[0] == UNSUPPORTED_VERSION
    ):
        return 0
    return api_version
