"""kqp.protocol.throttled_fetch: the empty answer to a throttled Fetch, in every version the
proxy forwards (v4-v18), read back with an independent codec (kafka-python's)."""

from __future__ import annotations

import uuid

import pytest
from kafka.protocol.consumer import FetchResponse

from kqp.protocol.apis import API_SPECS, FETCH_KEY
from kqp.protocol.errors import ProtocolDecodeError
from kqp.protocol.headers import encode_response_header, response_body_offset
from kqp.protocol.throttled_fetch import throttled_fetch_response

VERSIONS = range(API_SPECS[FETCH_KEY].min_version, API_SPECS[FETCH_KEY].max_version + 1)
RECORDS = b"\x07" * 5_000  # not a real batch: the empty answer never reads them


def broker_response(version: int, correlation_id: int, session_id: int, error_code: int = 0) -> bytes:
    """A Fetch response frame (no size prefix) with one partition of data, as a broker sends it."""
    data_cls = FetchResponse[version].FetchableTopicResponse.PartitionData
    fields = {
        "partition_index": 0, "error_code": 0, "high_watermark": 100, "last_stable_offset": 100,
        "log_start_offset": 0, "aborted_transactions": [], "preferred_read_replica": -1, "records": RECORDS,
        "diverging_epoch": None, "current_leader": data_cls.LeaderIdAndEpoch(leader_id=1, leader_epoch=3),
        "snapshot_id": None,
    }
    partition = data_cls(**{name: value for name, value in fields.items() if name in data_cls.fields})
    topic_cls = FetchResponse[version].FetchableTopicResponse
    topic = topic_cls(**{name: value for name, value in
                         {"topic": "t", "topic_id": uuid.uuid4(), "partitions": [partition]}.items()
                         if name in topic_cls.fields})
    body_fields = {"throttle_time_ms": 0, "error_code": error_code, "session_id": session_id,
                   "responses": [topic], "node_endpoints": []}
    response_cls = FetchResponse[version]
    body = response_cls(**{name: value for name, value in body_fields.items() if name in response_cls.fields})
    return encode_response_header(FETCH_KEY, version, correlation_id) + bytes(body.encode())


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
