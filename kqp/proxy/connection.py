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

The rules of when the client is read and when its next request is handed on (the blockers:
connecting, upstream backlog, throttled, held, shutdown, in handling; the mute deadline that
only extends; one request at a time after a throttle; the mute of a cut-through response
applied once it has passed; draining) are `kqp.protocol.gate.ClientGate`'s, written down
there with a state diagram and unit-tested without sockets. This module tells the gate what
happened and does what it answers (`_apply`): pause or resume reading the client, arm or
cancel the unmute timer, hand the next queued request on, end a graceful shutdown.

The other direction has one reason, `client-backlog` in `_upstream_blockers`: the client's
transport is above its high-water mark because the client does not read its responses, so
the proxy stops reading the broker, and the broker's own send buffer fills, as if the client
were connected directly. The idle timeout does not count that time against the connection.

What is written is framed by the session (`send_request`, `send_response`,
`send_stream_head`: the size prefix beside the frame, for `writelines`), so the bytes sent
are tested without sockets too.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import cast

from kqp.protocol.apis import SASL_AUTHENTICATE_KEY
from kqp.protocol.close_reason import CloseReason
from kqp.protocol.errors import ProtocolError, TruncatedFrameError
from kqp.protocol.gate import FORWARD, NOTHING, Actions, ClientGate
from kqp.protocol.sasl import ANONYMOUS, SaslObserver
from kqp.protocol.session import (
    BrokerEvent,
    KafkaSession,
    Request,
    Response,
    StreamData,
    StreamEnded,
    StreamStarted,
    framed,
)
from kqp.proxy.cluster import BOOTSTRAP, ClusterDirectory, Listener
from kqp.proxy.hooks import ClientView, Exchange, TrafficHooks
from kqp.proxy.options import ProxyOptions
from kqp.proxy.tls import CertificateParseError, ListenerTlsState, PrincipalMappingError
from kqp.proxy.topics import TopicDirectory

__all__ = ["ClientSide", "ConnectionServices", "ProxiedConnection", "TruncatedFrameError"]

log = logging.getLogger(__name__)

