"""One client connection and its upstream connection: the sockets, flow control and timers.

The Kafka conversation itself (framing, request headers, requests in flight, matching
responses, SASL, rewriting, cut-through) is `kqp.protocol.session.KafkaSession`, which does
no IO; this module feeds it the bytes each side sends, calls the hooks on what comes out and
writes the results. Both sides are plain asyncio protocols (no streams: one less copy and no
task per connection).

With TLS termination the event loop completes the handshake before the connection is
accepted here, and the certificate of an mTLS client names the connection's principal
unless SASL (passed through to the broker) later names another, as on a broker's SASL_SSL
listener.

Flow control, for readers who know the broker's SocketServer
------------------------------------------------------------
A broker stops reading a connection by muting its channel (Kafka's KafkaChannel and its
ChannelMuteState): while a request of it is being handled, and, since KIP-219, for the
throttle time after a throttled response has been sent. The proxy cannot mute the broker's
channel for it, so it does the same on its own client socket: `pause_reading()` on the
client transport stops the proxy reading, the client's socket buffer fills and TCP pushes
back on the client, exactly as behind a muted broker channel.

Reading from the client is paused while `_client_blockers` is not empty. Each reason is
added and removed on its own, so one ending never resumes reading while another holds:

  connecting         from accept until an upstream broker connection is open.
  upstream-backlog   the upstream transport's write buffer passed write_buffer_high_bytes
                     (asyncio's pause_writing): the broker reads slower than the client
                     sends, so stop reading the client instead of buffering without bound.
  throttled          KIP-219 mute: set by `mute()`, cleared by the timer at `_muted_until`.
  held               a hook's `hold` future is pending (a partition mutation the fleet
                     orders): as on a broker, nothing behind a request in handling is read.
  shutdown           `drain()`: no new request is taken; in-flight ones are answered.
  in-handling        while the connection is read one request at a time (see
                     `_one_at_a_time_until`), a request is with the broker: a broker's
                     channel stays muted while it handles a request, so the client's next
                     requests wait in its own socket and queue, not in the proxy's memory.
                     Cleared when the last response in flight has been sent.

Requests the session had already framed stay queued in it while reading is paused
(`_process_pending` forwards nothing while any blocker holds), so a client that pipelined
requests before its throttle does not get them through during the mute.

The other direction has one reason, `client-backlog` in `_upstream_blockers`: the client's
transport is above its high-water mark because the client does not read its responses, so
the proxy stops reading the broker, and the broker's own send buffer fills, as if the client
were connected directly. The idle timeout does not count that time against the connection.

Timers and flags:

  _muted_until           event-loop time (s) the current mute ends. A mute only extends
                         it, never shortens it (a later, shorter throttle does not cut an
                         earlier, longer one), and the unmute timer is re-armed to it.
  _one_at_a_time_until   event-loop time (s) until which at most one request is in flight
                         to the broker: a new request waits until the previous response has
                         gone. A broker never processes two requests of one connection at
                         once, so a throttled client cannot pipeline past its throttle
                         there; the proxy forwards pipelined requests (the broker serialises
                         them), which would let a burst read before the throttle through.
                         Set by `mute()` to the mute's end plus ONE_AT_A_TIME_AFTER_THROTTLE_S
                         (one default quota span), and by a hook's verdict when the client
                         is throttled on another of its connections.
  _held                  a request waits for a hook's hold; `_drained` stays clear meanwhile.
  _stream_mute_ms        the mute decided when a cut-through response began (its
                         ThrottleTimeMs is in its head), applied only once its last byte
                         has gone: KIP-219 mutes after the throttled response is sent.
  _drained               set when the client is owed nothing: no request in flight to the
                         broker, no local answer waiting, none held. `drain()` (graceful
                         shutdown) waits for it.

A small state description of the client side:

  READING  --(any blocker added)--> PAUSED --(last blocker removed)--> READING
  READING  --(throttled response sent)--> PAUSED[throttled] --(timer at _muted_until)-->
           READING, but ONE-AT-A-TIME until _one_at_a_time_until
  any state --(close)--> CLOSED (timers cancelled, both transports closed, _drained set)

A throttle decided on a request (acks=0 Produce, which gets no response to carry it) mutes
right after the request is forwarded; one decided on a response mutes after that response
(or, for a local answer, after the answer) has been written.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import cast

from kqp.protocol.apis import SASL_AUTHENTICATE_KEY
from kqp.protocol.errors import ProtocolError
from kqp.protocol.sasl import ANONYMOUS, SaslObserver
from kqp.protocol.session import (
    KafkaSession,
    Request,
    Response,
    StreamData,
    StreamEnded,
    StreamStarted,
    TruncatedFrameError,
)
from kqp.proxy.cluster import BOOTSTRAP, ClusterDirectory, Listener
from kqp.proxy.hooks import ONE_AT_A_TIME_AFTER_THROTTLE_S, ClientView, Exchange, TrafficHooks
from kqp.proxy.options import ProxyOptions
from kqp.proxy.tls import CertificateParseError, ListenerTlsState, PrincipalMappingError
from kqp.proxy.topics import TopicDirectory

__all__ = ["ClientSide", "ConnectionServices", "ProxiedConnection", "TruncatedFrameError"]

log = logging.getLogger(__name__)

# Reasons in `_client_blockers` (see the module docstring): reading from the client is
# paused while any of them holds.
_CONNECTING = "connecting"
_UPSTREAM_BACKLOG = "upstream-backlog"
_THROTTLED = "throttled"
_SHUTDOWN = "shutdown"
_HELD = "held"
_IN_HANDLING = "in-handling"


def _size_prefix(frame: bytes | bytearray) -> bytes:
    """The int32 size that precedes every Kafka frame. Written beside the frame with
    `writelines` rather than concatenated, so a large frame is never copied to prepend it."""
    return len(frame).to_bytes(4, "big")


@dataclass(frozen=True, slots=True)
class ConnectionServices:
    """What a connection works with, shared by all connections of a proxy server."""

    loop: asyncio.AbstractEventLoop
    options: ProxyOptions
    directory: ClusterDirectory  # broker addresses and the proxy's listener for each
    topics: TopicDirectory  # topic names by id, learned from Metadata
    hooks: TrafficHooks
    listener_tls: ListenerTlsState | None
    upstream_ssl: Callable[[], ssl.SSLContext | None]  # the context for a new upstream connection
    closed: Callable[[ProxiedConnection, str], None]
    frame_rejected: Callable[[ProxiedConnection, str, ProtocolError], None]
    node_endpoints_rewritten: Callable[[int], None]  # by API key: KIP-951 endpoints rewritten
    unreadable_login: Callable[[ProxiedConnection, str], None]  # by mechanism: a principal the proxy cannot read


class ProxiedConnection:
    """A client's connection to one proxy listener, joined to one upstream broker
    connection: the listener of a broker's node id connects to that broker, the bootstrap
    listener to the first reachable bootstrap server. One upstream per client connection
    keeps Kafka's per-connection guarantees (ordering, one SASL login, KIP-219 mutes)."""

    def __init__(self, services: ConnectionServices, listener: Listener, connection_id: int) -> None:
        self.services = services
        self._loop = services.loop
        self._hooks = services.hooks
        self.listener = listener
        self.connection_id = connection_id
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.upstream_node_id: int | None = None if listener.node_id == BOOTSTRAP else listener.node_id
        self.peer = "?"
        self.peer_ip = "?"
        self.session: KafkaSession[Exchange] = KafkaSession(
            services.options.max_frame_bytes, services.directory.map_address, services.topics.learn_metadata,
            may_stream=self._may_stream, oauthbearer_sub_claim=services.options.oauthbearer_sub_claim,
        )
        # The mapped subject of an mTLS client certificate.
        self.tls_principal = ANONYMOUS
        # Whether the connection holds one of its IP's max_connections_per_ip slots.
        self.counted_per_ip = False
        # Event-loop time the first byte of a still incomplete request frame arrived: the
        # server closes a connection that sends a frame slower than frame_read_timeout_seconds
        # (a slow-loris client would otherwise hold a frame buffer forever).
        self.frame_started_at: float | None = None
        self.opened_at = time.time()
        # Event-loop time bytes last moved either way; the server's idle sweep reads it
        # (Kafka's connections.max.idle.ms).
        self.last_activity = self._loop.time()
        self._stream_mute_ms = 0  # the mute due once the streaming response has passed
        self._client_blockers: set[str] = set()
        self._upstream_blockers: set[str] = set()
        self._muted_until = 0.0
        self._one_at_a_time_until = 0.0
        self._unmute_handle: asyncio.TimerHandle | None = None
        self._hold_handle: asyncio.TimerHandle | None = None
        self._closed = False
        self._held = False  # a request waits for a hook's hold (see `hold` in kqp.proxy.hooks)
        self._drained = asyncio.Event()
        self._drained.set()  # nothing is owed to a connection that has sent nothing
        # What hooks see of this connection's client: replaced where the peer or principal changes.
        self.view = ClientView(connection_id, self.peer, listener.name, self.upstream_node_id, ANONYMOUS, self)

    # ---- lifecycle ------------------------------------------------------------------

    @property
    def sasl(self) -> SaslObserver:
        return self.session.sasl

    @property
    def principal(self) -> str:
        sasl = self.session.sasl
        if sasl.authenticated:
            return sasl.principal
        # A SASL login names the connection on a SASL_SSL listener, not the certificate; when
        # the proxy cannot read that name, the connection is ANONYMOUS to it.
        return ANONYMOUS if sasl.unreadable else self.tls_principal

    def _refresh_view(self) -> None:
        self.view = replace(self.view, principal=self.principal, peer=self.peer)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        return self.session.in_flight

    def client_connected(self, transport: asyncio.Transport) -> None:
        """The client's connection is accepted (after its TLS handshake, if any); nothing is read until `start()`."""
        self.client = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer_ip = str(peer[0])
            self.peer = f"{peer[0]}:{peer[1]}"
            self._refresh_view()
        transport.set_write_buffer_limits(high=self.services.options.write_buffer_high_bytes)
        self._block_client(_CONNECTING)
        self._hooks.connection_opened(self.view)

    def start(self) -> None:
        """Terminate TLS if the listener has it, then connect upstream and start forwarding."""
        # Not tracked: the task ends on its own (connected, failed or closed), and
        # `_connect_upstream` checks `_closed` after every await.
        self._loop.create_task(self._open())

    def hold_then_close(self, hold_ms: int, reason: str) -> None:
        """KIP-612: keep a throttled new connection open, unread, then close it, as a broker does.

        The broker (ConnectionQuotas) delays closing rather than refusing at once, so a client
        that reconnects in a loop is slowed to the connection_creation_rate instead of spinning.
        The connection was never started, so the client's reads stay paused (`connecting`)."""
        self._hold_handle = self._loop.call_later(hold_ms / 1000.0, self.close, reason)

    async def _open(self) -> None:
        if self.services.listener_tls is not None and not self._take_tls_principal():
            return
        await self._connect_upstream()

    def _take_tls_principal(self) -> bool:
        """The loop completed the TLS handshake before accepting; name the client by its certificate."""
        tls = self.services.listener_tls
        assert tls is not None and self.client is not None
        try:
            principal = tls.principal_of(cast("ssl.SSLObject | None", self.client.get_extra_info("ssl_object")))
        except (PrincipalMappingError, CertificateParseError) as exc:
            self.close(f"TLS client certificate rejected: {exc}", problem=True)
            return False
        if principal is not None:
            self.tls_principal = principal
            self._refresh_view()
        return True

    async def _connect_upstream(self) -> None:
        loop = self._loop
        if self.listener.node_id == BOOTSTRAP:
            # As a client does with bootstrap.servers: try each until one answers.
            candidates = self.services.directory.bootstrap_candidates()
        else:
            known = self.services.directory.upstream_of(self.listener.node_id)
            candidates = [known] if known is not None else []
        failure = "upstream address of this node is unknown"
        for host, port in candidates:
            if self._closed:
                return
            try:
                transport, _ = await asyncio.wait_for(
                    loop.create_connection(lambda: _UpstreamSide(self), host, port, ssl=self.services.upstream_ssl()),
                    self.services.options.upstream_connect_timeout_seconds,
                )
            except (OSError, TimeoutError) as exc:  # including failed TLS handshakes
                failure = f"{host}:{port}: {exc or type(exc).__name__}"
                log.warning("connection %d: upstream %s:%d unreachable: %s", self.connection_id, host, port, exc)
                continue
            if self._closed:
                transport.close()
                return
            self._unblock_client(_CONNECTING)
            # The client may have sent requests before the broker connection was up (they
            # were framed and queued, not read further).
            self._process_pending()
            return
        self.close(f"no upstream broker reachable ({failure})", problem=True)

    def upstream_connected(self, transport: asyncio.Transport) -> None:
        self.upstream = transport
        transport.set_write_buffer_limits(high=self.services.options.write_buffer_high_bytes)

    def close(self, reason: str, *, problem: bool = False) -> None:
        """Close both sides, once; `problem` logs it as a warning (a fault, not an ending)."""
        if self._closed:
            return
        self._closed = True
        level = logging.WARNING if problem else logging.DEBUG
        log.log(level, "connection %d from %s via %s closed: %s", self.connection_id, self.peer,
                self.listener.name, reason)
        for handle in (self._unmute_handle, self._hold_handle):
            if handle is not None:
                handle.cancel()
        # Closing one side closes the other: the client's requests in flight cannot be
        # answered on a new broker connection (correlation ids and SASL state are per
        # connection), so the client must see the failure and retry, as after a broker's close.
        for transport in (self.client, self.upstream):
            if transport is not None:
                transport.close()
        self._drained.set()
        self.services.closed(self, reason)

    async def drain(self) -> None:
        """Stop taking requests and wait for the ones in flight to be answered."""
        self._block_client(_SHUTDOWN)
        self.session.drop_queued_requests()
        await self._drained.wait()

    # ---- flow control ----------------------------------------------------------------

    def _block_client(self, reason: str) -> None:
        if not self._client_blockers and self.client is not None and not self._closed:
            self.client.pause_reading()
        self._client_blockers.add(reason)

    # pause_reading/resume_reading are called only on the edges (first blocker in, last
    # blocker out), so overlapping reasons never resume reading early.

    def _unblock_client(self, reason: str) -> None:
        self._client_blockers.discard(reason)
        if not self._client_blockers and self.client is not None and not self._closed:
            self.client.resume_reading()
            if self.frame_started_at is not None:
                # The rest of the frame could not be read while paused; its clock restarts.
                self.frame_started_at = self._loop.time()

    def block_upstream_reads(self) -> None:
        """The client's write buffer is full (it does not read its responses): stop reading
        the broker until it drains, so responses back up into the broker, not into memory."""
        if not self._upstream_blockers and self.upstream is not None and not self._closed:
            self.upstream.pause_reading()
        self._upstream_blockers.add("client-backlog")

    def unblock_upstream_reads(self) -> None:
        # The client is reading again: that is activity, whatever the idle clock said.
        self.last_activity = self._loop.time()
        self._upstream_blockers.discard("client-backlog")
        if not self._upstream_blockers and self.upstream is not None and not self._closed:
            self.upstream.resume_reading()

    @property
    def client_not_reading(self) -> bool:
        """Responses are waiting because the client does not read what it was sent."""
        return "client-backlog" in self._upstream_blockers

    @property
    def client_reads_paused(self) -> bool:
        return bool(self._client_blockers)

    def upstream_backlog(self, full: bool) -> None:
        if full:
            self._block_client(_UPSTREAM_BACKLOG)
        else:
            self._unblock_client(_UPSTREAM_BACKLOG)
            self._process_pending()

    def mute(self, throttle_ms: int, *, one_at_a_time: bool = True) -> None:
        """KIP-219: after a throttled response, read nothing from this client for a while.

        `one_at_a_time=False` mutes without the one-request-at-a-time span that follows a
        throttle on this connection itself (a cluster-wide budget throttled elsewhere)."""
        if throttle_ms <= 0 or self._closed:
            return
        loop = self._loop
        until = loop.time() + throttle_ms / 1000.0
        if until <= self._muted_until:
            return  # an earlier, longer mute already covers this one
        self._muted_until = until
        # A broker reads one request per connection at a time, so a throttled client's
        # pipelined requests wait in the socket. Do the same while it is being throttled,
        # or requests read before the throttle would all go through at once.
        if one_at_a_time:
            self._one_at_a_time_until = until + ONE_AT_A_TIME_AFTER_THROTTLE_S
        if self._unmute_handle is not None:
            self._unmute_handle.cancel()
        self._block_client(_THROTTLED)
        self._unmute_handle = loop.call_at(until, self._unmute)

    def read_one_request_at_a_time(self, seconds: float) -> None:
        """Forward one request at a time for a while: this client is being throttled, maybe on
        another connection, and a broker would not let it pipeline past its throttles."""
        until = self._loop.time() + seconds
        if until > self._one_at_a_time_until:
            self._one_at_a_time_until = until

    def _unmute(self) -> None:
        self._unmute_handle = None
        self._unblock_client(_THROTTLED)
        self._process_pending()

    @property
    def muted(self) -> bool:
        return _THROTTLED in self._client_blockers

    # ---- requests --------------------------------------------------------------------

    def client_data(self, data: bytes) -> None:
        """Bytes from the client: frame them, then forward what the blockers allow."""
        now = self.last_activity = self._loop.time()
        session = self.session
        try:
            completed = session.client_bytes(data)
        except ProtocolError as exc:
            self.services.frame_rejected(self, "client", exc)
            self.close(f"bad frame from client: {exc}", problem=True)
            return
        # The frame-read clock follows the frame in progress: cleared when no partial frame
        # is buffered, restarted when a new one began in this chunk.
        if not session.client_bytes_buffered:
            self.frame_started_at = None
        elif completed or self.frame_started_at is None:
            self.frame_started_at = now
        if completed:
            self._process_pending()

    def _process_pending(self) -> None:
        # Requests already read stay queued while the connection is blocked, so a muted
        # client gets nothing through even if it had pipelined requests.
        session = self.session
        while session.requests_queued and not self._client_blockers and not self._closed:
            if session.in_flight and self._one_at_a_time_until > self._loop.time():
                # Requests pipelined before the client was throttled are still in flight.
                self._block_client(_IN_HANDLING)
                return
            if session.local_answer_waiting:
                # Its throttle must hold the requests behind it: read no more until it is sent.
                return
            try:
                self._handle_request(session.next_request())
            except ProtocolError as exc:
                self.services.frame_rejected(self, "client", exc)
                self.close(f"bad request from client: {exc}", problem=True)
                return

    def client_lost(self, exc: Exception | None) -> None:
        # A client that disconnects mid-frame sent a truncated request: counted as a
        # rejected frame (kqp_frames_rejected_total), not as an ordinary disconnect.
        buffered = self.session.client_bytes_buffered
        if buffered and not self._closed:
            error = TruncatedFrameError(f"client went away {buffered} bytes into a frame")
            self.services.frame_rejected(self, "client", error)
            self.close(f"truncated frame from client: {error}", problem=True)
        else:
            self.close("client disconnected" if exc is None else f"client connection lost: {exc}")

    def _handle_request(self, request: Request) -> None:
        header = request.header
        frame = request.frame
        exchange = Exchange(
            header=header,
            request_bytes=len(frame) + 4,  # Kafka's request size includes the size prefix
            received_at=self._loop.time(),
            expects_response=request.expects_response,
        )
        wait = self._hooks.hold(self.view, exchange, frame)
        if wait is not None:
            # Nothing behind it is read until it is decided, and shutdown waits for it.
            self._block_client(_HELD)
            self._held = True
            self._drained.clear()
            wait.add_done_callback(lambda _done: self._release(request, exchange))
            return
        self._decide(request, exchange)

    def _release(self, request: Request, exchange: Exchange) -> None:
        """A hold ended: decide the held request, then read on (done callback of the hold)."""
        if self._closed:
            return
        self._held = False
        self._unblock_client(_HELD)
        self._decide(request, exchange)
        if not self.session.in_flight:
            self._drained.set()
        self._process_pending()

    def _decide(self, request: Request, exchange: Exchange) -> None:
        """Run the request hooks, then answer the request here or forward it (maybe changed)."""
        frame = request.frame
        verdict = self._hooks.request(self.view, exchange, frame)
        if verdict is not None and verdict.answer is not None:
            exchange.local_response = verdict.answer
            self.session.answer_locally(request, exchange, verdict.answer)
            self._drained.clear()
            self._flush_local_answers()
        else:
            out = frame if verdict is None or verdict.frame is None else verdict.frame
            upstream = self.upstream
            assert upstream is not None  # requests are only processed once connected
            upstream.writelines((_size_prefix(out), out))
            exchange.sent_at = self._loop.time()
            self.session.forwarded(request, exchange)
            if request.expects_response:
                self._drained.clear()
            else:
                # acks=0: no response will ever end this exchange, so the hooks close it now.
                self._hooks.unanswered(self.view, exchange)
        # A throttle decided on the request itself (acks=0 Produce has no response to carry
        # it) applies once the request is on its way.
        if verdict is not None:
            if verdict.one_at_a_time_s:
                self.read_one_request_at_a_time(verdict.one_at_a_time_s)
            if verdict.mute_ms:
                self.mute(verdict.mute_ms)
        if self.session.in_flight and self._one_at_a_time_until > self._loop.time():
            # As a broker mutes a channel while it handles one of its requests: without
            # this a client that pipelines (librdkafka writes requests as long as its socket
            # takes them) would move its whole backlog into the proxy's memory as small
            # requests, which then each wait out a throttle of their own.
            self._block_client(_IN_HANDLING)

    def _flush_local_answers(self) -> None:
        # A local answer leaves in its place among the forwarded responses, and its verdict
        # (throttle time, mute) applies exactly as for a forwarded one: requests pipelined
        # behind a throttled local answer wait out the mute, as on a broker (KIP-219).
        if self.client is not None:
            for response in self.session.local_answers():
                mute_ms = self._send_response(response)
                if mute_ms:
                    self.mute(mute_ms)
        if not self.session.in_flight and not self._held:
            self._drained.set()

    # ---- responses -------------------------------------------------------------------

    def _may_stream(self, exchange: Exchange) -> bool:
        # The session asks before cutting a Fetch response through (see KafkaSession).
        return not self._hooks.needs_whole_response(self.view, exchange)

    def upstream_data(self, data: bytes) -> None:
        self.last_activity = self._loop.time()
        try:
            for event in self.session.broker_bytes(data):
                if isinstance(event, StreamData):
                    self._write_client(event.data)
                elif isinstance(event, Response):
                    self._after_response(self._send_response(event))
                elif isinstance(event, StreamStarted):
                    self._stream_started(event)
                else:
                    self._stream_ended(event)
                if self._closed:
                    return
        except ProtocolError as exc:
            self.services.frame_rejected(self, "broker", exc)
            self.close(f"bad response from broker: {exc}", problem=True)

    def _write_client(self, data: memoryview | bytes) -> None:
        if self.client is not None:
            self.client.write(data)

    def _send_response(self, response: Response[Exchange]) -> int:
        """A whole response, forwarded or local: through the hooks, then to the client.
        Returns how long to mute the client after it (ms)."""
        exchange = response.context
        exchange.response_received_at = self._loop.time()
        header = response.header
        if response.endpoints_rewritten:
            self.services.node_endpoints_rewritten(header.api_key)
        if header.api_key == SASL_AUTHENTICATE_KEY and not response.local:
            # The session saw the broker's verdict on the login: hooks now see the principal
            # it named (quotas are per user from this response on, as on a broker).
            self._refresh_view()
            mechanism = self.session.sasl.take_unreadable_login()
            if mechanism is not None:
                self.services.unreadable_login(self, mechanism)
        exchange.response_throttle_offset = response.throttle_offset
        out: bytes | bytearray = response.frame
        verdict = self._hooks.response(self.view, exchange, response.frame, response.body_offset)
        if verdict is not None and verdict.frame is not None:
            out = verdict.frame
        client = self.client
        if client is not None:
            client.writelines((_size_prefix(out), out))
        return verdict.mute_ms if verdict is not None else 0

    def _stream_started(self, event: StreamStarted[Exchange]) -> None:
        exchange = event.context
        exchange.response_received_at = self._loop.time()
        verdict = self._hooks.response_started(self.view, exchange, event.head, event.body_offset, event.frame_size)
        self._stream_mute_ms = verdict.mute_ms if verdict is not None else 0
        client = self.client
        if client is not None:
            # The size prefix announces the whole frame, though most of it is still to come.
            client.writelines((event.frame_size.to_bytes(4, "big"), bytes(event.head[: event.passed])))

    def _stream_ended(self, event: StreamEnded[Exchange]) -> None:
        if event.tail:
            self._write_client(event.tail)
        if event.endpoints_rewritten:
            self.services.node_endpoints_rewritten(event.header.api_key)
        self._hooks.response_streamed(self.view, event.context, event.frame_size, event.body_offset)
        mute_ms, self._stream_mute_ms = self._stream_mute_ms, 0
        self._after_response(mute_ms)

    def _after_response(self, mute_ms: int) -> None:
        """A response went out: local answers that were waiting behind it follow, then its
        mute starts, then queued requests go on if nothing blocks them."""
        self._flush_local_answers()
        if mute_ms:
            self.mute(mute_ms)
        if _IN_HANDLING in self._client_blockers and (
            not self.session.in_flight or self._one_at_a_time_until <= self._loop.time()
        ):
            self._unblock_client(_IN_HANDLING)
        if self.session.requests_queued:
            self._process_pending()


