"""The catalogue of Kafka APIs the proxy can decode, taken from kafka-python's bundled schemas.

kafka-python >= 3.0 ships Kafka's own JSON message specs and compiles a codec from them, so
the version ranges and flexible-version thresholds here are Kafka's, not hand-copied. An API
key missing from this table is one the proxy cannot decode: it is never advertised to clients.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from kafka.protocol.api_message import ApiMessage

API_VERSIONS_KEY = 18
PRODUCE_KEY = 0
FETCH_KEY = 1
METADATA_KEY = 3
FIND_COORDINATOR_KEY = 10
SASL_HANDSHAKE_KEY = 17
CREATE_TOPICS_KEY = 19
DELETE_TOPICS_KEY = 20
SASL_AUTHENTICATE_KEY = 36
CREATE_PARTITIONS_KEY = 37
DESCRIBE_CLUSTER_KEY = 60

_SCHEMA_MODULES = (
    "kafka.protocol.metadata",
    "kafka.protocol.admin",
    "kafka.protocol.consumer",
    "kafka.protocol.producer",
    "kafka.protocol.sasl",
)


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


@dataclass(frozen=True, slots=True)
class ApiSpec:
    key: int
    name: str
    min_version: int
    max_version: int
    first_flexible: int | None
    request_class: Any
    response_class: Any

    def is_flexible(self, version: int) -> bool:
        return self.first_flexible is not None and version >= self.first_flexible

    def request_header_version(self, version: int) -> int:
        return 2 if self.is_flexible(version) else 1

    def response_header_version(self, version: int) -> int:
        # ApiVersionsResponse keeps header v0 in every version so that a client can always
        # read the error of a version it does not support.
        if self.key == API_VERSIONS_KEY:
            return 0
        return 1 if self.is_flexible(version) else 0


def _collect_message_classes() -> dict[tuple[int, str], Any]:
    for module in _SCHEMA_MODULES:
        importlib.import_module(module)
    found: dict[tuple[int, str], Any] = {}
    pending: list[Any] = [ApiMessage]
    while pending:
        cls = pending.pop()
        subclasses: list[Any] = cls.__subclasses__()
        for sub in subclasses:
            pending.append(sub)
            if getattr(sub, "_class_version", None) is None and getattr(sub, "_json", None):
                found[(sub.API_KEY, sub.type)] = sub
    return found


def _build_catalogue() -> dict[int, ApiSpec]:
    classes = _collect_message_classes()
    catalogue: dict[int, ApiSpec] = {}
    for (key, kind), request_class in classes.items():
        if kind != "request" or (key, "response") not in classes:
            continue
        schema = request_class.json
        valid = parse_versions(schema["validVersions"])
        if valid is None:
            continue
        flexible = parse_versions(schema["flexibleVersions"])
        catalogue[key] = ApiSpec(
            key=key,
            name=str(schema["name"]).removesuffix("Request"),
            min_version=valid[0],
            max_version=valid[1],
            first_flexible=None if flexible is None else flexible[0],
            request_class=request_class,
            response_class=classes[(key, "response")],
        )
    return catalogue


API_SPECS: dict[int, ApiSpec] = _build_catalogue()


def api_name(api_key: int) -> str:
    spec = API_SPECS.get(api_key)
    return spec.name if spec is not None else f"Unknown{api_key}"
