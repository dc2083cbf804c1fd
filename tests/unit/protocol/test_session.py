"""The sans-IO Kafka session: bytes in, requests and client-bound responses out, no sockets."""

from __future__ import annotations

import struct
from collections.abc import Iterable

import pytest
from kafka.protocol.consumer import FetchResponse, HeartbeatRequest, HeartbeatResponse
from kafka.protocol.metadata import MetadataResponse

from kqp.protocol.apis import (
    API_SPECS,
    FETCH_KEY,
    METADATA_KEY,
    PRODUCE_KEY,
    SASL_AUTHENTICATE_KEY,
    SASL_HANDSHAKE_KEY,
)
from kqp.protocol.codec import build_response, encode_body
from kqp.protocol.errors import CorrelationError, FrameTooLargeError, ProtocolDecodeError, UnsupportedApiError
from kqp.protocol.framing import frame
from kqp.protocol.headers import encode_request_header, response_body_offset
from kqp.protocol.session import (
    CUT_THROUGH_MIN_BYTES,
    BrokerEvent,
    KafkaSession,
    Response,
    StreamData,
    StreamEnded,
    StreamStarted,
)
from tests.unit.helpers.fetch import FETCH_VERSION, answer_fetch, fetch_request
from tests.unit.helpers.fetch import decode as decode_fetch

HEARTBEAT_KEY = 12
PROXY_HOST = "proxy.example"


def map_address(node_id: int, host: str, port: int) -> tuple[str, int]:
    return PROXY_HOST, 9200 + node_id


def new_session(**options: object) -> KafkaSession[str]:
    return KafkaSession(1 << 20, map_address, **options)  # type: ignore[arg-type]


def heartbeat(correlation_id: int) -> bytes:
    body = HeartbeatRequest[4](group_id="g", generation_id=1, member_id="m", group_instance_id=None).encode()
    return encode_request_header(HEARTBEAT_KEY, 4, correlation_id, "test") + bytes(body)


def heartbeat_answer(correlation_id: int, error_code: int = 0) -> bytes:
    body = HeartbeatResponse[4](throttle_time_ms=0, error_code=error_code).encode()
    return struct.pack(">i", correlation_id) + b"\x00" + bytes(body)  # response header v1


def produce_acks0(correlation_id: int) -> bytes:
    # Produce v9: compact null transactional id, acks 0, timeout, no topics, no tagged fields.
    body = b"\x00" + struct.pack(">hi", 0, 30_000) + b"\x01" + b"\x00"
    return encode_request_header(PRODUCE_KEY, 9, correlation_id, "test") + body


def take_all(session: KafkaSession[str], *contexts: str) -> list[str]:
    """Forward every queued request, each with the next context."""
    taken = []
    for context in contexts:
        request = session.next_request()
        session.send_request(request, context)
        taken.append(context)
    return taken


def responses(events: list[BrokerEvent[str]]) -> list[tuple[str, bytes]]:
    return [(event.context, event.frame) for event in events if isinstance(event, Response)]


def test_pipelined_requests_are_answered_in_order_from_one_read() -> None:
    session = new_session()
    assert session.client_bytes(frame(heartbeat(1)) + frame(heartbeat(2)) + frame(heartbeat(3))) == 3
    take_all(session, "first", "second", "third")
    assert session.in_flight == 3
    answers = [heartbeat_answer(1), heartbeat_answer(2, error_code=27), heartbeat_answer(3)]
    events = list(session.broker_bytes(b"".join(frame(answer) for answer in answers)))
    assert responses(events) == [("first", answers[0]), ("second", answers[1]), ("third", answers[2])]
    assert session.in_flight == 0