class ClientSide(asyncio.Protocol):
    """The asyncio protocol of an accepted client socket; `accept` creates the connection
    (the server decides there whether to admit it: connection limits, KIP-612)."""

    def __init__(self, accept: Callable[[asyncio.Transport], ProxiedConnection]) -> None:
        self._accept = accept
        self.connection: ProxiedConnection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.connection = self._accept(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        if self.connection is not None:
            self.connection.client_data(data)

    def eof_received(self) -> bool:
        # Kafka has no half-close: a client that shut its sending side is gone; returning
        # False lets the transport close, which ends the connection.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.connection is not None:
            self.connection.client_lost(exc)

    def pause_writing(self) -> None:
        if self.connection is not None:
            self.connection.block_upstream_reads()

    def resume_writing(self) -> None:
        if self.connection is not None:
            self.connection.unblock_upstream_reads()


class _UpstreamSide(asyncio.Protocol):
    """The asyncio protocol of the proxy's connection to the broker."""

    def __init__(self, connection: ProxiedConnection) -> None:
        self._connection = connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._connection.upstream_connected(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        self._connection.upstream_data(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        # A broker closing an idle connection is routine (connections.max.idle.ms); closing
        # one with requests unanswered is worth a warning.
        problem = bool(self._connection.in_flight)
        reason = "broker closed the connection" if exc is None else f"broker connection lost: {exc}"
        self._connection.close(reason, problem=problem)

    def pause_writing(self) -> None:
        self._connection.upstream_backlog(True)

    def resume_writing(self) -> None:
        self._connection.upstream_backlog(False)
