"""The codec generated from Kafka's JSON definitions (kqp/protocol/generated).

- The committed module is what the definitions give (the CI check).
- Every message of every version Kafka 4.3.1 defines decodes bodies written by an independent
  encoder (tests/unit/helpers/schema_messages.py, which writes bytes field by field from the
  same JSON) to the end, to the values a second decoder (kafka-python's) reads, and encodes
  them back to the same bytes.
- The generated skippers find ThrottleTimeMs (and ShareFetch's NodeEndpoints), and the
  generated collectors read the error codes, where and as the interpreted schema walk
  (kqp.protocol.schema_walk) does, and fail where it fails, on those bodies and on mutants.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.kafka_codegen import OUTPUT, generate
from kqp.protocol.apis import API_SPECS
from kqp.protocol.error_codes import collect_error_codes, error_code_walker
from kqp.protocol.errors import ProtocolError
from kqp.protocol.generated.kafka_messages import MESSAGES
from kqp.protocol.schema_walk import SHORT_READ, Step, struct_step
from kqp.protocol.throttle_field import field_location
from kqp.protocol.wire import ZERO_UUID
from tests.unit.helpers import kafka_python_codec
from tests.unit.helpers.schema_messages import body_strategy, struct_body
from tests.unit.helpers.schema_reference import walked_location
from tests.unit.protocol.test_error_codes import _SYNTHETIC
from tests.unit.protocol.test_fuzz import mutate

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
    # The values are those a second, independent decoder reads (kafka-python's).
    name = f"{API_SPECS[key].name}{'Request' if is_request else 'Response'}"
    theirs, their_used = kafka_python_codec.decode(name, version, API_SPECS[key].is_flexible(version), body)
    assert their_used == used
    _assert_same_values(theirs, message.to_dict())


def _assert_same_values(theirs: Any, ours: Any, path: str = "") -> None:
    """Every field kafka-python reads (those of this version) has the same value in ours.
    kafka-python reads an all-zero uuid as None; we read Kafka's Uuid.ZERO_UUID, as Kafka does."""
    if isinstance(theirs, dict):
        for name, value in theirs.items():
            assert name in ours, f"{path}.{name}"
            _assert_same_values(value, ours[name], f"{path}.{name}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), path
        for index, (their_item, our_item) in enumerate(zip(theirs, ours, strict=True)):
            _assert_same_values(their_item, our_item, f"{path}[{index}]")
    elif theirs is None and ours == ZERO_UUID:
        pass
    else:
        assert theirs == ours, (path, theirs, ours)


ERROR = "error"
LOCATED = [
    (key, version, name)
    for key, spec in sorted(API_SPECS.items())
    for version in range(spec.min_version, spec.max_version + 1)
    for name in ("ThrottleTimeMs", "NodeEndpoints")
    if name == "ThrottleTimeMs" or spec.name in ("ShareFetch", "ShareAcknowledge")
]


def _outcome(location: Step | Callable[[bytes, int], int], frame: bytes, offset: int, width: int) -> int | str:
    """Where the field is, or ERROR when it cannot be read (what throttle_field_offset reports);
    `width` is the least the field takes (4 for ThrottleTimeMs, 1 for an array's count)."""
    try:
        found = offset + location if isinstance(location, int) else location(frame, offset)
    except (ProtocolError, *SHORT_READ):
        return ERROR
    return found if found + width <= len(frame) else ERROR


@pytest.mark.parametrize("case", LOCATED, ids=lambda case: f"{API_SPECS[case[0]].name}-v{case[1]}-{case[2]}")
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_the_generated_skipper_finds_the_field_where_the_schema_walk_does(
    case: tuple[int, int, str], data: st.DataObject, seed: int
) -> None:
    api_key, version, name = case
    generated, walked = field_location(api_key, version, name), walked_location(api_key, version, name)
    assert (generated is None) == (walked is None)
    if generated is None or walked is None:
        return
    assert isinstance(generated, int) == isinstance(walked, int)
    body = data.draw(body_strategy(api_key, version, is_request=False, max_items=3))
    frame = b"\x00\x00\x00\x07" + body
    width = 4 if name == "ThrottleTimeMs" else 1
    expected = _outcome(walked, frame, 4, width)
    assert expected != ERROR
    assert _outcome(generated, frame, 4, width) == expected
    rng = random.Random(seed)
    for _ in range(20):
        broken = mutate(frame, rng)
        assert _outcome(generated, broken, 4, width) == _outcome(walked, broken, 4, width), broken.hex()


RESPONSES = [(key, version) for key, spec in sorted(API_SPECS.items())
             for version in range(spec.min_version, spec.max_version + 1)]


def _codes(walk: Any, body: bytes) -> tuple[int, list[int]] | str:
    """Where a walk ends and the codes it read, or ERROR when the body cannot be walked."""
    found: list[int] = []
    try:
        end = walk if isinstance(walk, int) else walk(body, 0, found)
    except (ProtocolError, *SHORT_READ):
        return ERROR
    return (end, found) if end <= len(body) else ERROR


@pytest.mark.parametrize("pair", RESPONSES, ids=lambda pair: f"{API_SPECS[pair[0]].name}-v{pair[1]}")
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_the_generated_collector_reads_the_codes_the_schema_walk_reads(
    pair: tuple[int, int], data: st.DataObject, seed: int
) -> None:
    api_key, version = pair
    spec = API_SPECS[api_key]
    walked = struct_step(spec.response_class.json["fields"], version, spec.is_flexible(version), collect=True)
    generated = error_code_walker(api_key, version)
    body = data.draw(body_strategy(api_key, version, is_request=False, max_items=3))
    expected = _codes(walked, body)
    assert expected != ERROR and expected[0] == len(body)
    assert _codes(generated, body) == expected
    rng = random.Random(seed)
    for _ in range(20):
        broken = mutate(body, rng)
        assert _codes(generated, broken) == _codes(walked, broken), broken.hex()


def _generated_from(definition: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """The module the generator writes for one made-up definition, loaded."""
    (tmp / f"{definition['name']}.json").write_text(json.dumps(definition))
    (tmp / "KAFKA_VERSION").write_text("test\n")
    namespace: dict[str, Any] = {"__name__": "generated_for_test"}
    exec(compile(generate(tmp), "generated_for_test", "exec"), namespace)
    return namespace


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), version=st.sampled_from([0, 1]), seed=st.integers(0, 2**32 - 1))
def test_codes_in_tagged_fields_and_out_of_wire_order_are_collected_in_dict_order(
    data: st.DataObject, version: int, seed: int, tmp_path: Path
) -> None:
    # No bundled response has these shapes (test_error_codes.py's made-up one has both), so
    # the generator's reordering is held to the schema walk and the decoded dict form here.
    if not _SYNTHETIC_MODULE:
        _SYNTHETIC_MODULE.update(_generated_from(_SYNTHETIC, tmp_path))
    generated = _SYNTHETIC_MODULE
    fields = _SYNTHETIC["fields"]
    body = data.draw(struct_body(fields, version, version >= 1))
    collector = generated["ERROR_CODES"][12][version]
    walked = struct_step(fields, version, version >= 1, collect=True)
    expected = _codes(walked, body)
    assert expected != ERROR
    assert _codes(collector, body) == expected
    message, used = generated["HeartbeatResponse"].DECODERS[version](body, 0)
    from_dict: list[int] = []
    collect_error_codes(message.to_dict(), from_dict)
    assert used == len(body) and expected == (used, from_dict)
    rng = random.Random(seed)
    for _ in range(20):
        broken = mutate(body, rng)
        assert _codes(collector, broken) == _codes(walked, broken), broken.hex()


_SYNTHETIC_MODULE: dict[str, Any] = {}
