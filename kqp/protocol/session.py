"""One client connection's Kafka conversation, without IO (in the manner of h11).

Bytes from the client and from the broker go in; requests to forward or answer, and the
responses the client must get, come out. Sockets, flow control, timers and the hooks are the
caller's (kqp.proxy.connection): the session never reads a clock and never decides when to
read, so every rule below is unit-tested by feeding it bytes.

Theory of operation
-------------------
Framing. Both directions are a stream of frames, each an int32 size followed by that many
bytes (Kafka's NetworkReceive). `FrameDecoder` reassembles them from whatever chunks the
socket gives and refuses a size before allocating it: requests are bounded by the broker's
`socket.request.max.bytes` (`max_request_bytes`), responses only by the int32 range, since
a broker may legitimately return more than fetch.max.bytes (KIP-74: the first batch is
always returned whole).

Requests. `client_bytes` only splits frames and queues them; nothing is parsed until the
caller asks for `next_request`, because the caller may be muted (KIP-219) or holding a
request and must leave the rest unread, as a broker leaves them in its socket buffer. The
request header (v1, or v2 with tagged fields for flexible versions: KIP-482) is always read;
the body only when a feature needs it (SASL here, quotas and capture in the hooks).

Correlation. A broker answers the requests of one connection strictly in the order it read
them (its SocketServer mutes a channel while a request of it is being handled), so the
session keeps one FIFO of requests in flight instead of a map by correlation id. Each
response must carry the correlation id of the oldest entry; anything else means the two
ends no longer agree on the byte stream and is a CorrelationError (the connection closes,
as aiokafka does on an out-of-sync response). A request that gets no response (Produce
with acks=0, see kqp.protocol.correlation) never enters the FIFO.

Local answers. The proxy answers some requests itself (a quota-admin reply, a refused
partition mutation). Such an answer takes the request's place in the FIFO and leaves only
when every response ahead of it has gone to the client (`local_answers`), so the client
still sees its responses in request order. While the newest entry is a local answer the
caller reads no further request (`local_answer_waiting`): its throttle must apply to what
the client pipelined behind it, as a broker's mute would.

SASL handoff. SASL is passed through to the broker, which authenticates; the session only
observes it: the mechanism from SaslHandshake, the client's first message from
SaslAuthenticate and the broker's error code on its response (`SaslObserver`). Once the
broker accepted, the observed principal names the connection for quotas (KIP-55 quotas are
per user), replacing any TLS principal, as on a broker's SASL_SSL listener. A login the
session cannot read (e.g. a mechanism it does not parse) leaves the principal unknown
rather than guessed.

Output. What goes out is framed here too, as h11's `send` does: `send_request`,
`send_response` and `send_stream_head` return the parts to write, the int32 size prefix and
the frame, for the caller's `writelines`. Two parts rather than one concatenation, so a
large frame is never copied to prepend four bytes, and the bytes sent can be tested without
a socket.

Rewriting. Responses that carry broker addresses (Metadata, FindCoordinator,
DescribeCluster, KIP-951 NodeEndpoints in Produce/Fetch) are rewritten so that clients
reconnect through the proxy, and ApiVersions is capped at the versions the proxy decodes
(kqp.protocol.address_rewrite); every other response goes through unchanged, byte for byte.

Fetch cut-through. A Fetch response of at least CUT_THROUGH_MIN_BYTES is not buffered
whole: once its first CUT_THROUGH_HEAD_BYTES arrived (response header and ThrottleTimeMs,
which the caller may patch), it is matched to its request and handed on in pieces
(`StreamStarted`, `StreamData`...) while `FetchResponseStream` follows its structure. Only
its trailing tagged fields are held back (`StreamEnded`), because KIP-951 NodeEndpoints
live there and must be rewritten; the rewrite keeps the length, since the size prefix has
long been sent. The caller can veto streaming per request (`may_stream`) when a hook must
see the response whole, and can answer a stream that has just started otherwise
(`drop_stream`: a throttled Fetch answered empty), its bytes then read and dropped. A
consumer thus never waits for a large response twice, and the proxy never holds a whole one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
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
from kqp.protocol.errors import (
    CorrelationError,
    ProtocolDecodeError,
    ProtocolError,
    UnsupportedApiError,
)
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


# What to write for one frame: its size prefix, then the frame itself (see "Output" above).
Parts = tuple[bytes, bytes | bytearray]


def framed(frame: bytes | bytearray) -> Parts:
    """The int32 size that precedes every Kafka frame, beside the frame (not concatenated)."""
    return len(frame).to_bytes(4, "big"), frame


# The events and records below are plain classes, not dataclasses: mypyc compiles this module
# (kqp/compiled_modules.py) and builds no generic dataclass. Callers only read their fields,
# so they need none of a dataclass's generated equality or repr.


class Request:
    """A whole request frame from the client (no size prefix), its header read."""

    __slots__ = ("expects_response", "frame", "header")

    def __init__(self, header: RequestHeader, frame: bytes, expects_response: bool) -> None:
        self.header = header
        self.frame = frame
        self.expects_response = expects_response


class _InFlight(Generic[C]):
    """One entry of the FIFO of requests awaiting their response, oldest first. The header
    is kept because responses carry only a correlation id: the API key and version that
    say how to read (and rewrite) a response come from the request."""

    __slots__ = ("context", "header", "local_answer")

    def __init__(self, header: RequestHeader, context: C, local_answer: bytes | None) -> None:
        self.header = header
        self.context = context
        self.local_answer = local_answer  # a response frame the proxy gives itself, in this request's turn


class Response(Generic[C]):
    """A whole response for the client, in its turn: forwarded from the broker (rewritten where
    it must be) or answered locally."""

    __slots__ = ("body_offset", "context", "endpoints_rewritten", "frame", "header", "local", "throttle_offset")

    def __init__(
        self,
        context: C,
        header: RequestHeader,  # the request's
        frame: bytes,  # no size prefix
        body_offset: int,
        local: bool,
        endpoints_rewritten: bool = False,  # KIP-951 NodeEndpoints pointed at the proxy
        # Where ThrottleTimeMs sits in `frame`, when finding it took a walk the session already
        # made (Produce: it follows the partitions); None: not known, find it yourself.
        throttle_offset: int | None = None,
    ) -> None:
        self.context = context
        self.header = header
        self.frame = frame
        self.body_offset = body_offset
        self.local = local
        self.endpoints_rewritten = endpoints_rewritten
        self.throttle_offset = throttle_offset


class StreamStarted(Generic[C]):
    """A large response began streaming: `head[:passed]` goes to the client now, after the
    caller patched it in place if it must (same length: ThrottleTimeMs)."""

    __slots__ = ("body_offset", "context", "frame_size", "head", "header", "passed")

    def __init__(
        self,
        context: C,
        header: RequestHeader,
        frame_size: int,  # without the size prefix
        body_offset: int,
        head: bytearray,
        passed: int,
    ) -> None:
        self.context = context
        self.header = header
        self.frame_size = frame_size
        self.body_offset = body_offset
        self.head = head
        self.passed = passed


class StreamData:
    """More bytes of the streaming response, for the client as they are."""

    __slots__ = ("data",)

    def __init__(self, data: memoryview) -> None:
        self.data = data


class StreamEnded(Generic[C]):
    """The streaming response's last bytes: its trailing tagged fields, rewritten to the
    same length."""

    __slots__ = ("body_offset", "context", "endpoints_rewritten", "frame_size", "header", "tail")

    def __init__(
        self,
        context: C,
        header: RequestHeader,
        frame_size: int,
        body_offset: int,
        tail: bytes,
        endpoints_rewritten: bool,
    ) -> None:
        self.context = context
        self.header = header
        self.frame_size = frame_size
        self.body_offset = body_offset
        self.tail = tail
        self.endpoints_rewritten = endpoints_rewritten


BrokerEvent = Response[C] | StreamStarted[C] | StreamData | StreamEnded[C]


class _Stream(Generic[C]):
    """The Fetch response being cut through; at most one, since responses are in order."""

    __slots__ = ("body_offset", "dropped", "entry", "frame_size", "parser", "remaining", "tail")

    def __init__(
        self,
        entry: _InFlight[C],  # already popped from the FIFO: its response has begun
        frame_size: int,  # without the size prefix
        body_offset: int,
        remaining: int,  # bytes of the frame the broker has still to send
        parser: FetchResponseStream,  # says how far the bytes seen so far may be passed on
        tail: bytearray,  # bytes held back: the trailing tagged fields, rewritten at the end
    ) -> None:
        self.entry = entry
        self.frame_size = frame_size
        self.body_offset = body_offset
        self.remaining = remaining
        self.parser = parser
        self.tail = tail
        self.dropped = False  # the client got another answer: the rest goes nowhere (`drop_stream`)


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
        # Whole request frames read from the client, not yet handed to the caller: they
        # wait here while the caller is muted or holding a request.
        self._queued: deque[bytes] = deque()
        # Requests forwarded or answered locally, oldest first (see "Correlation" above).
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
        """Forget the requests read but not yet handed on (shutdown: they were never
        forwarded, so the client retries them elsewhere as it would after a broker's close)."""
        self._queued.clear()

    @property
    def in_flight(self) -> int:
        """Requests forwarded or answered locally whose response the client has not had yet."""
        return len(self._in_flight)

    @property
    def forwarded_in_flight(self) -> bool:
        """Some request in flight went to the broker (its answer is still to come)."""
        return any(entry.local_answer is None for entry in self._in_flight)

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
        # Only the SASL requests are decoded here: the login must be observed in the order
        # the client sent it, whatever the hooks later do with the request.
        if api_key == SASL_HANDSHAKE_KEY:
            self.sasl.handshake(decode_body(api_key, header.api_version, body, is_request=True).mechanism)
        elif api_key == SASL_AUTHENTICATE_KEY:
            message = decode_body(api_key, header.api_version, body, is_request=True)
            self.sasl.authenticate_request(bytes(message.auth_bytes))
        return Request(header, frame, expects_response(api_key, header.api_version, body))

    def send_request(self, request: Request, context: C, frame: bytes | bytearray | None = None) -> Parts:
        """Forward the request (as `frame` if something changed it): returns what to write to
        the broker; its response (if it gets one) is due in this turn."""
        if request.expects_response:
            self._in_flight.append(_InFlight(request.header, context, None))
        out = request.frame if frame is None else frame
        return len(out).to_bytes(4, "big"), out  # `framed`, inlined: once per request

    def answer_locally(self, request: Request, context: C, answer: bytes) -> None:
        """The proxy answers the request itself; the answer leaves in the request's turn."""
        self._in_flight.append(_InFlight(request.header, context, answer))

    @property
    def local_answer_due(self) -> bool:
        """The oldest entry in flight is a local answer: its turn has come (`local_answers`)."""
        in_flight = self._in_flight
        return bool(in_flight) and in_flight[0].local_answer is not None

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

    @staticmethod
    def send_response(response: Response[C], frame: bytes | bytearray | None = None) -> Parts:
        """What to write to the client for a whole response (as `frame` if something changed it)."""
        out = response.frame if frame is None else frame
        return len(out).to_bytes(4, "big"), out  # `framed`, inlined: once per response

    @staticmethod
    def send_stream_head(event: StreamStarted[C]) -> Parts:
        """What to write to the client as a cut-through response starts: the size prefix
        announces the whole frame, though most of it is still to come. The head is copied
        because the caller may patch it in place and the transport may keep what it is given."""
        return event.frame_size.to_bytes(4, "big"), bytes(event.head[: event.passed])

    # ---- the broker's side -----------------------------------------------------------

    def broker_bytes(self, data: bytes) -> Iterator[BrokerEvent[C]]:
        """Take bytes from the broker; yields what goes to the client, in order. Raises
        ProtocolError (at the event it happens) on a bad or out-of-order response."""
        view = memoryview(data)
        # One chunk may end a streamed response and carry whole responses after it, or
        # complete frames and begin a large one: loop until every byte has a place.
        while view:
            stream = self._stream
            if stream is not None:
                # Bytes beyond the streamed frame's end belong to the next response.
                part, view = view[: stream.remaining], view[stream.remaining :]
                yield from self._stream_bytes(stream, part)
                continue
            frames = self._broker_frames.feed(view)
            view = view[:0]  # the decoder keeps what it did not complete
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
        # In Produce, ThrottleTimeMs follows every partition's result, so finding it is a
        # walk over the whole response; the address rewrite needs that walk anyway
        # (NodeEndpoints come after it), and the hooks reuse its result.
        if api_key == PRODUCE_KEY:
            # Not contextlib.suppress: a context manager costs three calls on every response.
            try:  # noqa: SIM105
                throttle_offset = throttle_field_offset(frame, body_offset, api_key, api_version)
            except ProtocolError:
                pass  # the rewrite below reads the response again and reports what is wrong
        out, rewritten = client_response(api_key, api_version, frame, body_offset, self._map_address,
                                         self._learn_metadata, produce_throttle_offset=throttle_offset)
        return Response(entry.context, header, out, body_offset, local=False, endpoints_rewritten=rewritten,
                        throttle_offset=throttle_offset if out is frame else None)

    def _match(self, correlation_id: int) -> _InFlight[C]:
        """Pop the oldest request in flight if `correlation_id` is its response's."""
        in_flight = self._in_flight
        # A local answer at the head means the broker owes nothing until it has been sent.
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
        # From here on the frame is the stream's: the decoder forgets it, and the request
        # leaves the FIFO now, since its response has begun going to the client.
        head = bytearray(frames.detach_incomplete())
        self._match(response_correlation_id(memoryview(head)))
        body_offset = response_body_offset(memoryview(head), FETCH_KEY, header.api_version)
        parser = FetchResponseStream(header.api_version)
        passed = body_offset + parser.feed(memoryview(head)[body_offset:])
        self._stream = _Stream(entry, size, body_offset, size - len(head), parser, head[passed:])
        return StreamStarted(entry.context, header, size, body_offset, head, passed)

    def drop_stream(self) -> None:
        """The response that just started streaming went to the client as another answer (a
        throttled Fetch answered empty): the rest of the broker's frame is read and dropped,
        and its end still comes as a `StreamEnded` (with no tail), the response's turn over."""
        assert self._stream is not None
        self._stream.dropped = True
        self._stream.tail.clear()

    def _stream_bytes(self, stream: _Stream[C], part: memoryview) -> Iterator[StreamData | StreamEnded[C]]:
        stream.remaining -= len(part)
        if stream.dropped:
            if not stream.remaining:
                self._stream = None
                entry = stream.entry
                yield StreamEnded(entry.context, entry.header, stream.frame_size, stream.body_offset, b"", False)
            return
        # The parser passes bytes up to the start of the trailing tagged fields; from there
        # on everything is held, since NodeEndpoints may have to be rewritten.
        passed = 0 if stream.parser.in_tail else stream.parser.feed(part)
        if passed:
            yield StreamData(part[:passed])
        if passed < len(part):
            stream.tail += part[passed:]
        if stream.remaining:
            return
        self._stream = None
        # The size prefix promised exactly this many bytes; a body that ends anywhere but
        # at (or in) its tagged fields was not the Fetch response its header announced.
        if not stream.parser.streams_whole and not stream.parser.in_tail:
            raise ProtocolDecodeError("Fetch response ended inside its structure")
        tail = bytes(stream.tail)
        rewritten = rewrite_fetch_tail(tail, self._map_address) if tail else tail
        entry = stream.entry
        yield StreamEnded(entry.context, entry.header, stream.frame_size, stream.body_offset, rewritten,
                          rewritten != tail)
