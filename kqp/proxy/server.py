"""The proxy process: listeners, connections, discovery, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import socket
import ssl
from collections.abc import Callable

from kqp.protocol.apis import METADATA_KEY, api_name
from kqp.protocol.close_reason import CloseReason
from kqp.protocol.codec import decode_body
from kqp.protocol.errors import CorrelationError, FrameTooLargeError, ProtocolError, UnsupportedApiError
from kqp.protocol.framing import FrameDecoder, frame
from kqp.protocol.headers import encode_request_header, response_body_offset, response_correlation_id
from kqp.protocol.proxy_header import (
    ProxyHeader,
    ProxyHeaderError,
    Refusal,
    TrustedNetworks,
    begins_header,
    read_header,
    refusal,
)
from kqp.proxy.cluster import BOOTSTRAP, ClusterDirectory, Listener
from kqp.proxy.connection import ClientSide, ConnectionServices, ProxiedConnection, TruncatedFrameError
from kqp.proxy.hooks import TrafficHooks
from kqp.proxy.logins import UnreadableLogins
from kqp.proxy.options import ProxyOptions
from kqp.proxy.tls import (
    ListenerTlsState,
    ReloadingContext,
    SniSelector,
    handshake_started,
    upstream_context,
    upstream_files,
)
from kqp.proxy.topics import TopicDirectory

log = logging.getLogger(__name__)

_IDLE_SCAN_INTERVAL_S = 5.0
_DISCOVERY_METADATA_VERSION = 12
_DISCOVERY_CORRELATION_ID = 1
# A Metadata answer naming no topics is a few KB even for hundreds of brokers; a size prefix
# beyond this is not a Kafka broker talking, and is refused before anything is allocated.
_DISCOVERY_MAX_FRAME_BYTES = 8 * 1024 * 1024

# An IP address -> milliseconds to hold a new connection from it before closing it (0: accept).
AcceptThrottle = Callable[[str], int]
# A client's own address from a balancer's PROXY header; None: the socket's peer is the client.
ClientAddress = tuple[str, int] | None
# Bytes looked at (without taking them) per read of a PROXY header: a v1 header and a v2 one
# with IPv6 addresses and a few TLVs fit; longer v2 headers take more reads.
_HEADER_PEEK_BYTES = 512


class _HeaderRefused(Exception):
    def __init__(self, reason: Refusal, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class _ClosedBeforeSending(Exception):
    """The peer closed without sending a byte: a balancer's TCP health check, not a fault."""


def rejection_kind(side: str, error: ProtocolError) -> str:
    """A short, bounded label for why a frame was refused (the metric's `reason`)."""
    if isinstance(error, FrameTooLargeError):
        kind = "oversized"
    elif isinstance(error, TruncatedFrameError):
        kind = "truncated"
    elif isinstance(error, UnsupportedApiError):
        kind = "unsupported"
    elif isinstance(error, CorrelationError):
        kind = "out-of-order"
    else:
        kind = "malformed"
    return f"{kind} {'request' if side == 'client' else 'response'}"


async def _read_one_frame(reader: asyncio.StreamReader) -> bytes:
    """The first whole frame from `reader`, through the same framing as the data path."""
    decoder = FrameDecoder(_DISCOVERY_MAX_FRAME_BYTES)
    while True:
        data = await reader.read(65536)
        if not data:
            raise TruncatedFrameError(f"broker closed the connection {decoder.buffered_bytes} bytes into its answer")
        frames = decoder.feed(data)
        if frames:
            return frames[0]


