"""One client connection's Kafka conversation, without IO (in the manner of h11).

Bytes from the client and from the broker go in; requests to forward or answer, and the
responses the client must get, come out. The session frames both directions (with bounded
frame sizes), parses request headers, keeps the requests in flight and matches responses to
them (Kafka answers a connection's requests strictly in order, and a Produce with acks=0 gets
no answer at all), observes SASL logins for the principal, and rewrites what the client must
see differently: broker addresses and the ApiVersions caps. Large Fetch responses pass through
as they stream in (cut-through), holding back only their trailing tagged fields.

Sockets, flow control, timers and the hooks are the caller's (kqp.proxy.connection): the
session never reads a clock and never decides when to read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kqp.protocol.address_rewrite import AddressMapper, client_response
from kqp.protocol.apis import (
    API_VERSIONS_KEY,
    DECODED_APIS,
    FETCH_KEY,
    PRODUCE_KEY,
    SASL_AUTHENTICATE_KEY,
    SASL_HANDSHAKE_KEY,
)
from kqp.protocol.codec import decode_body
from kqp.protocol.correlation import expects_response
from kqp.protocol.errors import CorrelationError, ProtocolDecodeError, ProtocolError, UnsupportedApiError
from kqp.protocol.fetch_stream import FetchResponseStream, rewrite_fetch_tail
from kqp.protocol.framing import FrameDecoder
from kqp.protocol.headers import RequestHeader, parse_request_header, response_body_offset, response_correlation_id
from kqp.protocol.sasl import DEFAULT_OAUTHBEARER_SUB_CLAIM, SaslObserver
from kqp.protocol.throttle_field import throttle_field_offset

C = TypeVar("C")  # what the caller keeps with each request (the proxy's Exchange)

# Responses may legitimately be far larger than requests (fetch.max.bytes is per request,
# and a broker returns at least one batch even if it is larger), so only nonsense is refused.
MAX_RESPONSE_FRAME_BYTES = 2**31 - 1
# Fetch responses at least this large go to the client while they stream in: a consumer with
# one fetch in flight per broker does not wait for each response twice, and no whole frame is
# held. The head handed over first must hold the response header and ThrottleTimeMs.
CUT_THROUGH_MIN_BYTES = 64 * 1024
CUT_THROUGH_HEAD_BYTES = 64


class TruncatedFrameError(ProtocolDecodeError):
    """The peer went away in the middle of a frame."""


@dataclass(slots=True)
class Request:
    """A whole request frame from the client (no size prefix), its header read."""

    header: RequestHeader
    frame: bytes
    expects_response: bool


@dataclass(slots=True)
class _InFlight(Generic[C]):
    header: RequestHeader
    context: C
    local_answer: bytes | None  # a response frame the proxy gives itself, in this request's turn


@dataclass(slots=True)
class Response(Generic[C]):
    """A whole response for the client, in its turn: forwarded from the broker (rewritten where
    it must be) or answered locally."""

    context: C
    header: RequestHeader  # the request's
    frame: bytes  # no size prefix
    body_offset: int
    local: bool
    endpoints_rewritten: bool = False  # KIP-951 NodeEndpoints pointed at the proxy
    # Where ThrottleTimeMs sits in `frame`, when finding it took a walk the session already
    # made (Produce: it follows the partitions); None: not known, find it yourself.
    throttle_offset: int | None = None


@dataclass(slots=True)
class StreamStarted(Generic[C]):
    """A large response began streaming: `head[:passed]` goes to the client now, after the
    caller patched it in place if it must (same length: ThrottleTimeMs)."""

    context: C
    header: RequestHeader
    frame_size: int  # without the size prefix
    body_offset: int
    head: bytearray
    passed: int


@dataclass(slots=True)
class StreamData:
    """More bytes of the streaming response, for the client as they are."""

    data: memoryview


@dataclass(slots=True)
class StreamEnded(Generic[C]):
    """The streaming response's last bytes: its trailing tagged fields, rewritten to the
    same length."""

    context: C
    header: RequestHeader
    frame_size: int
    body_offset: int
    tail: bytes
    endpoints_rewritten: bool


BrokerEvent = Response[C] | StreamStarted[C] | StreamData | StreamEnded[C]


@dataclass(slots=True)
class _Stream(Generic[C]):
    entry: _InFlight[C]
    frame_size: int
    body_offset: int
    remaining: int
    parser: FetchResponseStream
    tail: bytearray


class KafkaSession(Generic[C]):
    """The Kafka side of one proxied connection.

    Args:
        max_request_bytes: the largest request frame accepted (socket.request.max.bytes).
        map_address: a broker's (node id, host, port) -> the address clients must be given.
        learn_metadata: called with each decoded Metadata response (topic names by id).
        may_stream: whether the response to this request may be forwarded as it streams in
            (False when something must see it whole).
        oauthbearer_sub_claim: the JWT claim naming an OAUTHBEARER principal (kqp.protocol.sasl).
    """

    def __init__(
        self,
        max_request_bytes: int,
        map_address: AddressMapper,
        learn_metadata: Callable[[Any], None] | None = None,
        may_stream: Callable[[C], bool] = lambda _context: True,
        oauthbearer_sub_claim: str = DEFAULT_OAUTHBEARER_SUB_CLAIM,
    ) -> None:
        self._client_frames = FrameDecoder(max_request_bytes)
        self._broker_frames = FrameDecoder(MAX_RESPONSE_FRAME_BYTES)
        self._map_address = map_address
        self._learn_metadata = learn_metadata
        self._may_stream = may_stream
        self._queued: deque[bytes] = deque()
        self._in_flight: deque[_InFlight[C]] = deque()
        self._stream: _Stream[C] | None = None
        self.sasl = SaslObserver(oauthbearer_sub_claim)

    # ---- the client's side -----------------------------------------------------------

    def client_bytes(self, data: bytes) -> int:
        """Take bytes from the client; returns how many requests they completed (queued until
        `next_request`). Raises ProtocolError on a frame that cannot be valid."""
        frames = self._client_frames.feed(data)
        self._queued.extend(frames)
        return len(frames)

    @property
    def client_bytes_buffered(self) -> int:
        """Bytes of a request frame not yet complete."""
        return self._client_frames.buffered_bytes

    @property
    def requests_queued(self) -> int:
        return len(self._queued)

    def drop_queued_requests(self) -> None:
        self._queued.clear()

    @property
    def in_flight(self) -> int:
        """Requests forwarded or answered locally whose response the client has not had yet."""
        return len(self._in_flight)

    @property
    def local_answer_waiting(self) -> bool:
        """The newest request is answered locally and waits for the responses ahead of it: a
        broker reads nothing more from a connection while a request of it is unanswered."""
        return bool(self._in_flight) and self._in_flight[-1].local_answer is not None

    def next_request(self) -> Request:
        """The oldest queued request, its header read (raises ProtocolError on a bad one)."""
        frame = self._queued.popleft()
        header = parse_request_header(frame)
        api_key = header.api_key
        if not header.known and api_key in DECODED_APIS and api_key != API_VERSIONS_KEY:
            # An API the proxy must read, in a version it cannot: never advertised, and the
            # brokers (whose definitions these are) close the connection for it too.
            raise UnsupportedApiError(
                f"API {api_key} v{header.api_version} is outside the versions the proxy decodes "
                f"(correlation id {header.correlation_id})"
            )
        body = memoryview(frame)[header.body_offset :]
        if api_key == SASL_HANDSHAKE_KEY:
            self.sasl.handshake(decode_body(api_key, header.api_version, body, is_request=True).mechanism)
        elif api_key == SASL_AUTHENTICATE_KEY:
            message = decode_body(api_key, header.api_version, body, is_request=True)
            self.sasl.authenticate_request(bytes(message.auth_bytes))
        return Request(header, frame, expects_response(api_key, header.api_version, body))

    def forwarded(self, request: Request, context: C) -> None:
        """The request went to the broker; its response (if it gets one) is due in this turn."""
        if request.expects_response:
            self._in_flight.append(_InFlight(request.header, context, None))

    def answer_locally(self, request: Request, context: C, answer: bytes) -> None:
        """The proxy answers the request itself; the answer leaves in the request's turn."""
        self._in_flight.append(_InFlight(request.header, context, answer))

    def local_answers(self) -> Iterator[Response[C]]:
        """The local answers whose turn has come (every response ahead of them was sent)."""
        in_flight = self._in_flight
        while in_flight and in_flight[0].local_answer is not None:
            entry = in_flight.popleft()
            answer = entry.local_answer
            assert answer is not None
            header = entry.header
            yield Response(entry.context, header, answer,
                           response_body_offset(answer, header.api_key, header.api_version), local=True)

    # ---- the broker's side -----------------------------------------------------------

    def broker_bytes(self, data: bytes) -> Iterator[BrokerEvent[C]]:
        """Take bytes from the broker; yields what goes to the client, in order. Raises
        ProtocolError (at the event it happens) on a bad or out-of-order response."""
        view = memoryview(data)
        while view:
            stream = self._stream
            if stream is not None:
                part, view = view[: stream.remaining], view[stream.remaining :]
                yield from self._stream_bytes(stream, part)
                continue
            frames = self._broker_frames.feed(view)
            view = view[:0]
            for frame in frames:
                yield self._whole_response(frame)
            started = self._start_stream()
            if started is not None:
                yield started

    def _whole_response(self, frame: bytes) -> Response[C]:
        entry = self._match(response_correlation_id(frame))
        header = entry.header
        api_key, api_version = header.api_key, header.api_version
        body_offset = response_body_offset(frame, api_key, api_version)
        if api_key == SASL_AUTHENTICATE_KEY:
            answer = decode_body(api_key, api_version, memoryview(frame)[body_offset:], is_request=False)
            self.sasl.authenticate_response(answer.error_code, bytes(answer.auth_bytes))
        throttle_offset = None
        if api_key == PRODUCE_KEY:
            # On bad bytes the rewrite below reads the response again and reports what is wrong.
            with suppress(ProtocolError):
                throttle_offset = throttle_field_offset(frame, body_offset, api_key, api_version)
        out, rewritten = client_response(api_key, api_version, frame, body_offset, self._map_address,
                                         self._learn_metadata, produce_throttle_offset=throttle_offset)
        return Response(entry.context, header, out, body_offset, local=False, endpoints_rewritten=rewritten,
                        throttle_offset=throttle_offset if out is frame else None)

    def _match(self, correlation_id: int) -> _InFlight[C]:
        in_flight = self._in_flight
        if not in_flight or in_flight[0].local_answer is not None:
            raise CorrelationError(f"broker sent response {correlation_id} with no request in flight")
        expected = in_flight[0].header.correlation_id
        if correlation_id != expected:
            raise CorrelationError(
                f"broker answered out of order: got correlation id {correlation_id}, expected {expected}"
            )
        return in_flight.popleft()

    def _start_stream(self) -> StreamStarted[C] | None:
        """Begin passing the incomplete frame on now, if it is a large Fetch response."""
        frames = self._broker_frames
        size, received = frames.incomplete_frame()
        if size < CUT_THROUGH_MIN_BYTES or received < CUT_THROUGH_HEAD_BYTES or not self._in_flight:
            return None
        entry = self._in_flight[0]
        header = entry.header
        if header.api_key != FETCH_KEY or not header.known or entry.local_answer is not None:
            return None  # a Fetch version newer than the definitions may lay its body out differently
        if not self._may_stream(entry.context):
            return None
        head = bytearray(frames.detach_incomplete())
        self._match(response_correlation_id(memoryview(head)))
        body_offset = response_body_offset(memoryview(head), FETCH_KEY, header.api_version)
        parser = FetchResponseStream(header.api_version)
        passed = body_offset + parser.feed(memoryview(head)[body_offset:])
        self._stream = _Stream(entry, size, body_offset, size - len(head), parser, head[passed:])
        return StreamStarted(entry.context, header, size, body_offset, head, passed)

    def _stream_bytes(self, stream: _Stream[C], part: memoryview) -> Iterator[StreamData | StreamEnded[C]]:
        stream.remaining -= len(part)
        passed = 0 if stream.parser.in_tail else stream.parser.feed(part)
        if passed:
            yield StreamData(part[:passed])
        if passed < len(part):
            stream.tail += part[passed:]
        if stream.remaining:
            return
        self._stream = None
        if not stream.parser.streams_whole and not stream.parser.in_tail:
            raise ProtocolDecodeError("Fetch response ended inside its structure")
        tail = bytes(stream.tail)
        rewritten = rewrite_fetch_tail(tail, self._map_address) if tail else tail
        entry = stream.entry
        yield StreamEnded(entry.context, entry.header, stream.frame_size, stream.body_offset, rewritten,
                          rewritten != tail)
