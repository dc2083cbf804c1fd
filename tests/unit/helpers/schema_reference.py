"""The interpreted reference the generated codec is held to: kqp.protocol.schema_walk over the
JSON definitions, never the generated module itself."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kqp.protocol.apis import API_SPECS
from kqp.protocol.schema_walk import Step, field_step, sequence, wire_fields
from tests.unit.helpers.definitions import message_definition


def walked_location(api_key: int, version: int, name: str) -> Step | None:
    """The schema walk over the response fields before `name`, interpreted from the JSON
    (None: the version has no such field)."""
    spec = API_SPECS[api_key]
    fields: list[Mapping[str, Any]] = message_definition(api_key, False)["fields"]
    before: list[Step] = []
    for field in wire_fields(fields, version):
        if field["name"] == name:
            return sequence(before)
        before.append(field_step(field, version, spec.is_flexible(version)))
    return None
