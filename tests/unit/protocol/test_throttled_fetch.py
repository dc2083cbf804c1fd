"""kqp.protocol.throttled_fetch: the empty answer to a throttled Fetch, in every version the
proxy forwards (v4-v18), read back with an independent codec (kafka-python's)."""

from __future__ import annotations

import pytest
from kafka.protocol.consumer import FetchResponse

from kqp.protocol.apis import API_SPECS, FETCH_KEY
from kqp.protocol.errors import ProtocolDecodeError
from kqp.protocol.headers import response_body_offset
from kqp.protocol.throttled_fetch import throttled_fetch_response
from tests.unit.helpers.fetch import fetch_response_frame as broker_response

VERSIONS = range(API_SPECS[FETCH_KEY].min_version, API_SPECS[FETCH_KEY].max_version + 1)


def decode(frame: bytes, version: int) -> FetchResponse:
    offset = response_body_offset(frame, FETCH_KEY, version)
    return FetchResponse[version].decode(frame[offset:])


@pytest.mark.parametrize("version", VERSIONS)
def test_the_answer_has_no_partitions_the_throttle_and_the_brokers_session(version: int) -> None:
    frame = broker_response(version, correlation_id=31, session_id=987_654)
    offset = response_body_offset(frame, FETCH_KEY, version)
    answer = throttled_fetch_response(frame, offset, version, 1_234)
    assert answer[:offset] == frame[:offset]  # correlation id (and header tags) as the broker wrote them
    message = decode(answer, version)
    assert message.throttle_time_ms == 1_234
    assert message.responses == []
    if version >= 7:  # ErrorCode and SessionId exist from v7 (KIP-227)
        assert (message.error_code, message.session_id) == (0, 987_654)
    if version >= 16:
        assert message.node_endpoints == []
    # Nothing after the body: the frame is exactly the empty response.
    assert bytes(message.encode()) == answer[offset:]


def test_the_head_of_a_streamed_response_is_enough() -> None:
    frame = broker_response(17, correlation_id=5, session_id=77)
    offset = response_body_offset(frame, FETCH_KEY, 17)
    head = bytearray(frame[:64])  # what the session hands over when a response starts streaming
    assert throttled_fetch_response(head, offset, 17, 10) == throttled_fetch_response(frame, offset, 17, 10)


def test_a_top_level_error_is_the_brokers() -> None:
    # A session error comes with no partitions: the client must still see it (INVALID_FETCH_SESSION_EPOCH).
    frame = broker_response(12, correlation_id=5, session_id=77, error_code=71)
    offset = response_body_offset(frame, FETCH_KEY, 12)
    message = decode(throttled_fetch_response(frame, offset, 12, 10), 12)
    assert (message.error_code, message.session_id, message.throttle_time_ms) == (71, 77, 10)


def test_a_response_too_short_for_its_session_id_is_refused() -> None:
    frame = broker_response(12, correlation_id=5, session_id=77)
    offset = response_body_offset(frame, FETCH_KEY, 12)
    with pytest.raises(ProtocolDecodeError):
        throttled_fetch_response(frame[: offset + 8], offset, 12, 10)