def test_frames_split_anywhere_are_reassembled() -> None:
    session = new_session()
    wire = frame(heartbeat(5)) + frame(heartbeat(6))
    completed = [session.client_bytes(wire[i : i + 1]) for i in range(len(wire))]
    assert sum(completed) == 2 and session.client_bytes_buffered == 0
    take_all(session, "a", "b")
    answer_wire = frame(heartbeat_answer(5)) + frame(heartbeat_answer(6))
    events: list[BrokerEvent[str]] = []
    for i in range(len(answer_wire)):
        events += session.broker_bytes(answer_wire[i : i + 1])
    assert [context for context, _ in responses(events)] == ["a", "b"]


def test_produce_with_acks_0_is_not_waited_for() -> None:
    session = new_session()
    session.client_bytes(frame(produce_acks0(1)) + frame(heartbeat(2)))
    acks0 = session.next_request()
    assert not acks0.expects_response
    session.send_request(acks0, "produce")
    take_all(session, "heartbeat")
    assert session.in_flight == 1
    # The next response answers the heartbeat, not the Produce that gets none.
    assert responses(list(session.broker_bytes(frame(heartbeat_answer(2))))) == [("heartbeat", heartbeat_answer(2))]


def test_a_local_answer_waits_for_the_forwarded_responses_ahead_of_it() -> None:
    session = new_session()
    session.client_bytes(frame(heartbeat(1)) + frame(heartbeat(2)) + frame(heartbeat(3)))
    take_all(session, "forwarded")
    local = heartbeat_answer(2, error_code=89)
    session.answer_locally(session.next_request(), "local", local)
    assert session.local_answer_waiting and session.requests_queued == 1
    assert list(session.local_answers()) == []  # the forwarded response is still due first
    assert responses(list(session.broker_bytes(frame(heartbeat_answer(1))))) == [("forwarded", heartbeat_answer(1))]
    answers = list(session.local_answers())
    assert [(a.context, a.frame, a.local) for a in answers] == [("local", local, True)]
    assert answers[0].body_offset == response_body_offset(local, HEARTBEAT_KEY, 4)
    assert not session.local_answer_waiting and session.in_flight == 0


def test_a_broker_answer_where_a_local_one_is_due_is_refused() -> None:
    session = new_session()
    session.client_bytes(frame(heartbeat(1)))
    session.answer_locally(session.next_request(), "local", heartbeat_answer(1))
    with pytest.raises(CorrelationError, match="no request in flight"):
        list(session.broker_bytes(frame(heartbeat_answer(1))))


def test_a_response_out_of_order_is_refused_after_those_before_it() -> None:
    session = new_session()
    session.client_bytes(frame(heartbeat(1)) + frame(heartbeat(2)) + frame(heartbeat(3)))
    take_all(session, "one", "two", "three")
    events = session.broker_bytes(frame(heartbeat_answer(1)) + frame(heartbeat_answer(3)))
    first = next(events)
    assert isinstance(first, Response) and first.context == "one"
    with pytest.raises(CorrelationError, match="got correlation id 3, expected 2"):
        next(events)


def test_a_response_with_nothing_in_flight_is_refused() -> None:
    with pytest.raises(CorrelationError, match="no request in flight"):
        list(new_session().broker_bytes(frame(heartbeat_answer(1))))


def test_a_request_over_the_frame_limit_is_refused_before_it_is_read() -> None:
    session = KafkaSession[str](1000, map_address)
    with pytest.raises(FrameTooLargeError, match="1001 bytes exceeds the limit of 1000"):
        session.client_bytes(struct.pack(">i", 1001))


def test_a_decoded_api_in_a_version_beyond_the_definitions_is_refused() -> None:
    session = new_session()
    session.client_bytes(frame(struct.pack(">hhi", FETCH_KEY, 99, 7) + b"\x00\x00"))
    with pytest.raises(UnsupportedApiError, match="API 1 v99"):
        session.next_request()


def test_an_api_the_proxy_does_not_read_passes_in_any_version() -> None:
    session = new_session()
    unknown = struct.pack(">hhih", 9999, 3, 7, -1) + b"opaque body"  # null client id
    session.client_bytes(frame(unknown))
    request = session.next_request()
    assert request.frame == unknown and request.header.api_key == 9999
    session.send_request(request, "opaque")
    answer = struct.pack(">i", 7) + b"opaque answer"
    assert responses(list(session.broker_bytes(frame(answer)))) == [("opaque", answer)]