class ProxyServer:
    def __init__(
        self,
        options: ProxyOptions,
        hooks: TrafficHooks | None = None,
        *,
        topics: TopicDirectory | None = None,
        accept_throttle: AcceptThrottle | None = None,
        on_frame_rejected: Callable[[str], None] | None = None,
        on_node_endpoints_rewritten: Callable[[str], None] | None = None,
        on_unreadable_login: Callable[[str], None] | None = None,
        on_proxy_header_refused: Callable[[str], None] | None = None,
    ) -> None:
        self.options = options
        self.hooks = hooks or TrafficHooks()
        # KIP-612 connection_creation_rate, asked for each accepted connection.
        self.accept_throttle = accept_throttle
        self.on_frame_rejected = on_frame_rejected
        # Told the API name each time a Produce/Fetch/ShareFetch/ShareAcknowledge response's
        # NodeEndpoints (KIP-951) are rewritten: the rare path a leader change takes.
        self.on_node_endpoints_rewritten = on_node_endpoints_rewritten
        # Told the mechanism of each connection whose SASL login the proxy cannot read.
        self.unreadable_logins = UnreadableLogins(on_unreadable_login)
        # Told the reason label of each connection refused for its PROXY header (or its lack).
        self.on_proxy_header_refused = on_proxy_header_refused
        proxy_protocol = options.proxy_protocol
        self.trusted_balancers = (TrustedNetworks(proxy_protocol.trusted_networks)
                                  if proxy_protocol is not None and proxy_protocol.enabled else None)
        self.directory = ClusterDirectory(options, self._serve_listener)
        routes = options.sni_routes
        sni = SniSelector(routes, self.directory.is_known) if routes is not None else None
        self.listener_tls = ListenerTlsState(options.tls, sni) if options.tls is not None else None
        if sni is not None and self.listener_tls is None:
            raise ValueError("SNI routing needs TLS termination at the proxy (proxy.tls)")
        # SNI routing: the listener each routed node's connections belong to (all on one port).
        self._routed: dict[int, Listener] = {}
        self.upstream_tls: ReloadingContext | None = None
        if options.upstream_tls is not None:
            self.upstream_tls = ReloadingContext("upstream TLS", upstream_files(options.upstream_tls),
                                                 functools.partial(upstream_context, options.upstream_tls))
        self.loop = asyncio.get_running_loop()
        self.topics = topics if topics is not None else TopicDirectory()
        self.connections: set[ProxiedConnection] = set()
        self._servers: list[asyncio.Server] = []
        self._server_tasks: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self._per_ip: dict[str, int] = {}
        self._idle_task: asyncio.Task[None] | None = None
        self._certificate_task: asyncio.Task[None] | None = None
        # TLS listeners accept here, so each handshake can use the context current at that moment.
        self._accept_tasks: set[asyncio.Task[None]] = set()
        self._handshakes: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._services = ConnectionServices(
            self.loop, options, self.directory, self.topics, self.hooks, self.listener_tls, self.upstream_ssl,
            self.connection_closed, self.frame_rejected, self.node_endpoints_rewritten, self.unreadable_login,
        )

    @property
    def bootstrap_port(self) -> int:
        return self.directory.listeners[BOOTSTRAP].port

    async def start(self) -> None:
        self.directory.open_listener(BOOTSTRAP, self.options.bootstrap_port)
        await self.discover_brokers()
        await asyncio.gather(*self._server_tasks)
        self._idle_task = self.loop.create_task(self._close_idle_connections())
        if self.listener_tls is not None or self.upstream_tls is not None:
            self._certificate_task = self.loop.create_task(self._watch_certificates())

    def upstream_ssl(self) -> ssl.SSLContext | None:
        """The context for a new upstream connection, None for plaintext."""
        return self.upstream_tls.context if self.upstream_tls is not None else None

    def check_certificates(self) -> None:
        """Rebuild the TLS contexts whose files changed; new connections get the new ones."""
        if self.listener_tls is not None:
            self.listener_tls.reloading.check()
        if self.upstream_tls is not None:
            self.upstream_tls.check()

    async def _watch_certificates(self) -> None:
        while True:
            await asyncio.sleep(self.options.certificate_check_interval_seconds)
            self.check_certificates()

    def _client_side(self, listener: Listener, client_address: ClientAddress = None) -> ClientSide:
        if self.listener_tls is not None and self.listener_tls.sni is not None:
            return ClientSide(functools.partial(self._routed_connection_accepted, client_address=client_address))
        return ClientSide(functools.partial(self.connection_accepted, listener, client_address=client_address))

    def _routed_connection_accepted(self, transport: asyncio.Transport,
                                    client_address: ClientAddress = None) -> ProxiedConnection:
        """SNI routing: the connection belongs to the node its TLS server name chose."""
        assert self.listener_tls is not None and self.listener_tls.sni is not None
        node = self.listener_tls.sni.node_of(transport.get_extra_info("ssl_object"))
        bootstrap = self.directory.listeners[BOOTSTRAP]
        if node is None:
            # The SNI callback refuses every handshake it routes nowhere; this is a safety net.
            connection = ProxiedConnection(self._services, bootstrap, next(self._ids))
            self.connections.add(connection)
            connection.client_connected(transport, client_address)
            connection.close(CloseReason.SNI_NO_NODE, problem=True)
            return connection
        listener = self._routed.get(node)
        if listener is None:
            listener = self._routed[node] = bootstrap if node == BOOTSTRAP else Listener(node, bootstrap.port)
        return self.connection_accepted(listener, transport, client_address)

    def _serve_listener(self, listener: Listener, sock: socket.socket) -> None:
        if self.listener_tls is not None or self.trusted_balancers is not None:
            # Each connection's TLS handshake, or PROXY header, comes before the connection.
            self._accept_tasks.add(self.loop.create_task(self._accept_one_by_one(listener, sock)))
            return

        async def serve() -> None:
            server = await self.loop.create_server(lambda: self._client_side(listener), sock=sock)
            self._servers.append(server)

        task = self.loop.create_task(serve())
        self._server_tasks.add(task)
        task.add_done_callback(self._server_tasks.discard)

    async def _accept_one_by_one(self, listener: Listener, sock: socket.socket) -> None:
        try:
            while True:
                client_sock, _address = await self.loop.sock_accept(sock)
                task = self.loop.create_task(self._admit(listener, client_sock))
                self._handshakes.add(task)
                task.add_done_callback(self._handshakes.discard)
        finally:
            sock.close()

    async def _admit(self, listener: Listener, client_sock: socket.socket) -> None:
        """Read the PROXY header if the listener takes them, then the TLS handshake if it has TLS."""
        try:
            socket_peer: tuple[str, int] = client_sock.getpeername()[:2]
        except OSError:
            client_sock.close()  # gone already
            return
        client_sock.setblocking(False)
        client_address: ClientAddress = None
        if self.trusted_balancers is not None:
            try:
                client_address = await self._read_proxy_header(client_sock, socket_peer[0])
            except (_HeaderRefused, _ClosedBeforeSending, OSError) as exc:
                self._proxy_header_refused(listener, socket_peer, exc)
                client_sock.close()
                return
            except asyncio.CancelledError:  # the proxy is stopping
                client_sock.close()
                raise
        if self.listener_tls is not None:
            await self._tls_handshake(listener, client_sock, client_address or socket_peer, client_address)
            return
        try:
            await self.loop.connect_accepted_socket(lambda: self._client_side(listener, client_address), client_sock)
        except OSError as exc:
            log.debug("connection from %s:%d via %s lost before it was accepted: %s", *socket_peer, listener.name,
                      exc)
            client_sock.close()

    async def _read_proxy_header(self, client_sock: socket.socket, socket_ip: str) -> ClientAddress:
        """The client's address from the PROXY header a trusted balancer sends first; None when
        the connection's own address stands (no header where none is needed, LOCAL, UNKNOWN).

        The header's bytes are taken and nothing after them: they are looked at with MSG_PEEK
        and only the header's share is read, so the first Kafka frame or TLS ClientHello stays
        in the socket for the connection."""
        settings = self.options.proxy_protocol
        assert self.trusted_balancers is not None and settings is not None
        trusted = self.trusted_balancers.trusts(socket_ip)
        try:
            async with asyncio.timeout(settings.header_timeout_seconds):
                header = await self._take_header(client_sock)
        except TimeoutError:
            raise _HeaderRefused(Refusal.TIMEOUT, f"no whole PROXY header or first byte within "
                                 f"{settings.header_timeout_seconds:g} s") from None
        except ProxyHeaderError as exc:
            raise _HeaderRefused(Refusal.MALFORMED, str(exc)) from None
        refused = refusal(settings.mode, trusted, header)
        if refused is not None:
            raise _HeaderRefused(*refused)
        return header.source if header is not None else None

    async def _take_header(self, client_sock: socket.socket) -> ProxyHeader | None:
        taken = b""
        while True:
            await self._readable(client_sock)
            try:
                seen = client_sock.recv(_HEADER_PEEK_BYTES, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                continue
            if not seen:
                if taken:
                    raise _HeaderRefused(Refusal.TRUNCATED, f"it closed {len(taken)} bytes into its PROXY header")
                raise _ClosedBeforeSending
            if not taken and not begins_header(seen):
                return None
            header = read_header(taken + seen)
            if header is None:
                # All of it is header: the header does not end within these bytes.
                taken += client_sock.recv(len(seen))
                continue
            client_sock.recv(header.length - len(taken))  # there already: seen above
            return header

    async def _readable(self, client_sock: socket.socket) -> None:
        ready = self.loop.create_future()
        descriptor = client_sock.fileno()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        self.loop.add_reader(descriptor, wake)
        try:
            await ready
        finally:
            self.loop.remove_reader(descriptor)

    def _proxy_header_refused(self, listener: Listener, socket_peer: tuple[str, int], exc: Exception) -> None:
        if isinstance(exc, _ClosedBeforeSending):
            log.debug("connection from %s:%d via %s closed before sending anything", *socket_peer, listener.name)
            return
        if isinstance(exc, OSError):
            log.debug("connection from %s:%d via %s lost while reading its PROXY header: %s", *socket_peer,
                      listener.name, exc)
            return
        assert isinstance(exc, _HeaderRefused)
        log.warning("connection from %s:%d via %s refused: %s: %s", *socket_peer, listener.name, exc.reason.value,
                    exc)
        if self.on_proxy_header_refused is not None:
            self.on_proxy_header_refused(exc.reason.value)

    async def _tls_handshake(self, listener: Listener, client_sock: socket.socket, peer_address: tuple[str, int],
                             client_address: ClientAddress) -> None:
        tls = self.listener_tls
        assert tls is not None
        peer = "{}:{}".format(*peer_address)
        handshake = handshake_started(peer)
        try:
            await self.loop.connect_accepted_socket(
                lambda: self._client_side(listener, client_address), client_sock, ssl=tls.reloading.context,
                ssl_handshake_timeout=tls.options.handshake_timeout_seconds,
            )
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            if not handshake.refused:  # a refused SNI name is logged where it is refused
                log.warning("connection from %s via %s: TLS handshake failed: %s", peer, listener.name,
                            exc or type(exc).__name__)
            client_sock.close()

    async def discover_brokers(self) -> bool:
        """Ask the cluster for its brokers so every node port is served from the start.

        Clients that cached broker ports before a proxy restart reconnect to them directly;
        without this they would find nothing listening. Best effort: a SASL-only upstream
        refuses an unauthenticated Metadata request, and then addresses are learned from
        the first Metadata response a client receives through the bootstrap port.
        """
        request = encode_request_header(METADATA_KEY, _DISCOVERY_METADATA_VERSION, _DISCOVERY_CORRELATION_ID,
                                        "kqp-discovery")
        # Metadata v12 body: empty topics array (compact: 0 + 1), allow_auto_topic_creation,
        # include_topic_authorized_operations, then no tagged fields.
        request += b"\x01\x00\x00\x00"
        for host, port in self.options.upstream_bootstrap:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port, ssl=self.upstream_ssl()),
                    self.options.upstream_connect_timeout_seconds,
                )
            except (OSError, TimeoutError) as exc:
                log.warning("discovery: %s:%d unreachable: %s", host, port, exc)
                continue
            try:
                writer.write(frame(request))
                answer = await asyncio.wait_for(_read_one_frame(reader), 10)
                if response_correlation_id(answer) != _DISCOVERY_CORRELATION_ID:
                    raise CorrelationError(f"answered correlation id {response_correlation_id(answer)}")
                offset = response_body_offset(answer, METADATA_KEY, _DISCOVERY_METADATA_VERSION)
                message = decode_body(METADATA_KEY, _DISCOVERY_METADATA_VERSION, answer[offset:], is_request=False)
            except (OSError, TimeoutError, ProtocolError) as exc:
                log.warning("discovery via %s:%d failed: %s", host, port, exc)
                continue
            finally:
                writer.close()
            for broker in message.brokers:
                self.directory.map_address(broker.node_id, broker.host, broker.port)
            log.info("discovered %d brokers via %s:%d", len(message.brokers), host, port)
            return True
        return False

    def connection_accepted(self, listener: Listener, transport: asyncio.Transport,
                            client_address: ClientAddress = None) -> ProxiedConnection:
        connection = ProxiedConnection(self._services, listener, next(self._ids))
        self.connections.add(connection)
        connection.client_connected(transport, client_address)
        ip = connection.peer_ip
        options = self.options
        # The broker's order (ConnectionQuotas.inc): overall limit, connection rate, then per IP;
        # a connection held for its rate is not counted against its IP.
        if self._stopping:
            connection.close(CloseReason.SHUTTING_DOWN, problem=True)
            return connection
        if options.max_connections and len(self.connections) > options.max_connections:
            connection.close(CloseReason.TOO_MANY_CONNECTIONS, f"max_connections={options.max_connections}",
                             problem=True)
            return connection
        hold_ms = self.accept_throttle(ip) if self.accept_throttle is not None else 0
        if hold_ms > 0:
            log.info("connection %d from %s: connection_creation_rate exceeded, closing it after %d ms",
                     connection.connection_id, connection.peer, hold_ms)
            connection.hold_then_close(hold_ms)
            return connection
        self._per_ip[ip] = self._per_ip.get(ip, 0) + 1
        connection.counted_per_ip = True
        if options.max_connections_per_ip and self._per_ip[ip] > options.max_connections_per_ip:
            connection.close(CloseReason.TOO_MANY_FROM_IP,
                             f"{ip}, max_connections_per_ip={options.max_connections_per_ip}", problem=True)
            return connection
        connection.start()
        return connection

    def connection_closed(self, connection: ProxiedConnection, reason: CloseReason) -> None:
        self.connections.discard(connection)
        if connection.counted_per_ip:
            ip = connection.peer_ip
            remaining = self._per_ip.get(ip, 1) - 1
            if remaining > 0:
                self._per_ip[ip] = remaining
            else:
                self._per_ip.pop(ip, None)
        self.hooks.connection_closed(connection.view, reason)

    def frame_rejected(self, connection: ProxiedConnection, side: str, error: ProtocolError) -> None:
        log.warning("connection %d from %s: rejected %s frame: %s", connection.connection_id,
                    connection.peer, side, error)
        if self.on_frame_rejected is not None:
            self.on_frame_rejected(rejection_kind(side, error))

    def node_endpoints_rewritten(self, api_key: int) -> None:
        if self.on_node_endpoints_rewritten is not None:
            self.on_node_endpoints_rewritten(api_name(api_key))

    def unreadable_login(self, connection: ProxiedConnection, mechanism: str) -> None:
        self.unreadable_logins(mechanism, connection.connection_id, connection.peer)

    async def _close_idle_connections(self) -> None:
        """Sweep for two kinds of stuck connection, as a broker's Selector does:
        idle (connections.max.idle.ms: nothing moved either way, and nothing owed to the
        client, or the client stopped reading what it is owed), and a request frame begun but
        not finished in time (a slow or stalled sender holding a partial frame buffer).

        One periodic sweep rather than a timer per connection: timers would be re-armed on
        every read, on the data path, for a check that only needs seconds of precision."""
        idle_limit = self.options.idle_timeout_seconds
        frame_limit = self.options.frame_read_timeout_seconds
        while True:
            await asyncio.sleep(min(_IDLE_SCAN_INTERVAL_S, idle_limit, frame_limit))
            now = self.loop.time()
            for connection in list(self.connections):
                if connection.last_activity < now - idle_limit and (
                    not connection.in_flight or connection.client_not_reading
                ):
                    # A client that stopped reading its responses is idle too: nothing moves.
                    reason = CloseReason.NOT_READING if connection.in_flight else CloseReason.IDLE
                    connection.close(reason, f"for more than {idle_limit:g} s", problem=bool(connection.in_flight))
                # A frame cannot progress while the proxy itself pauses reading (a mute,
                # back-pressure): that time is the proxy's, not the client's, and the clock
                # restarts when reading resumes.
                elif (
                    connection.frame_started_at is not None
                    and connection.frame_started_at < now - frame_limit
                    and not connection.client_reads_paused
                ):
                    connection.close(CloseReason.FRAME_READ_TIMEOUT, f"within {frame_limit:g} s",
                                     problem=True)

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish within the grace period, close."""
        self._stopping = True
        grace = self.options.shutdown_grace_seconds if grace_s is None else grace_s
        for server in self._servers:
            server.close()
        for task in (*self._accept_tasks, *self._handshakes, self._idle_task, self._certificate_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        # Drain: each connection stops taking requests and waits for the answers it owes, so
        # clients see their in-flight requests completed rather than cut off; whatever is not
        # done within the grace period is closed, and clients retry elsewhere.
        connections = list(self.connections)
        if connections:
            drains = [asyncio.ensure_future(c.drain()) for c in connections]
            _done, pending = await asyncio.wait(drains, timeout=grace)
            for task in pending:
                task.cancel()
        for connection in list(self.connections):
            connection.close(CloseReason.SHUT_DOWN)
        for server in self._servers:
            await server.wait_closed()
