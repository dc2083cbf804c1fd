"""Kafka's JSON message definitions as the tests read them: the independent second source the
generated codec is held to (the proxy itself reads only the code generated from them)."""

from __future__ import annotations

import importlib.resources
import json
import re
from functools import cache
from typing import Any

from kqp.protocol.apis import API_SPECS

DEFINITIONS_PACKAGE = "kqp.protocol.kafka_message_definitions"
# Kafka's definitions are JSON with // comments (the license header, notes on fields), which
# the json module does not accept: whole-line comments are removed before parsing.
_COMMENT = re.compile(r"(?m)^\s*//.*\n?")


def read_definition(name: str) -> dict[str, Any]:
    """One bundled definition as written (e.g. "MetadataResponse")."""
    text = importlib.resources.files(DEFINITIONS_PACKAGE).joinpath(f"{name}.json").read_text()
    definition: dict[str, Any] = json.loads(_COMMENT.sub("", text))
    return definition


@cache
def message_definition(api_key: int, is_request: bool) -> dict[str, Any]:
    """An API's request or response definition with every use of a common struct given that
    struct's fields, so that a reader of `fields` finds every layout in place (as kafka-python's
    loader gives it)."""
    definition = read_definition(f"{API_SPECS[api_key].name}{'Request' if is_request else 'Response'}")
    common = {str(struct["name"]): struct["fields"] for struct in definition.get("commonStructs", ())}

    def resolved(fields: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for field in fields:
            struct_fields = field.get("fields") or common.get(str(field["type"]).removeprefix("[]"))
            out.append(field if struct_fields is None else {**field, "fields": resolved(struct_fields)})
        return out

    return {**definition, "fields": resolved(definition.get("fields", []))}