def test_metadata_responses_point_clients_at_the_proxy() -> None:
    session = new_session()
    session.client_bytes(frame(encode_request_header(METADATA_KEY, 12, 4, "test") + b"\x01\x00\x00\x00"))
    take_all(session, "metadata")
    broker = MetadataResponse.MetadataResponseBroker(node_id=3, host="kafka-3.internal", port=9092, rack=None)
    body = MetadataResponse[12](throttle_time_ms=0, brokers=[broker], cluster_id="c", controller_id=3,
                                topics=[]).encode()
    answer = struct.pack(">i", 4) + b"\x00" + bytes(body)
    (event,) = list(session.broker_bytes(frame(answer)))
    assert isinstance(event, Response)
    message = MetadataResponse.decode(event.frame[event.body_offset :], version=12)
    assert [(b.node_id, b.host, b.port) for b in message.brokers] == [(3, PROXY_HOST, 9203)]


def test_sasl_plain_names_the_principal_once_the_broker_accepts() -> None:
    session = new_session()
    requests = {key: API_SPECS[key].request_class for key in (SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY)}
    handshake = requests[SASL_HANDSHAKE_KEY][1](mechanism="PLAIN").encode()
    auth = requests[SASL_AUTHENTICATE_KEY][2](auth_bytes=b"\x00alice\x00secret").encode()
    session.client_bytes(
        frame(encode_request_header(SASL_HANDSHAKE_KEY, 1, 1, "test") + bytes(handshake))
        + frame(encode_request_header(SASL_AUTHENTICATE_KEY, 2, 2, "test") + bytes(auth))
    )
    take_all(session, "handshake", "authenticate")
    assert not session.sasl.authenticated
    list(session.broker_bytes(frame(struct.pack(">i", 1) + struct.pack(">hi", 0, 0))))  # mechanisms: none listed
    accepted = encode_body(build_response(SASL_AUTHENTICATE_KEY, 2, error_code=0, error_message=None,
                                          auth_bytes=b"", session_lifetime_ms=0), 2)
    list(session.broker_bytes(frame(struct.pack(">i", 2) + b"\x00" + bytes(accepted))))
    assert session.sasl.authenticated and session.sasl.principal == "alice"


def test_a_large_fetch_response_streams_and_arrives_byte_for_byte() -> None:
    session = new_session()
    session.client_bytes(frame(fetch_request(9)))
    take_all(session, "fetch")
    body = answer_fetch(None, b"")
    wire = frame(struct.pack(">i", 9) + b"\x00" + body)
    assert len(wire) > CUT_THROUGH_MIN_BYTES
    out = bytearray()
    kinds = []
    for start in range(0, len(wire), 16_384):
        for event in session.broker_bytes(wire[start : start + 16_384]):
            kinds.append(type(event).__name__)
            if isinstance(event, StreamStarted):
                assert event.context == "fetch" and event.frame_size == len(wire) - 4
                out += b"".join(session.send_stream_head(event))
            elif isinstance(event, StreamData):
                out += event.data
            elif isinstance(event, StreamEnded):
                assert event.context == "fetch" and event.endpoints_rewritten
                out += event.tail
    assert kinds[0] == "StreamStarted" and kinds[-1] == "StreamEnded" and "StreamData" in kinds
    assert "Response" not in kinds
    assert len(out) == len(wire) and session.in_flight == 0
    message = decode_fetch(bytes(out[4:]))
    assert [(e.node_id, e.host, e.port) for e in message.node_endpoints] == [(1, PROXY_HOST, 9201)]
    original = FetchResponse.decode(body, version=FETCH_VERSION)
    assert message.responses[0].partitions[0].records == original.responses[0].partitions[0].records


