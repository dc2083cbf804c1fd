"""The operator's HTTP endpoint: /metrics, /healthz and /readyz on one small asyncio server.

It runs on the proxy's own event loop, so a scrape reads the metric accumulators from the
same thread that updates them (no locks on the data path). Exposition of the bounded metric
set takes about a millisecond. The server speaks just enough HTTP/1.1 for Prometheus, load
balancer probes and curl: one request per connection, GET or HEAD, no request body.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import socket
from collections.abc import Awaitable, Callable
from http import HTTPStatus

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9644
# A probe's request head is a few hundred bytes; anything far larger is not a probe.
_MAX_HEAD_BYTES = 16 * 1024
_READ_TIMEOUT_S = 5.0

# A readiness check may be async (the `--workers` supervisor asks its workers).
ReadinessCheck = Callable[[], "bool | tuple[bool, str] | Awaitable[tuple[bool, str]]"]


class ObservabilityEndpoint:
    """Serves /metrics (Prometheus or OpenMetrics text), /healthz and /readyz.

    Args:
        registry: the registry to expose (ProxyMetrics.registry).
        host, port: where to listen; loopback by default, port 0 picks a free port.
        ready: says whether the proxy can serve (upstream reachable, config loaded); it may
            return a bool or (bool, reason), or a coroutine giving (bool, reason). /readyz
            answers 503 while it is false.
        before_metrics: awaited before each /metrics exposition, to fetch what the
            registry's collectors then read synchronously (the supervisor's workers).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        ready: ReadinessCheck | None = None,
        sock: socket.socket | None = None,
        before_metrics: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.registry = registry
        self.before_metrics = before_metrics
        # A socket already listening (a worker's, bound by its supervisor before the fork).
        self.sock = sock
        self.host = host
        self.requested_port = port
        self.ready = ready
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        """The bound port (useful after asking for port 0)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("endpoint not started")
        return int(self._server.sockets[0].getsockname()[1])

    def listening_fds(self) -> list[int]:
        """The descriptors the endpoint listens on (the event loop may hold a duplicate of `sock`)."""
        return [s.fileno() for s in self._server.sockets] if self._server is not None else []

    async def start(self) -> None:
        if self.sock is not None:
            self._server = await asyncio.start_server(self._handle, sock=self.sock, limit=_MAX_HEAD_BYTES)
        else:
            self._server = await asyncio.start_server(
                self._handle, self.host, self.requested_port, limit=_MAX_HEAD_BYTES
            )
        log.info("metrics endpoint on http://%s:%d/metrics", self.host, self.port)

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            await self._serve_one(reader, writer)
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the prober went away or sent garbage: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            if task is not None:
                self._handlers.discard(task)

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # The reader's limit makes readuntil fail on an oversized head instead of buffering it.
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            await _respond(writer, HTTPStatus.BAD_REQUEST, b"bad request line\n")
            return
        method, target, _ = parts
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if method not in ("GET", "HEAD"):
            await _respond(writer, HTTPStatus.METHOD_NOT_ALLOWED, b"GET or HEAD only\n", extra={"Allow": "GET, HEAD"})
            return
        path = target.split("?", 1)[0]
        head_only = method == "HEAD"
        if path == "/metrics":
            encoder, content_type = choose_encoder(headers.get("accept", ""))
            if self.before_metrics is not None:
                await self.before_metrics()
            body = encoder(self.registry)
            await _respond(writer, HTTPStatus.OK, body, content_type=content_type, head_only=head_only)
        elif path == "/healthz":
            await _respond(writer, HTTPStatus.OK, b"ok\n", head_only=head_only)
        elif path == "/readyz":
            is_ready, reason = await self._check_ready()
            status = HTTPStatus.OK if is_ready else HTTPStatus.SERVICE_UNAVAILABLE
            if is_ready:
                # A degraded but serving proxy (a fleet fallback) says how in the body.
                text = "ready\n" if reason in ("", "ok") else f"ready: {reason}\n"
            else:
                text = f"not ready: {reason}\n"
            await _respond(writer, status, text.encode(), head_only=head_only)
        else:
            await _respond(writer, HTTPStatus.NOT_FOUND, b"try /metrics, /healthz or /readyz\n", head_only=head_only)

    async def _check_ready(self) -> tuple[bool, str]:
        if self.ready is None:
            return True, ""
        try:
            result = self.ready()
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:  # a failing check means "not ready", never a crashed endpoint
            log.warning("readiness check failed", exc_info=True)
            return False, f"readiness check raised {exc!r}"
        if isinstance(result, tuple):
            return bool(result[0]), str(result[1])
        return bool(result), "" if result else "upstream unreachable or config not loaded"


async def _respond(
    writer: asyncio.StreamWriter,
    status: HTTPStatus,
    body: bytes,
    *,
    content_type: str = "text/plain; charset=utf-8",
    head_only: bool = False,
    extra: dict[str, str] | None = None,
) -> None:
    header_lines = [
        f"HTTP/1.1 {status.value} {status.phrase}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    header_lines.extend(f"{name}: {value}" for name, value in (extra or {}).items())
    writer.write(("\r\n".join(header_lines) + "\r\n\r\n").encode("latin-1"))
    if not head_only:
        writer.write(body)
    await writer.drain()
