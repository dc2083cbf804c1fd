"""The running proxy process: the proxy server, its hooks, metrics endpoint, capture writer
and live configuration, wired together and driven by signals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass
from typing import Any

from kqp.capture.writer import CaptureWriter
from kqp.proxy.hooks import HookChain, TrafficHooks
from kqp.proxy.http_endpoint import ObservabilityEndpoint
from kqp.proxy.metrics import ProxyMetrics
from kqp.proxy.observation import ObservationHooks
from kqp.proxy.options import ProxyOptions
from kqp.proxy.server import ProxyServer

log = logging.getLogger(__name__)

_MAINTENANCE_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class MetricsOptions:
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 9644
    top_n_client_ids: int = 20


@dataclass(frozen=True, slots=True)
class CaptureOptions:
    enabled: bool = False
    directory: str = "capture"
    proxy_id: str = "kqp"
    rotate_bytes: int = 256 * 1024 * 1024
    rotate_seconds: float = 3600.0
    queue_capacity: int = 100_000
    sample_one_in: int = 1


@dataclass(frozen=True, slots=True)
class AppSettings:
    proxy: ProxyOptions
    # kqp.proxy.enforcement.EnforcementSettings, or None to forward without quotas.
    enforcement: Any
    metrics: MetricsOptions
    capture: CaptureOptions


class ProxyApp:
    """Owns everything the proxy process runs; `run()` until SIGTERM/SIGINT."""

    def __init__(self, settings: AppSettings, engine: Any = None) -> None:
        self.settings = settings
        self.engine = engine
        self.metrics: ProxyMetrics | None = None
        self.endpoint: ObservabilityEndpoint | None = None
        self.capture: CaptureWriter | None = None
        self.server: ProxyServer | None = None
        self.enforcement: Any = None
        self._stop = asyncio.Event()
        self._maintenance: asyncio.Task[None] | None = None
        self._reload_checks: list[object] = []

    def now_ms(self) -> float:
        return time.monotonic() * 1000.0

    async def start(self) -> None:
        settings = self.settings
        if settings.metrics.enabled:
            self.metrics = ProxyMetrics(top_n_client_ids=settings.metrics.top_n_client_ids)
        if settings.capture.enabled:
            c = settings.capture
            metrics = self.metrics
            self.capture = CaptureWriter(
                c.directory, c.rotate_bytes, c.rotate_seconds, c.queue_capacity, c.sample_one_in, c.proxy_id,
                on_written=metrics.capture_written if metrics else None,
                on_dropped=metrics.capture_dropped if metrics else None,
                on_file_closed=metrics.capture_files_closed if metrics else None,
            )
            self.capture.start()
        hooks: list[TrafficHooks] = []
        if self.engine is not None:
            from kqp.proxy.enforcement import QuotaEnforcement

            self.enforcement = QuotaEnforcement(self.engine, settings.enforcement, self.now_ms)
            hooks.append(self.enforcement)
        if self.metrics is not None or self.capture is not None:
            hooks.append(ObservationHooks(self.metrics, self.capture, settings.capture.sample_one_in))
        self.server = ProxyServer(settings.proxy, HookChain(hooks))
        await self.server.start()
        if self.metrics is not None:
            self.endpoint = ObservabilityEndpoint(
                self.metrics.registry, settings.metrics.host, settings.metrics.port, ready=self._ready
            )
            await self.endpoint.start()
        self._maintenance = asyncio.get_running_loop().create_task(self._maintain())

    def _ready(self) -> tuple[bool, str]:
        server = self.server
        if server is None:
            return False, "starting"
        if not server.directory.known_nodes():
            return False, "no upstream broker discovered yet"
        return True, "ok"

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(_MAINTENANCE_INTERVAL_S)
            if self.engine is not None:
                self.engine.expire_idle(self.now_ms())

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        await self.start()
        await self._stop.wait()
        await self.stop()

    async def stop(self) -> None:
        if self._maintenance is not None:
            self._maintenance.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintenance
        if self.server is not None:
            await self.server.stop()
        if self.endpoint is not None:
            await self.endpoint.stop()
        if self.capture is not None:
            self.capture.stop()


def _parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def settings_from_overrides(base: AppSettings | None, overrides: dict[str, Any]) -> AppSettings:
    """Apply `kqp serve` command-line options on top of the configured settings."""
    import dataclasses

    if base is None:
        upstream = overrides.get("upstream")
        if not upstream:
            raise ValueError("no upstream brokers: give --config FILE or --upstream HOST:PORT")
        base = AppSettings(
            proxy=ProxyOptions(upstream_bootstrap=tuple(_parse_address(a) for a in upstream)),
            enforcement=None,
            metrics=MetricsOptions(),
            capture=CaptureOptions(),
        )
    proxy = base.proxy
    if overrides.get("upstream"):
        proxy = dataclasses.replace(proxy, upstream_bootstrap=tuple(_parse_address(a) for a in overrides["upstream"]))
    for key in ("bootstrap_port", "node_port_base", "advertised_host", "bind_host"):
        if overrides.get(key) is not None:
            proxy = dataclasses.replace(proxy, **{key: overrides[key]})
    metrics = base.metrics
    if overrides.get("metrics_port") is not None:
        metrics = dataclasses.replace(metrics, port=overrides["metrics_port"])
    capture = base.capture
    if overrides.get("capture_dir"):
        capture = dataclasses.replace(capture, enabled=True, directory=overrides["capture_dir"])
    return dataclasses.replace(base, proxy=proxy, metrics=metrics, capture=capture)


def serve_forever(config_paths: list[str], overrides: dict[str, Any] | None = None) -> int:
    """`kqp serve`: run until SIGTERM/SIGINT; returns the exit code."""
    import uvloop

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = settings_from_overrides(None, overrides or {})
    except ValueError as exc:
        log.error("%s", exc)
        return 2

    async def main() -> None:
        await ProxyApp(settings).run()

    uvloop.run(main())
    return 0
