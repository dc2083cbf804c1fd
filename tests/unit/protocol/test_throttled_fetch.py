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


# A request's SessionEpoch: 0 a full fetch that asks for a session, -1 sessionless (and every
# version before v7), above 0 an incremental fetch of an existing session.
FULL, SESSIONLESS, INCREMENTAL = 0, -1, 5


@pytest.mark.parametrize("version", VERSIONS)
def test_the_answer_to_an_incremental_fetch_has_no_partitions_the_throttle_and_the_brokers_session(
    version: int,
) -> None:
    frame = broker_response(version, correlation_id=31, session_id=987_654)
    offset = response_body_offset(frame, FETCH_KEY, version)
    answer = throttled_fetch_response(frame, offset, version, 1_234, INCREMENTAL)
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


@pytest.mark.parametrize("session_epoch", [FULL, SESSIONLESS])
@pytest.mark.parametrize("version", [v for v in VERSIONS if v >= 7])
def test_a_full_or_sessionless_fetch_gets_no_session_though_the_broker_made_one(
    version: int, session_epoch: int,
) -> None:
    # FetchContext.getThrottledResponse's default (FullFetchContext, SessionlessFetchContext):
    # NONE and INVALID_SESSION_ID; the session the broker created for its full answer is never
    # handed to the client, so its next fetch is a full one again.
    frame = broker_response(version, correlation_id=31, session_id=987_654)
    offset = response_body_offset(frame, FETCH_KEY, version)
    answer = throttled_fetch_response(frame, offset, version, 1_234, session_epoch)
    assert answer[:offset] == frame[:offset]
    message = decode(answer, version)
    assert (message.throttle_time_ms, message.error_code, message.session_id, message.responses) == (1_234, 0, 0, [])
    assert bytes(message.encode()) == answer[offset:]


def test_the_head_of_a_streamed_response_is_enough() -> None:
    frame = broker_response(17, correlation_id=5, session_id=77)
    offset = response_body_offset(frame, FETCH_KEY, 17)
    head = bytearray(frame[:64])  # what the session hands over when a response starts streaming
    for epoch in (FULL, INCREMENTAL):
        assert (throttled_fetch_response(head, offset, 17, 10, epoch)
                == throttled_fetch_response(frame, offset, 17, 10, epoch))


def test_an_incremental_fetch_keeps_the_brokers_epoch_error() -> None:
    # IncrementalFetchContext.getThrottledResponse answers INVALID_FETCH_SESSION_EPOCH (71)
    # with the session's id when the epoch moved: the client must still see it.
    frame = broker_response(12, correlation_id=5, session_id=77, error_code=71)
    offset = response_body_offset(frame, FETCH_KEY, 12)
    message = decode(throttled_fetch_response(frame, offset, 12, 10, INCREMENTAL), 12)
    assert (message.error_code, message.session_id, message.throttle_time_ms) == (71, 77, 10)


def test_an_incremental_fetch_of_a_session_the_broker_did_not_find_gets_the_default_answer() -> None:
    # SessionErrorContext (FETCH_SESSION_ID_NOT_FOUND, 70, session id 0) throttled: Kafka
    # answers with FetchContext's default, NONE and no session.
    frame = broker_response(12, correlation_id=5, session_id=0, error_code=70)
    offset = response_body_offset(frame, FETCH_KEY, 12)
    message = decode(throttled_fetch_response(frame, offset, 12, 10, INCREMENTAL), 12)
    assert (message.error_code, message.session_id, message.throttle_time_ms) == (0, 0, 10)


def test_a_response_too_short_for_its_session_id_is_refused() -> None:
    frame = broker_response(12, correlation_id=5, session_id=77)
    offset = response_body_offset(frame, FETCH_KEY, 12)
    with pytest.raises(ProtocolDecodeError):
        throttled_fetch_response(frame[: offset + 8], offset, 12, 10)
