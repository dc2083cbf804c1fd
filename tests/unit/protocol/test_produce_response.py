"""The Produce response's generated ThrottleTimeMs skipper (kqp.protocol.produce_response) against
the interpreted schema walk of ProduceResponse.json (the reference in
tests/unit/helpers/schema_reference): the same offset of ThrottleTimeMs on every response the
schemas allow (record errors, CurrentLeader and NodeEndpoints tagged fields, null strings,
multi-byte varints), and a failure on the same malformed bytes."""

from __future__ import annotations

import contextlib
import random
import uuid
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.producer import ProduceResponse

from kqp.protocol import produce_response
from kqp.protocol.apis import API_SPECS, PRODUCE_KEY
from kqp.protocol.errors import ProtocolDecodeError, ProtocolError
from kqp.protocol.headers import encode_response_header, response_body_offset
from kqp.protocol.schema_walk import SHORT_READ
from kqp.protocol.throttle_field import read_throttle_time, throttle_field_offset
from tests.unit.helpers.schema_messages import body_strategy
from tests.unit.helpers.schema_reference import walked_location
from tests.unit.protocol.test_fuzz import mutate

VERSIONS = list(range(API_SPECS[PRODUCE_KEY].min_version, API_SPECS[PRODUCE_KEY].max_version + 1))
ERROR = "error"

Walk = Callable[[bytes, int], int]


def _generic(version: int) -> Walk:
    location = walked_location(PRODUCE_KEY, version, "ThrottleTimeMs")
    assert location is not None and callable(location), "ThrottleTimeMs follows the Responses array in every version"
    return lambda frame, offset: location(frame, offset)


def _by_hand(version: int) -> Walk:
    return lambda frame, offset: produce_response.throttle_offset(frame, offset, version)


def _outcome(walk: Walk, frame: bytes, body_offset: int) -> int | str:
    """The offset a walk returns (not checked against the end), or ERROR for any failure the
    caller turns into ProtocolDecodeError."""
    try:
        return walk(frame, body_offset)
    except (ProtocolError, *SHORT_READ):
        return ERROR


def _frame(version: int, body: bytes) -> tuple[bytes, int]:
    frame = encode_response_header(PRODUCE_KEY, version, 9) + body
    return frame, response_body_offset(frame, PRODUCE_KEY, version)


def test_every_version_the_definitions_describe_is_walked() -> None:
    assert all(produce_response.walks(version) for version in VERSIONS)
    assert not produce_response.walks(VERSIONS[0] - 1) and not produce_response.walks(VERSIONS[-1] + 1)


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_the_same_offset_and_the_same_failures_as_the_schema_walk(
    version: int, data: st.DataObject, seed: int
) -> None:
    body = data.draw(body_strategy(PRODUCE_KEY, version, is_request=False, max_items=3))
    frame, body_offset = _frame(version, body)
    generic, by_hand = _generic(version), _by_hand(version)
    expected = _outcome(generic, frame, body_offset)
    if version < 10:  # nothing can follow the field but an empty tag section (v9)
        assert expected == len(frame) - 4 - (1 if version == 9 else 0)
    assert _outcome(by_hand, frame, body_offset) == expected
    rng = random.Random(seed)
    for _ in range(100):
        broken = mutate(frame, rng)
        assert _outcome(by_hand, broken, body_offset) == _outcome(generic, broken, body_offset), broken.hex()
        # Through the public entry, nothing but ProtocolDecodeError may come out.
        with contextlib.suppress(ProtocolDecodeError):
            throttle_field_offset(broken, body_offset, PRODUCE_KEY, version)


@pytest.mark.parametrize("version", VERSIONS)
def test_long_names_and_many_partitions_take_multi_byte_varints(version: int) -> None:
    # 130 partitions and a 300-byte name: counts and lengths past 127 take two varint bytes.
    topic_cls = ProduceResponse.TopicProduceResponse
    partition_cls = topic_cls.PartitionProduceResponse
    partitions = [
        partition_cls(index=i, error_code=0, base_offset=i, log_append_time_ms=-1, log_start_offset=0,
                      record_errors=[partition_cls.BatchIndexAndErrorMessage(
                          batch_index=1, batch_index_error_message="e" * 200)] if i % 50 == 0 else [],
                      error_message="m" * 150 if i == 7 else None)
        for i in range(130)
    ]
    topic = topic_cls(name="t" * 300, partition_responses=partitions) if version < 13 else topic_cls(
        topic_id=uuid.UUID(int=5), partition_responses=partitions)
    body = bytes(ProduceResponse[version](throttle_time_ms=1234, responses=[topic, topic]).encode())
    frame, body_offset = _frame(version, body)
    offset = _outcome(_generic(version), frame, body_offset)
    assert isinstance(offset, int)
    assert _outcome(_by_hand(version), frame, body_offset) == offset
    assert read_throttle_time(frame, body_offset, PRODUCE_KEY, version) == 1234
    for cut in range(body_offset, len(frame) - 4, 97):  # truncated anywhere before the field
        with pytest.raises(ProtocolDecodeError):
            throttle_field_offset(frame[:cut], body_offset, PRODUCE_KEY, version)


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=120), version=st.sampled_from(VERSIONS))
def test_random_bytes_fail_alike(raw: bytes, version: int) -> None:
    assert _outcome(_by_hand(version), raw, 0) == _outcome(_generic(version), raw, 0)


def test_a_memoryview_is_walked_like_bytes() -> None:
    topic_cls = ProduceResponse.TopicProduceResponse
    body = bytes(ProduceResponse[11](throttle_time_ms=7, responses=[topic_cls(name="x", partition_responses=[
        topic_cls.PartitionProduceResponse(index=0, error_code=0, base_offset=1)])]).encode())
    frame, body_offset = _frame(11, body)
    assert throttle_field_offset(memoryview(frame), body_offset, PRODUCE_KEY, 11) == len(frame) - 5
