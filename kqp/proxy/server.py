"""The proxy process: listeners, connections, discovery, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import struct

from kqp.protocol.apis import METADATA_KEY
from kqp.protocol.codec import decode_body
from kqp.protocol.errors import ProtocolError
from kqp.protocol.headers import encode_request_header, response_body_offset
from kqp.proxy.cluster import BOOTSTRAP, ClusterDirectory, Listener
from kqp.proxy.connection import ClientSide, ProxiedConnection
from kqp.proxy.hooks import TrafficHooks
from kqp.proxy.options import ProxyOptions
from kqp.proxy.topics import TopicDirectory

log = logging.getLogger(__name__)

_IDLE_SCAN_INTERVAL_S = 5.0
_DISCOVERY_METADATA_VERSION = 12


class ProxyServer:
    def __init__(self, options: ProxyOptions, hooks: TrafficHooks | None = None) -> None:
        self.options = options
        self.hooks = hooks or TrafficHooks()
        self.loop = asyncio.get_running_loop()
        self.directory = ClusterDirectory(options, self._serve_listener)
        self.topics = TopicDirectory()
        self.connections: set[ProxiedConnection] = set()
        self._servers: list[asyncio.Server] = []
        self._server_tasks: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self._per_ip: dict[str, int] = {}
        self._idle_task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def bootstrap_port(self) -> int:
        return self.directory.listeners[BOOTSTRAP].port

    async def start(self) -> None:
        self.directory.open_listener(BOOTSTRAP, self.options.bootstrap_port)
        await self.discover_brokers()
        await asyncio.gather(*self._server_tasks)
        self._idle_task = self.loop.create_task(self._close_idle_connections())

    def _serve_listener(self, listener: Listener, sock: socket.socket) -> None:
        async def serve() -> None:
            server = await self.loop.create_server(lambda: ClientSide(self, listener), sock=sock)
            self._servers.append(server)

        task = self.loop.create_task(serve())
        self._server_tasks.add(task)
        task.add_done_callback(self._server_tasks.discard)

    async def discover_brokers(self) -> bool:
        """Ask the cluster for its brokers so every node port is served from the start.

        Clients that cached broker ports before a proxy restart reconnect to them directly;
        without this they would find nothing listening. Best effort: a SASL-only upstream
        refuses an unauthenticated Metadata request, and then addresses are learned from
        the first Metadata response a client receives through the bootstrap port.
        """
        request = encode_request_header(METADATA_KEY, _DISCOVERY_METADATA_VERSION, 1, "kqp-discovery")
        # Metadata v12 body: empty topics array (compact: 0 + 1), allow_auto_topic_creation,
        # include_topic_authorized_operations, then no tagged fields.
        request += b"\x01\x00\x00\x00"
        for host, port in self.options.upstream_bootstrap:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port), self.options.upstream_connect_timeout_s
                )
            except (OSError, TimeoutError) as exc:
                log.warning("discovery: %s:%d unreachable: %s", host, port, exc)
                continue
            try:
                writer.write(struct.pack(">i", len(request)) + request)
                size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 10))[0]
                frame = await asyncio.wait_for(reader.readexactly(size), 10)
                offset = response_body_offset(frame, METADATA_KEY, _DISCOVERY_METADATA_VERSION)
                message = decode_body(METADATA_KEY, _DISCOVERY_METADATA_VERSION, frame[offset:], is_request=False)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ProtocolError) as exc:
                log.warning("discovery via %s:%d failed: %s", host, port, exc)
                continue
            finally:
                writer.close()
            for broker in message.brokers:
                self.directory.map_address(broker.node_id, broker.host, broker.port)
            log.info("discovered %d brokers via %s:%d", len(message.brokers), host, port)
            return True
        return False

    def connection_accepted(self, listener: Listener, transport: asyncio.Transport) -> ProxiedConnection:
        connection = ProxiedConnection(self, listener, next(self._ids))
        self.connections.add(connection)
        connection.client_connected(transport)
        ip = connection.peer_ip
        self._per_ip[ip] = self._per_ip.get(ip, 0) + 1
        refusal = self._refusal(ip)
        if refusal is not None:
            connection.close(refusal, problem=True)
        return connection

    def _refusal(self, ip: str) -> str | None:
        options = self.options
        if self._stopping:
            return "proxy is shutting down"
        if options.max_connections and len(self.connections) > options.max_connections:
            return f"too many connections (max_connections={options.max_connections})"
        if options.max_connections_per_ip and self._per_ip[ip] > options.max_connections_per_ip:
            return f"too many connections from {ip} (max_connections_per_ip={options.max_connections_per_ip})"
        return None

    def connection_closed(self, connection: ProxiedConnection, reason: str) -> None:
        self.connections.discard(connection)
        ip = connection.peer_ip
        remaining = self._per_ip.get(ip, 1) - 1
        if remaining > 0:
            self._per_ip[ip] = remaining
        else:
            self._per_ip.pop(ip, None)
        self.hooks.connection_closed(connection, reason)

    def frame_rejected(self, connection: ProxiedConnection, side: str, error: ProtocolError) -> None:
        log.warning("connection %d from %s: rejected %s frame: %s", connection.connection_id,
                    connection.peer, side, error)

    def may_carry_node_endpoints(self, api_key: int, api_version: int, frame: bytes, body_offset: int) -> bool:
        """Whether a Produce/Fetch response needs the full decode for KIP-951 endpoints."""
        # Until the fast path can tell, decode them all: correct, if slower.
        return True

    async def _close_idle_connections(self) -> None:
        idle_limit = self.options.idle_timeout_s
        while True:
            await asyncio.sleep(min(_IDLE_SCAN_INTERVAL_S, idle_limit))
            cutoff = self.loop.time() - idle_limit
            for connection in list(self.connections):
                if connection.last_activity < cutoff and not connection.in_flight:
                    connection.close(f"idle for more than {idle_limit:g} s")

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish within the grace period, close."""
        self._stopping = True
        grace = self.options.shutdown_grace_s if grace_s is None else grace_s
        for server in self._servers:
            server.close()
        if self._idle_task is not None:
            self._idle_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._idle_task
        connections = list(self.connections)
        if connections:
            drains = [asyncio.ensure_future(c.drain()) for c in connections]
            _done, pending = await asyncio.wait(drains, timeout=grace)
            for task in pending:
                task.cancel()
        for connection in list(self.connections):
            connection.close("proxy shut down")
        for server in self._servers:
            await server.wait_closed()