# The client went away while the broker side is sound. A broker records a request it was
# handling when its client left (the produce response callback records, then finds the
# channel gone), so the proxy waits for the broker's answers to what it forwarded, charges
# them through the hooks and drops them, before it closes the broker connection.
_CLIENT_LEFT = frozenset({
    CloseReason.CLIENT_DISCONNECTED, CloseReason.CLIENT_CONNECTION_LOST, CloseReason.TRUNCATED_FRAME_FROM_CLIENT,
})
# How long those answers are waited for at most: a client's default request.timeout.ms.
DEPARTED_CLIENT_ANSWERS_WAIT_S = 30.0


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
    closed: Callable[[ProxiedConnection, CloseReason], None]
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
        # When the client is read and its requests handed on (kqp.protocol.gate).
        self._gate = ClientGate()
        self._upstream_blockers: set[str] = set()
        self._unmute_handle: asyncio.TimerHandle | None = None
        self._hold_handle: asyncio.TimerHandle | None = None
        # A response a hook holds (`hold_response`) and every broker event behind it, in order;
        # None while nothing is held.
        self._held_events: deque[BrokerEvent[Exchange]] | None = None
        # The size of the answer that replaced the response streaming in (a throttled Fetch
        # answered empty), while the rest of the broker's frame is dropped; None otherwise.
        self._stream_answered_size: int | None = None
        # Set when a graceful shutdown may end; made by `drain()`, the only one to wait on it.
        self._drained: asyncio.Event | None = None
        # Set while the broker's answers to a departed client's forwarded requests are awaited:
        # how the connection then closes (reason, detail, problem) and the timer bounding it.
        self._departure: tuple[CloseReason, str, bool] | None = None
        self._departure_timer: asyncio.TimerHandle | None = None
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
        return self._gate.closed

    @property
    def in_flight(self) -> int:
        return self.session.in_flight

    def client_connected(self, transport: asyncio.Transport, client_address: tuple[str, int] | None = None) -> None:
        """The client's connection is accepted (after its TLS handshake, if any); nothing is read until `start()`.

        `client_address` is the client's own, from a balancer's PROXY header; without one the
        socket's peer is the client."""
        self.client = transport
        peer = client_address or transport.get_extra_info("peername")
        if peer:
            self.peer_ip = str(peer[0])
            self.peer = f"{peer[0]}:{peer[1]}"
            self._refresh_view()
        transport.set_write_buffer_limits(high=self.services.options.write_buffer_high_bytes)
        self._apply(self._gate.accepted())
        self._hooks.connection_opened(self.view)

    def start(self) -> None:
        """Terminate TLS if the listener has it, then connect upstream and start forwarding."""
        # Not tracked: the task ends on its own (connected, failed or closed), and
        # `_connect_upstream` checks `closed` after every await.
        self._loop.create_task(self._open())

    def hold_then_close(self, hold_ms: int) -> None:
        """KIP-612: keep a throttled new connection open, unread, then close it, as a broker does.

        The broker (ConnectionQuotas) delays closing rather than refusing at once, so a client
        that reconnects in a loop is slowed to the connection_creation_rate instead of spinning.
        The connection was never started, so the client's reads stay paused (connecting)."""
        self._hold_handle = self._loop.call_later(hold_ms / 1000.0, self.close, CloseReason.CONNECTION_RATE,
                                                  f"held {hold_ms} ms")

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
            self.close(CloseReason.TLS_CERTIFICATE_REJECTED, str(exc), problem=True)
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
            if self.closed:
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
            if self.closed:
                transport.close()
                return
            self._apply(self._gate.upstream_open())
            # The client may have sent requests before the broker connection was up (they
            # were framed and queued, not read further).
            self._process_pending()
            return
        self.close(CloseReason.NO_UPSTREAM_REACHABLE, failure, problem=True)

    def upstream_connected(self, transport: asyncio.Transport) -> None:
        self.upstream = transport
        transport.set_write_buffer_limits(high=self.services.options.write_buffer_high_bytes)

    def close(self, reason: CloseReason, detail: str = "", *, problem: bool = False) -> None:
        """Close both sides, once; `problem` logs it as a warning (a fault, not an ending).
        `detail` (an address, a limit, the error) goes to the log only: the metric's label is
        the reason's, so it stays bounded."""
        if (reason in _CLIENT_LEFT and self._departure is None and self.upstream is not None
                and self.session.forwarded_in_flight and not self.closed):
            self._await_departed_client_answers(reason, detail, problem)
            return
        actions = self._gate.close()
        if actions is NOTHING:
            return  # closed already
        if self._departure_timer is not None:
            self._departure_timer.cancel()
        level = logging.WARNING if problem else logging.DEBUG
        log.log(level, "connection %d from %s via %s closed: %s%s", self.connection_id, self.peer,
                self.listener.name, reason.label, f" ({detail})" if detail else "")
        self._apply(actions)  # the unmute timer, and a shutdown waiting for this connection
        if self._hold_handle is not None:
            self._hold_handle.cancel()
        # Closing one side closes the other: the client's requests in flight cannot be
        # answered on a new broker connection (correlation ids and SASL state are per
        # connection), so the client must see the failure and retry, as after a broker's close.
        for transport in (self.client, self.upstream):
            if transport is not None:
                transport.close()
        self.services.closed(self, reason)

    def _await_departed_client_answers(self, reason: CloseReason, detail: str, problem: bool) -> None:
        """The client left with requests at the broker: charge their answers, then close.

        Kafka's broker records the request it is handling even when the client has gone, so
        its bytes count against the quota; the proxy forwarded them, so the broker handles
        them too, and only their answers tell the proxy what Kafka would have recorded. The
        requests read but not forwarded are dropped, as a broker drops the unread bytes of a
        closed socket."""
        self._departure = (reason, detail, problem)
        self.session.drop_queued_requests()
        if self.client is not None:
            self.client.close()
            self.client = None
        # Nobody will read what the client is owed: its backlog no longer holds the broker back.
        self.unblock_upstream_reads("client-backlog")
        self._departure_timer = self._loop.call_later(DEPARTED_CLIENT_ANSWERS_WAIT_S, self._close_departed)

    def _close_departed(self) -> None:
        departure = self._departure
        if departure is not None:
            reason, detail, problem = departure
            self.close(reason, detail, problem=problem)

    async def drain(self) -> None:
        """Stop taking requests and wait for the ones in flight to be answered."""
        if self._drained is None:
            self._drained = asyncio.Event()
        self._apply(self._gate.drain(self.session.in_flight))
        # Never forwarded, so the client retries them elsewhere, as after a broker's close.
        self.session.drop_queued_requests()
        await self._drained.wait()

    # ---- flow control ----------------------------------------------------------------

    def _apply(self, actions: Actions) -> None:
        """Do what the gate answered. Pausing and resuming come only on the edges (first
        blocker in, last out), so overlapping reasons never resume reading early."""
        client = self.client
        if actions.pause_reading:
            if client is not None:
                client.pause_reading()
        elif actions.resume_reading and client is not None:
            client.resume_reading()
            if self.frame_started_at is not None:
                # The rest of the frame could not be read while paused; its clock restarts.
                self.frame_started_at = self._loop.time()
        if actions.unmute_at is not None or actions.cancel_unmute:
            if self._unmute_handle is not None:
                self._unmute_handle.cancel()
                self._unmute_handle = None
            if actions.unmute_at is not None:
                self._unmute_handle = self._loop.call_at(actions.unmute_at, self._unmute)
        if actions.drained and self._drained is not None:
            self._drained.set()

    def block_upstream_reads(self, reason: str = "client-backlog") -> None:
        """Stop reading the broker until every reason is gone. "client-backlog": the client's
        write buffer is full (it does not read its responses), so responses back up into the
        broker, not into memory; "response-held": a hook holds a response (`hold_response`)."""
        if not self._upstream_blockers and self.upstream is not None and not self.closed:
            self.upstream.pause_reading()
        self._upstream_blockers.add(reason)

    def unblock_upstream_reads(self, reason: str = "client-backlog") -> None:
        # The client is reading again: that is activity, whatever the idle clock said.
        self.last_activity = self._loop.time()
        self._upstream_blockers.discard(reason)
        if not self._upstream_blockers and self.upstream is not None and not self.closed:
            self.upstream.resume_reading()

    @property
    def client_not_reading(self) -> bool:
        """Responses are waiting because the client does not read what it was sent."""
        return "client-backlog" in self._upstream_blockers

    @property
    def client_reads_paused(self) -> bool:
        return self._gate.reads_paused

    def upstream_backlog(self, full: bool) -> None:
        self._apply(self._gate.upstream_backlog(full))
        if not full:
            self._process_pending()

    def mute(self, throttle_ms: int, *, one_at_a_time: bool = True) -> None:
        """KIP-219: after a throttled response, read nothing from this client for a while.

        `one_at_a_time=False` mutes without the one-request-at-a-time span that follows a
        throttle on this connection itself (a cluster-wide budget throttled elsewhere)."""
        if throttle_ms > 0:
            self._apply(self._gate.mute(self._loop.time(), throttle_ms, one_at_a_time=one_at_a_time))

    def _unmute(self) -> None:
        self._unmute_handle = None
        self._apply(self._gate.unmute())
        self._process_pending()

    @property
    def muted(self) -> bool:
        return self._gate.muted

    # ---- requests --------------------------------------------------------------------

    def client_data(self, data: bytes) -> None:
        """Bytes from the client: frame them, then forward what the gate allows."""
        now = self.last_activity = self._loop.time()
        session = self.session
        try:
            completed = session.client_bytes(data)
        except ProtocolError as exc:
            self.services.frame_rejected(self, "client", exc)
            self.close(CloseReason.BAD_FRAME_FROM_CLIENT, str(exc), problem=True)
            return
        # The frame-read clock follows the frame in progress: cleared when no partial frame
        # is buffered, restarted when a new one began in this chunk.
        if not session.client_bytes_buffered:
            self.frame_started_at = None
        elif completed or self.frame_started_at is None:
            self.frame_started_at = now
        if completed:
            self._process_pending(now)

    def _process_pending(self, now: float | None = None) -> None:
        """Hand on the queued requests the gate lets through. `now`: the event loop's time,
        when the caller has just read it (the loop's clock stands still within one callback)."""
        # Requests already read stay queued while the gate says no, so a muted client gets
        # nothing through even if it had pipelined requests.
        session = self.session
        gate = self._gate
        if now is None:
            now = self._loop.time()
        while session.requests_queued:
            actions = gate.next_request(now, session.in_flight, session.local_answer_waiting)
            if actions is not FORWARD:
                if actions is not NOTHING:
                    self._apply(actions)
                return
            try:
                self._handle_request(session.next_request(), now)
            except ProtocolError as exc:
                self.services.frame_rejected(self, "client", exc)
                self.close(CloseReason.BAD_REQUEST_FROM_CLIENT, str(exc), problem=True)
                return

    def client_lost(self, exc: Exception | None) -> None:
        # A client that disconnects mid-frame sent a truncated request: counted as a
        # rejected frame (kqp_frames_rejected_total), not as an ordinary disconnect.
        buffered = self.session.client_bytes_buffered
        if buffered and not self.closed:
            error = TruncatedFrameError(f"client went away {buffered} bytes into a frame")
            self.services.frame_rejected(self, "client", error)
            self.close(CloseReason.TRUNCATED_FRAME_FROM_CLIENT, str(error), problem=True)
        elif exc is None:
            self.close(CloseReason.CLIENT_DISCONNECTED)
        else:
            self.close(CloseReason.CLIENT_CONNECTION_LOST, str(exc))

    def _handle_request(self, request: Request, now: float) -> None:
        header = request.header
        frame = request.frame
        exchange = Exchange(
            header=header,
            request_bytes=len(frame) + 4,  # Kafka's request size includes the size prefix
            received_at=now,
            expects_response=request.expects_response,
        )
        wait = self._hooks.hold(self.view, exchange, frame)
        if wait is not None:
            # Nothing behind it is read until it is decided, and shutdown waits for it.
            self._apply(self._gate.hold())
            wait.add_done_callback(lambda _done: self._release(request, exchange))
            return
        self._decide(request, exchange)

    def _release(self, request: Request, exchange: Exchange) -> None:
        """A hold ended: decide the held request, then read on (done callback of the hold)."""
        if self.closed:
            return
        self._apply(self._gate.release())
        self._decide(request, exchange)
        self._process_pending()

    def _decide(self, request: Request, exchange: Exchange) -> None:
        """Run the request hooks, then answer the request here or forward it (maybe changed)."""
        frame = request.frame
        verdict = self._hooks.request(self.view, exchange, frame)
        if verdict is not None and verdict.answer is not None:
            exchange.local_response = verdict.answer
            self.session.answer_locally(request, exchange, verdict.answer)
            self._flush_local_answers()
            now = self._loop.time()
        else:
            out = frame if verdict is None or verdict.frame is None else verdict.frame
            upstream = self.upstream
            assert upstream is not None  # requests are only processed once connected
            upstream.writelines(self.session.send_request(request, exchange, out))
            now = exchange.sent_at = self._loop.time()
            if not request.expects_response:
                # acks=0: no response will ever end this exchange, so the hooks close it now.
                self._hooks.unanswered(self.view, exchange)
        # A throttle decided on the request itself (acks=0 Produce has no response to carry
        # it) applies once the request is on its way; the gate also reads one request at a
        # time from here if the connection is in its span after a throttle.
        in_flight = self.session.in_flight
        if verdict is None:
            actions = self._gate.decided(now, in_flight)
        else:
            actions = self._gate.decided(now, in_flight, verdict.mute_ms, verdict.one_at_a_time_s)
        if actions is not NOTHING:
            self._apply(actions)

    def _flush_local_answers(self) -> None:
        # A local answer leaves in its place among the forwarded responses, and its verdict
        # (throttle time, mute) applies exactly as for a forwarded one: requests pipelined
        # behind a throttled local answer wait out the mute, as on a broker (KIP-219).
        if self.client is not None or self._departure is not None:
            for response in self.session.local_answers():
                mute_ms = self._send_response(response)
                if mute_ms:
                    self.mute(mute_ms)

    # ---- responses -------------------------------------------------------------------

    def _may_stream(self, exchange: Exchange) -> bool:
        # The session asks before cutting a Fetch response through (see KafkaSession).
        return not self._hooks.needs_whole_response(self.view, exchange)

    def upstream_data(self, data: bytes) -> None:
        # Every response in this chunk arrived now (KIP-124's round trip ends here).
        now = self.last_activity = self._loop.time()
        try:
            events = self.session.broker_bytes(data)
            if self._held_events is not None:
                self._held_events.extend(events)  # behind the held response, in order
            else:
                self._deliver(events, now)
        except ProtocolError as exc:
            self.services.frame_rejected(self, "broker", exc)
            self.close(CloseReason.BAD_RESPONSE_FROM_BROKER, str(exc), problem=True)

    def _deliver(self, events: Iterable[BrokerEvent[Exchange]], now: float | None = None) -> None:
        """The broker's events to the client, in order, until a hook holds a response. `now`:
        when they arrived, if the caller has just read the loop's clock."""
        pending = iter(events)
        for event in pending:
            if isinstance(event, Response):
                wait = self._hooks.hold_response(self.view, event.context, event.frame, event.body_offset)
                if wait is not None:
                    # The hook's work runs off the loop: this connection sends nothing behind the
                    # response meanwhile (responses keep their requests' order) and reads no more
                    # from the broker; every other connection goes on being served.
                    self._held_events = deque((event,))
                    self._held_events.extend(pending)
                    self.block_upstream_reads("response-held")
                    wait.add_done_callback(lambda _done: self._release_responses())
                    return
                self._after_response(self._send_response(event, now), now=now)
            elif isinstance(event, StreamData):
                self._write_client(event.data)
            elif isinstance(event, StreamStarted):
                self._stream_started(event)
            else:
                self._stream_ended(event)
            if self.closed:
                return

    def _release_responses(self) -> None:
        """A held response's wait ended: send it, then what queued behind it (done callback)."""
        held, self._held_events = self._held_events, None
        if self.closed or held is None:
            return
        self.unblock_upstream_reads("response-held")
        response = held.popleft()
        assert isinstance(response, Response)
        self._after_response(self._send_response(response))
        if not self.closed:
            self._deliver(held)

    def _write_client(self, data: memoryview | bytes) -> None:
        if self.client is not None:
            self.client.write(data)

    def _send_response(self, response: Response[Exchange], now: float | None = None) -> int:
        """A whole response, forwarded or local: through the hooks, then to the client.
        Returns how long to mute the client after it (ms). `now`: when it arrived, if known."""
        exchange = response.context
        exchange.response_received_at = self._loop.time() if now is None else now
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
            client.writelines(self.session.send_response(response, out))
        return verdict.mute_ms if verdict is not None else 0

    def _stream_started(self, event: StreamStarted[Exchange]) -> None:
        exchange = event.context
        exchange.response_received_at = self._loop.time()
        verdict = self._hooks.response_started(self.view, exchange, event.head, event.body_offset, event.frame_size)
        client = self.client
        if verdict is not None and verdict.frame is not None:
            # Throttled: the client gets the empty answer now, as from a broker, and its mute
            # starts once it is sent (KIP-219); the broker's frame is read on and dropped.
            self.session.drop_stream()
            self._stream_answered_size = len(verdict.frame)
            self._gate.stream_started(0)
            if client is not None:
                client.writelines(framed(verdict.frame))
            self.mute(verdict.mute_ms)
            return
        # KIP-219 mutes after the throttled response is sent: the gate keeps it until the end.
        self._gate.stream_started(verdict.mute_ms if verdict is not None else 0)
        if client is not None:
            client.writelines(self.session.send_stream_head(event))

    def _stream_ended(self, event: StreamEnded[Exchange]) -> None:
        if event.tail:
            self._write_client(event.tail)
        if event.endpoints_rewritten:
            self.services.node_endpoints_rewritten(event.header.api_key)
        # The hooks hear the size of what the client got: the empty answer, when it replaced the stream.
        frame_size = event.frame_size if self._stream_answered_size is None else self._stream_answered_size
        self._stream_answered_size = None
        self._hooks.response_streamed(self.view, event.context, frame_size, event.body_offset)
        self._after_response(streamed=True)

    def _after_response(self, mute_ms: int = 0, *, streamed: bool = False, now: float | None = None) -> None:
        """A response went out: local answers that were waiting behind it follow, then its
        mute starts (a streamed one's, kept by the gate since it started), then queued
        requests go on if nothing blocks them."""
        session = self.session
        if session.local_answer_due:
            self._flush_local_answers()
        if self._departure is not None:
            if not session.forwarded_in_flight:
                self._close_departed()
            return
        gate = self._gate
        if now is None:
            now = self._loop.time()
        actions = gate.stream_ended(now, session.in_flight) if streamed else gate.response_sent(
            now, session.in_flight, mute_ms)
        if actions is not NOTHING:
            self._apply(actions)
        if session.requests_queued:
            self._process_pending(now)


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
        if exc is None:
            self._connection.close(CloseReason.BROKER_CLOSED, problem=problem)
        else:
            self._connection.close(CloseReason.BROKER_CONNECTION_LOST, str(exc), problem=problem)

    def pause_writing(self) -> None:
        self._connection.upstream_backlog(True)

    def resume_writing(self) -> None:
        self._connection.upstream_backlog(False)
