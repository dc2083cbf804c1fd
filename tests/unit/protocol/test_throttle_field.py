"""ThrottleTimeMs read and patched in place, checked against kafka-python's decoder for every
API and version the proxy knows, on response bodies generated from the schemas."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.metadata import ApiVersionsResponse

from kqp.protocol.apis import API_SPECS, API_VERSIONS_KEY, FETCH_KEY, METADATA_KEY, PRODUCE_KEY
from kqp.protocol.codec import decode_body, encode_body
from kqp.protocol.errors import ProtocolDecodeError
from kqp.protocol.headers import encode_response_header, response_body_offset
from kqp.protocol.throttle_field import (
    patch_throttle_time,
    read_throttle_time,
    throttle_field_offset,
    throttle_location,
)
from tests.unit.helpers.schema_messages import body_strategy

ALL_VERSIONS = [(key, version) for key, spec in sorted(API_SPECS.items())
                for version in range(spec.min_version, spec.max_version + 1)]
WITH_FIELD = [pair for pair in ALL_VERSIONS if throttle_location(*pair) is not None]
WITHOUT_FIELD = [pair for pair in ALL_VERSIONS if throttle_location(*pair) is None]
THROTTLE = st.integers(0, 2**31 - 1)
OFFSET_DELETE_KEY = 47


def _id(pair: tuple[int, int]) -> str:
    return f"{API_SPECS[pair[0]].name}-v{pair[1]}"


def test_the_location_table_matches_kafkas() -> None:
    # Spot checks from the Kafka protocol guide: where the field first appears, and the
    # APIs that never carry it.
    assert throttle_location(METADATA_KEY, 2) is None and throttle_location(METADATA_KEY, 3) is not None
    assert throttle_location(API_VERSIONS_KEY, 0) is None and throttle_location(API_VERSIONS_KEY, 1) is not None
    assert throttle_location(PRODUCE_KEY, 3) is not None and throttle_location(FETCH_KEY, 4) is not None
    assert not any(throttle_location(key, version) is not None for key, version in ALL_VERSIONS if key in (17, 27, 36))
    # First in the body everywhere except Produce (after Responses), ApiVersions (after
    # ErrorCode and ApiKeys), OffsetDelete (after ErrorCode) and the delegation-token APIs
    # 38-41 (after ErrorCode and the token fields).
    elsewhere = {PRODUCE_KEY, API_VERSIONS_KEY, OFFSET_DELETE_KEY, 38, 39, 40, 41}
    assert all(throttle_location(*pair) == 0 for pair in WITH_FIELD if pair[0] not in elsewhere)
    assert throttle_location(OFFSET_DELETE_KEY, 0) == 2
    assert throttle_location(39, 2) == 10  # RenewDelegationToken: ErrorCode, ExpiryTimestampMs
    assert callable(throttle_location(PRODUCE_KEY, 9)) and callable(throttle_location(API_VERSIONS_KEY, 3))


@pytest.mark.parametrize("pair", WITH_FIELD, ids=_id)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), new_value=THROTTLE)
def test_read_and_patch_agree_with_the_codec(pair: tuple[int, int], data: st.DataObject, new_value: int) -> None:
    api_key, version = pair
    body = data.draw(body_strategy(api_key, version, is_request=False))
    frame = bytearray(encode_response_header(api_key, version, 77) + body)
    body_offset = response_body_offset(frame, api_key, version)
    decoded = decode_body(api_key, version, body, is_request=False)
    assert read_throttle_time(frame, body_offset, api_key, version) == decoded.throttle_time_ms

    patch_throttle_time(frame, body_offset, api_key, version, new_value)
    assert read_throttle_time(frame, body_offset, api_key, version) == new_value
    decoded.throttle_time_ms = new_value
    # The patched body is exactly what the codec writes for the message with the new value.
    assert bytes(frame[body_offset:]) == encode_body(decoded, version)
    assert frame[:body_offset] == encode_response_header(api_key, version, 77)


@pytest.mark.parametrize("pair", WITHOUT_FIELD, ids=_id)
@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_versions_without_the_field_are_left_alone(pair: tuple[int, int], data: st.DataObject) -> None:
    api_key, version = pair
    body = data.draw(body_strategy(api_key, version, is_request=False))
    frame = bytearray(encode_response_header(api_key, version, 1) + body)
    body_offset = response_body_offset(frame, api_key, version)
    assert read_throttle_time(frame, body_offset, api_key, version) is None
    patch_throttle_time(frame, body_offset, api_key, version, 500)
    assert bytes(frame[body_offset:]) == body


def test_unsupported_version_answer_is_read_as_v0() -> None:
    # The broker answers a too-new ApiVersions request with a v0 body: no throttle field.
    body = bytes(ApiVersionsResponse[0](error_code=35, api_keys=[
        ApiVersionsResponse.ApiVersion(api_key=18, min_version=0, max_version=3)]).encode())
    frame = bytearray(struct.pack(">i", 5) + body)
    assert read_throttle_time(frame, 4, API_VERSIONS_KEY, 4) is None
    patch_throttle_time(frame, 4, API_VERSIONS_KEY, 4, 1000)
    assert bytes(frame[4:]) == body


def test_values_are_clamped_to_the_int32_range() -> None:
    frame = bytearray(struct.pack(">ii", 0, 0) + b"\x00")  # Metadata v3-ish: just the start
    patch_throttle_time(frame, 4, METADATA_KEY, 3, 2**40)
    assert read_throttle_time(frame, 4, METADATA_KEY, 3) == 2**31 - 1
    patch_throttle_time(frame, 4, METADATA_KEY, 3, -5)
    assert read_throttle_time(frame, 4, METADATA_KEY, 3) == 0


@pytest.mark.parametrize(("api_key", "version"), [(PRODUCE_KEY, 8), (PRODUCE_KEY, 12), (API_VERSIONS_KEY, 3)])
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_frames_cut_before_the_field_are_protocol_errors(api_key: int, version: int, data: st.DataObject) -> None:
    # In these responses ThrottleTimeMs comes after an array, at the end of the body
    # (followed only by the tagged-field section in flexible versions).
    body = data.draw(body_strategy(api_key, version, is_request=False))
    frame = encode_response_header(api_key, version, 1) + body
    body_offset = response_body_offset(frame, api_key, version)
    offset = throttle_field_offset(frame, body_offset, api_key, version)
    assert offset is not None
    field_end = offset + 4
    assert read_throttle_time(frame[:field_end], body_offset, api_key, version) is not None
    for cut in range(body_offset, field_end):
        with pytest.raises(ProtocolDecodeError):
            read_throttle_time(frame[:cut], body_offset, api_key, version)