def test_a_dropped_stream_is_read_to_its_end_and_the_next_response_follows_whole() -> None:
    # A throttled Fetch answered empty: the broker's frame, already on its way, goes nowhere,
    # and the response pipelined behind it (in the same chunks) is matched as usual.
    session = new_session()
    session.client_bytes(frame(fetch_request(9)) + frame(heartbeat(10)))
    take_all(session, "fetch", "heartbeat")
    wire = frame(struct.pack(">i", 9) + b"\x00" + answer_fetch(None, b"")) + frame(heartbeat_answer(10))
    events: list[BrokerEvent[str]] = []
    for start in range(0, len(wire), 16_384):
        for event in session.broker_bytes(wire[start : start + 16_384]):
            events.append(event)
            if isinstance(event, StreamStarted):
                session.drop_stream()
    kinds = [type(event).__name__ for event in events]
    assert kinds == ["StreamStarted", "StreamEnded", "Response"]
    ended = events[1]
    assert isinstance(ended, StreamEnded) and ended.context == "fetch" and ended.tail == b""
    assert responses(events) == [("heartbeat", heartbeat_answer(10))] and session.in_flight == 0


def test_a_fetch_response_something_must_see_whole_is_not_streamed() -> None:
    session = new_session(may_stream=lambda context: context != "captured")
    session.client_bytes(frame(fetch_request(9)))
    take_all(session, "captured")
    wire = frame(struct.pack(">i", 9) + b"\x00" + answer_fetch(None, b""))
    events: list[BrokerEvent[str]] = []
    for start in range(0, len(wire), 16_384):
        events += session.broker_bytes(wire[start : start + 16_384])
    assert [type(event).__name__ for event in events] == ["Response"]


def test_a_streamed_fetch_response_cut_short_inside_its_structure_is_refused() -> None:
    session = new_session()
    session.client_bytes(frame(fetch_request(9)))
    take_all(session, "fetch")
    body = answer_fetch(None, b"")
    # Claim a frame 100 KB shorter than the body: it ends inside the records.
    size = len(body) + 5 - 100_000
    wire = struct.pack(">i", size) + struct.pack(">i", 9) + b"\x00" + body[: size - 5]
    with pytest.raises(ProtocolDecodeError):
        list(session.broker_bytes(wire))


def test_what_is_written_is_the_size_prefix_beside_the_frame() -> None:
    # Two parts for writelines, never one concatenation: the frame itself is what gets written.
    session = new_session()
    session.client_bytes(frame(heartbeat(1)) + frame(heartbeat(2)))
    first = session.next_request()
    prefix, out = session.send_request(first, "first")
    assert prefix + out == frame(heartbeat(1)) and out is first.frame
    changed = heartbeat(2)[:-1] + b"\x01"  # as a hook would hand back a rewritten request
    assert b"".join(session.send_request(session.next_request(), "second", changed)) == frame(changed)
    (response,) = responses_of(session.broker_bytes(frame(heartbeat_answer(1))))
    prefix, out = session.send_response(response)
    assert prefix == struct.pack(">i", len(heartbeat_answer(1))) and out is response.frame
    assert b"".join(session.send_response(response, b"patched")) == frame(b"patched")


def test_a_local_answer_is_due_only_when_its_turn_has_come() -> None:
    session = new_session()
    session.client_bytes(frame(heartbeat(1)) + frame(heartbeat(2)))
    session.send_request(session.next_request(), "forwarded")
    session.answer_locally(session.next_request(), "local", heartbeat_answer(2))
    assert session.local_answer_waiting and not session.local_answer_due
    list(session.broker_bytes(frame(heartbeat_answer(1))))
    assert session.local_answer_due
    assert [r.context for r in session.local_answers()] == ["local"]
    assert not session.local_answer_due and session.in_flight == 0


def responses_of(events: Iterable[BrokerEvent[str]]) -> list[Response[str]]:
    return [event for event in events if isinstance(event, Response)]
