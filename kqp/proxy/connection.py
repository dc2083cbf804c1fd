"""One client connection and its upstream connection: the sockets, flow control and timers.

The Kafka conversation itself (framing, request headers, requests in flight, matching
responses, SASL, rewriting, cut-through) is `kqp.protocol.session.KafkaSession`, which does
no IO; this module feeds it the bytes each side sends, calls the hooks on what comes out and
writes the results. Both sides are plain asyncio protocols (no streams: one less copy and no
task per connection). Reading from the client stops while any of these holds: the upstream
is not connected yet, the upstream's write buffer is full (back-pressure), the connection is
muted for a throttle (KIP-219), a request is held until a hook may decide it (a partition
mutation the fleet orders), or the proxy is shutting down.

With TLS termination the event loop completes the handshake before the connection is
accepted here, and the certificate of an mTLS client names the connection's principal unless SASL (passed
through to the broker) later names another, as on a broker's SASL_SSL listener.
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

_CONNECTING = "connecting"
_UPSTREAM_BACKLOG = "upstream-backlog"
_THROTTLED = "throttled"
_SHUTDOWN = "shutdown"
_HELD = "held"


def _size_prefix(frame: bytes | bytearray) -> bytes:
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


class ProxiedConnection:
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
            may_stream=self._may_stream,
        )
        # The mapped subject of an mTLS client certificate.
        self.tls_principal = ANONYMOUS
        # Whether the connection holds one of its IP's max_connections_per_ip slots.
        self.counted_per_ip = False
        # Event-loop time the first byte of a still incomplete request frame arrived.
        self.frame_started_at: float | None = None
        self.opened_at = time.time()
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
        self._drained.set()
        # What hooks see of this connection's client: replaced where the peer or principal changes.
        self.view = ClientView(connection_id, self.peer, listener.name, self.upstream_node_id, ANONYMOUS, self)

    # ---- lifecycle ------------------------------------------------------------------

    @property
    def sasl(self) -> SaslObserver:
        return self.session.sasl

    @property
    def principal(self) -> str:
        sasl = self.session.sasl
        return sasl.principal if sasl.authenticated else self.tls_principal

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
        self._loop.create_task(self._open())

    def hold_then_close(self, hold_ms: int, reason: str) -> None:
        """KIP-612: keep a throttled new connection open, unread, then close it, as a broker does."""
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
                    self.services.options.upstream_connect_timeout_s,
                )
            except (OSError, TimeoutError) as exc:  # including failed TLS handshakes
                failure = f"{host}:{port}: {exc or type(exc).__name__}"
                log.warning("connection %d: upstream %s:%d unreachable: %s", self.connection_id, host, port, exc)
                continue
            if self._closed:
                transport.close()
                return
            self._unblock_client(_CONNECTING)
            self._process_pending()
            return
        self.close(f"no upstream broker reachable ({failure})", problem=True)

    def upstream_connected(self, transport: asyncio.Transport) -> None:
        self.upstream = transport
        transport.set_write_buffer_limits(high=self.services.options.write_buffer_high_bytes)

    def close(self, reason: str, *, problem: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        level = logging.WARNING if problem else logging.DEBUG
        log.log(level, "connection %d from %s via %s closed: %s", self.connection_id, self.peer,
                self.listener.name, reason)
        for handle in (self._unmute_handle, self._hold_handle):
            if handle is not None:
                handle.cancel()
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

    def _unblock_client(self, reason: str) -> None:
        self._client_blockers.discard(reason)
        if not self._client_blockers and self.client is not None and not self._closed:
            self.client.resume_reading()
            if self.frame_started_at is not None:
                # The rest of the frame could not be read while paused; its clock restarts.
                self.frame_started_at = self._loop.time()

    def block_upstream_reads(self) -> None:
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
            return
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
        now = self.last_activity = self._loop.time()
        session = self.session
        try:
            completed = session.client_bytes(data)
        except ProtocolError as exc:
            self.services.frame_rejected(self, "client", exc)
            self.close(f"bad frame from client: {exc}", problem=True)
            return
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
            request_bytes=len(frame) + 4,
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
        if self._closed:
            return
        self._held = False
        self._unblock_client(_HELD)
        self._decide(request, exchange)
        if not self.session.in_flight:
            self._drained.set()
        self._process_pending()

    def _decide(self, request: Request, exchange: Exchange) -> None:
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
                self._hooks.unanswered(self.view, exchange)
        if verdict is not None:
            if verdict.one_at_a_time_s:
                self.read_one_request_at_a_time(verdict.one_at_a_time_s)
            if verdict.mute_ms:
                self.mute(verdict.mute_ms)

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
            self._refresh_view()
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
        self._flush_local_answers()
        if mute_ms:
            self.mute(mute_ms)
        if self.session.requests_queued:
            self._process_pending()


class ClientSide(asyncio.Protocol):
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
    def __init__(self, connection: ProxiedConnection) -> None:
        self._connection = connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._connection.upstream_connected(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        self._connection.upstream_data(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        problem = bool(self._connection.in_flight)
        reason = "broker closed the connection" if exc is None else f"broker connection lost: {exc}"
        self._connection.close(reason, problem=problem)

    def pause_writing(self) -> None:
        self._connection.upstream_backlog(True)

    def resume_writing(self) -> None:
        self._connection.upstream_backlog(False)
