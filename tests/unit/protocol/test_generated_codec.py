"""The codec generated from Kafka's JSON definitions (kqp/protocol/generated): the committed module
is what the definitions give, and every message of every version Kafka 4.3.1 defines decodes bodies
written by an independent encoder (tests/unit/helpers/schema_messages.py, which writes bytes
field by field from the same JSON) to the end, and encodes them back to the same bytes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.kafka_codegen import OUTPUT, generate
from kqp.protocol.apis import API_SPECS
from kqp.protocol.generated.kafka_messages import MESSAGES
from tests.unit.helpers.schema_messages import body_strategy

CASES = [
    (key, version, is_request)
    for key, spec in sorted(API_SPECS.items())
    for version in range(spec.min_version, spec.max_version + 1)
    for is_request in (True, False)
]


def _id(case: tuple[int, int, bool]) -> str:
    key, version, is_request = case
    return f"{API_SPECS[key].name}-v{version}-{'request' if is_request else 'response'}"


def test_the_committed_module_is_what_the_definitions_generate() -> None:
    # The CI check: a definition refreshed without `make kafka-messages`, or a hand edit, fails here.
    assert OUTPUT.read_text() == generate(), "run `make kafka-messages` (or python -m harness.kafka_codegen)"


def test_every_api_the_definitions_describe_has_both_messages() -> None:
    assert {key for key, _ in MESSAGES} == set(API_SPECS)
    assert all((key, is_request) in MESSAGES for key in API_SPECS for is_request in (True, False))


@pytest.mark.parametrize("case", CASES, ids=_id)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_decode_reads_to_the_end_and_encode_gives_the_same_bytes(
    case: tuple[int, int, bool], data: st.DataObject
) -> None:
    key, version, is_request = case
    body = data.draw(body_strategy(key, version, is_request=is_request, max_items=2))
    message, used = MESSAGES[(key, is_request)].DECODERS[version](body, 0)
    assert used == len(body)
    assert message.encode(version) == body
