"""The running proxy process: the proxy server, its hooks, metrics endpoint, capture writer
and live configuration, wired together and driven by signals.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kqp.config import ConfigError, ConfigFiles, KqpConfig, find_quota_file, load_config, write_quota_entries
from kqp.config.check import unreadable_login_warnings
from kqp.config.models import CaptureSection, CommandLine, EnforcementSection, MetricsSection
from kqp.config.writeback import decode_quota_snapshot, encode_quota_snapshot
from kqp.proxy.fleet import FleetExchange, FleetOptions, default_instance_id
from kqp.proxy.hook_chain import HookChain
from kqp.proxy.hooks import TrafficHooks
from kqp.proxy.host_exchange import HostExchange, HostLink
from kqp.proxy.http_endpoint import ObservabilityEndpoint
from kqp.proxy.metrics import ProxyMetrics
from kqp.proxy.observation import ObservationHooks
from kqp.proxy.options import ProxyOptions
from kqp.proxy.policies.chain import EnforcementPolicies
from kqp.proxy.quota_admin import QuotaAdminHooks
from kqp.proxy.server import ProxyServer
from kqp.proxy.tls import parse_principal_mapping_rules, upstream_context
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import IpQuotaEntry, QuotaEngine, QuotaEntry, QuotaSettings

if TYPE_CHECKING:
    from kqp.capture.writer import CaptureWriter
    from kqp.proxy.guard import GuardLoop

log = logging.getLogger(__name__)

_MAINTENANCE_INTERVAL_S = 1.0
# Sections a reload cannot change on a running proxy (listeners, sockets, files in use).
_RESTART_SECTIONS = ("proxy", "upstream", "metrics", "capture", "fleet", "workers")


def _monotonic_ms() -> float:
    return time.monotonic() * 1000.0


@dataclass(frozen=True, slots=True)
class AppSettings:
    """What one proxy process runs with, derived from the configuration (see
    `app_settings_from_config`): the sections themselves, or options built on them."""

    proxy: ProxyOptions
    enforcement: EnforcementSection
    metrics: MetricsSection
    capture: CaptureSection
    # The usage exchange of a fleet of proxies with one budget; None: this instance alone.
    fleet: FleetOptions | None = None
    # A worker's endpoint: a loopback socket its supervisor listens on and scrapes.
    metrics_socket: socket.socket | None = None
    # A worker's end of its supervisor's relay: the budget it shares with the host's other workers.
    host_link: HostLink | None = None


class ProxyApp:
    """Owns everything the proxy process runs; `run()` until SIGTERM/SIGINT, reload on SIGHUP."""

    def __init__(
        self,
        settings: AppSettings,
        engine: QuotaEngine | None = None,
        config: KqpConfig | None = None,
        files: ConfigFiles | None = None,
        command_line: CommandLine | None = None,
        clock_ms: Callable[[], float] | None = None,
    ) -> None:
        self.settings = settings
        # The quota engine's clock (ms); injected by the deterministic simulator, which runs the
        # proxy on virtual time (tests/unit/simulator).
        self._clock_ms = clock_ms if clock_ms is not None else _monotonic_ms
        self.engine = engine
        self.config = config
        self.files = files
        # Applied again on each reload, so that the files' values do not replace them.
        self.command_line = command_line or CommandLine()
        self.metrics: ProxyMetrics | None = None
        self.endpoint: ObservabilityEndpoint | None = None
        self.capture: CaptureWriter | None = None
        self.server: ProxyServer | None = None
        self.enforcement: EnforcementPolicies | None = None
        self.fleet: FleetExchange | None = None
        self.host: HostExchange | None = None
        self.guard: GuardLoop | None = None
        # The last quota configuration known to be the fleet's (read from or sent to its topic).
        self._fleet_quotas: tuple[tuple[QuotaEntry, ...], tuple[IpQuotaEntry, ...]] | None = None
        # Quota write-backs (AlterClientQuotas, the fleet's quotas) take this in turn: one at a time,
        # in the order they came, each writing on what the previous one left.
        self._writeback_turn = asyncio.Lock()
        self._fleet_writebacks: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._maintenance: asyncio.Task[None] | None = None

    def now_ms(self) -> float:
        return self._clock_ms()

    async def start(self) -> None:
        settings = self.settings
        if settings.metrics.enabled:
            self.metrics = ProxyMetrics(top_n_client_ids=settings.metrics.top_n_client_ids)
        if settings.capture.enabled:
            # Imported here: the writer loads pyarrow (and with it numpy), which a proxy that
            # captures nothing never needs.
            from kqp.capture.writer import CaptureWriter

            metrics = self.metrics
            self.capture = CaptureWriter(
                settings.capture,
                on_written=metrics.capture_written if metrics else None,
                on_dropped=metrics.capture_dropped if metrics else None,
                on_file_closed=metrics.capture_files_closed if metrics else None,
            )
            self.capture.start()
        hooks: list[TrafficHooks] = []
        topics = TopicDirectory()  # learned from Metadata by the server, read by the hooks
        if self.engine is not None:
            engine = self.engine
            hooks.append(QuotaAdminHooks(
                lambda: engine.settings, self._store_quotas, self._admin_principals,
                self.metrics.quota_admin_refused if self.metrics is not None else None,
            ))
            if self.metrics is not None:
                self.engine.on_throttle = self._report_throttle
                self.metrics.set_quota_stats_source(self.engine.snapshot)
                self._label_configured_entities()
            # The clock itself rather than `now_ms`, which only calls it: the chain reads it on
            # every request and response.
            self.enforcement = EnforcementPolicies(self.engine, settings.enforcement, self._clock_ms, topics)
            hooks.append(self.enforcement)
        if self.metrics is not None or self.capture is not None:
            hooks.append(ObservationHooks(self.metrics, self.capture, settings.capture.sample_one_in,
                                          clock=asyncio.get_running_loop().time, topics=topics))
        if settings.host_link is not None and self.engine is not None:
            # Before the listeners open: every request a worker admits is shared with its siblings.
            # With a fleet's topic as well, the topic orders mutations and tells the fleet's state.
            self.host = HostExchange(settings.host_link, self.engine, self.now_ms, self.metrics,
                                     orders_mutations=settings.fleet is None, reports_status=settings.fleet is None,
                                     on_lost=self.request_stop)
            await self.host.start()
            if self.enforcement is not None and settings.fleet is None:
                self.enforcement.mutation_order = self.host
        quota_engine, proxy_metrics = self.engine, self.metrics
        self.server = ProxyServer(
            settings.proxy, HookChain(hooks), topics=topics,
            accept_throttle=(
                (lambda ip: quota_engine.connection_created(ip, self.now_ms())) if quota_engine is not None else None
            ),
            on_frame_rejected=proxy_metrics.frame_rejected if proxy_metrics is not None else None,
            on_node_endpoints_rewritten=(
                proxy_metrics.node_endpoints_rewritten if proxy_metrics is not None else None
            ),
            on_unreadable_login=proxy_metrics.unreadable_login if proxy_metrics is not None else None,
            on_proxy_header_refused=proxy_metrics.proxy_header_refused if proxy_metrics is not None else None,
        )
        await self.server.start()
        if settings.fleet is not None and self.engine is not None:
            engine = self.engine
            self.fleet = FleetExchange(
                settings.fleet, engine, self.now_ms,
                lambda: engine.settings.window_num * engine.settings.window_size_s * 1000.0, self.metrics,
                on_quotas=self._apply_fleet_quotas, on_no_quotas=self._share_quotas,
                same_host=settings.host_link.is_sibling if settings.host_link is not None else None,
            )
            if self.enforcement is not None:
                self.enforcement.mutation_order = self.fleet
            await self.fleet.start()
        if self.metrics is not None:
            self.endpoint = ObservabilityEndpoint(
                self.metrics.registry, settings.metrics.host, settings.metrics.port, ready=self._ready,
                sock=settings.metrics_socket,
            )
            await self.endpoint.start()
        self._maintenance = asyncio.get_running_loop().create_task(self._maintain())
        self._apply_guard()

    def _apply_guard(self) -> None:
        """Start, update or stop the cluster guard's loop as the `guard` section says (live on reload)."""
        section = self.config.guard if self.config is not None else None
        if self.engine is None or section is None or not section.enabled:
            if self.guard is not None:
                self.guard.close()  # off: no more steps, and the engine drops the guard's limits
                self.guard = None
            if self.engine is not None:
                self.engine.share_guard_usage(False)
            return
        # guard.fleet_wide: the guard's sensors measure the fleet's load through the fleet exchange.
        # (The configuration refuses guard.fleet_wide without the fleet section.)
        self.engine.share_guard_usage(section.fleet_wide and self.fleet is not None)
        if self.guard is not None:
            self.guard.update(section)
            return
        # Imported here, not at the top: the guard's step runs numpy, which a proxy without the
        # (opt-in) guard never loads.
        from kqp.proxy.guard import GuardLoop

        server = self.server
        self.guard = GuardLoop(
            self.engine, section, lambda: server.directory.known_nodes() if server is not None else [],
            self.now_ms, self.metrics,
        )
        self.guard.start()

    def _admin_principals(self) -> frozenset[str] | None:
        # Read at each request: enforcement settings apply live on reload.
        enforcement = self.enforcement.settings if self.enforcement is not None else self.settings.enforcement
        principals = enforcement.admin_principals
        return frozenset(principals) if principals is not None else None

    def _report_throttle(self, quota_type: str, tags: Mapping[str, str], throttle_ms: int, enforced: bool) -> None:
        """The engine's throttle callback: count a throttle by entity (`enforced` False: computed only)."""
        metrics = self.metrics
        if metrics is not None:
            user, client_id = tags.get("user", ""), tags.get("client-id", "")
            metrics.throttled(quota_type, user, client_id, throttle_ms, enforced, "proxy")

    def _label_configured_entities(self) -> None:
        """Entities named in the quota file keep their own metric labels, whatever their traffic rank."""
        if self.metrics is None or self.config is None:
            return
        entities = [entry.entity.to_entity() for entry in self.config.quotas.entries]
        self.metrics.set_labelled_entities(
            users=[e.user for e in entities if e.user is not None],
            client_ids=[e.client_id for e in entities if e.client_id is not None],
        )

    def _ready(self) -> tuple[bool, str]:
        """/readyz: not ready until at least one broker is known, since a client could not be routed."""
        server = self.server
        if server is None:
            return False, "starting"
        if not server.directory.known_nodes():
            return False, "no upstream broker discovered yet"
        if self.fleet is not None:
            # Still serving under the fallback policy: ready, with the fallback in the body.
            return True, self.fleet.describe()
        if self.host is not None:
            return True, self.host.describe()
        return True, "ok"

    async def _maintain(self) -> None:
        """Housekeeping off the data path: expire idle sensors (as Kafka's Metrics expires a sensor after
        its inactivity time), forget ended throttles, and reload when a config file changed.
        """
        while True:
            await asyncio.sleep(_MAINTENANCE_INTERVAL_S)
            if self.engine is not None:
                self.engine.expire_idle(self.now_ms())
            if self.enforcement is not None:
                self.enforcement.forget_expired_throttles(self.now_ms())
            if self.files is not None and self.files.changed():
                self.reload("config file changed")

    def reload(self, why: str) -> bool:
        """Load the config files again; apply quotas and enforcement live, keep the rest.

        A file that does not validate changes nothing: the running config stays.
        """
        if self.files is None:
            log.info("reload (%s): no config files to reload", why)
            return False
        config = self._read_config(why)
        if config is None:
            return False
        self._apply_config(config, why)
        return True

    def _read_config(self, why: str) -> KqpConfig | None:
        """The config files read and validated (None, reason logged and counted, if they do not
        validate). Touches nothing of the running proxy, so a write-back runs it in its thread."""
        assert self.files is not None
        try:
            return load_config(self.files.paths).with_command_line(self.command_line)
        except (ConfigError, ValueError) as exc:
            log.error("config reload (%s) rejected, running config unchanged:\n%s", why, exc)
            if self.metrics is not None:
                self.metrics.config_reload(False)
            return None

    def _apply_config(self, config: KqpConfig, why: str) -> None:
        """Put a read configuration in force: quotas and enforcement live, the rest at a restart."""
        previous = self.config
        if previous is not None:
            for section in _RESTART_SECTIONS:
                if getattr(previous, section) != getattr(config, section):
                    log.warning("config reload: changes to %r take effect only after a restart", section)
        self.config = config
        if self.engine is not None:
            self.engine.update(config.quota_settings())
        if self.enforcement is not None:
            self.enforcement.settings = config.enforcement
        self._apply_guard()
        self._label_configured_entities()
        if self.metrics is not None:
            self.metrics.config_reload(True)
        log.info("config reloaded (%s): %d quota entries", why, len(config.quotas.entries))
        self._share_quotas()

    def _share_quotas(self) -> None:
        """Send this instance's quota entries to the fleet, unless they are the fleet's already."""
        if self.fleet is None or self.engine is None:
            return
        settings = self.engine.settings
        current = (tuple(settings.entries), tuple(settings.ip_entries))
        if current == self._fleet_quotas:
            return  # the change came from the fleet (or changed no entry)
        self._fleet_quotas = current
        self.fleet.publish_quotas(encode_quota_snapshot(self.fleet.options.instance_id, *current))
        log.info("quota configuration sent to the fleet: %d entries", len(current[0]))

    def _apply_fleet_quotas(self, snapshot: bytes) -> None:
        """Another instance changed the fleet's quotas: take them, through the quota file."""
        try:
            instance, entries, ip_entries = decode_quota_snapshot(snapshot)
        except ConfigError as exc:
            log.error("a quota snapshot on the fleet's topic is not usable, quotas unchanged:\n%s", exc)
            return
        # In turn with the other write-backs, off the event loop; kept until it ends.
        task = asyncio.get_running_loop().create_task(self._take_fleet_quotas(instance, entries, ip_entries))
        self._fleet_writebacks.add(task)
        task.add_done_callback(self._fleet_writebacks.discard)

    async def _take_fleet_quotas(
        self, instance: str, entries: tuple[QuotaEntry, ...], ip_entries: tuple[IpQuotaEntry, ...]
    ) -> None:
        async with self._writeback_turn:
            # Remembered before applying: the reload this causes must not send the same quotas back to the
            # fleet (_share_quotas compares with this), or instances would echo each other's changes forever.
            self._fleet_quotas = (entries, ip_entries)
            engine = self.engine
            if engine is None or (tuple(engine.settings.entries), tuple(engine.settings.ip_entries)) == (
                    entries, ip_entries):
                return
            if self.files is None:
                engine.update(dataclasses.replace(engine.settings, entries=entries, ip_entries=ip_entries))
                log.info("quotas from instance %s through the fleet: %d entries", instance, len(entries))
                return
            # Through the file, not straight into the engine: the file stays what is in effect, and a
            # restart or a reload reads the fleet's quotas back from it.
            origin = self._origin(f"the fleet's quota topic, from instance {instance}")
            why = f"quotas from instance {instance} through the fleet"
            try:
                path, config = await asyncio.to_thread(self._write_and_read, entries, ip_entries, origin, why)
            except ConfigError as exc:
                log.error("quotas from instance %s could not be written, quotas unchanged:\n%s", instance, exc)
                return
            if config is not None:
                self._apply_config(config, f"{why}, written to {path}")

    def _write_and_read(
        self, entries: Sequence[QuotaEntry], ip_entries: Sequence[IpQuotaEntry], origin: str | None, why: str
    ) -> tuple[Path, KqpConfig | None]:
        """A write-back's blocking part, in a worker thread: find the quota file, write the entries
        to it (fsynced, atomically replaced) and read the configuration back. Raises ConfigError,
        file unchanged, when the entries do not validate."""
        assert self.files is not None
        path = find_quota_file(self.files.paths)
        write_quota_entries(path, entries, ip_entries, origin)
        return path, self._read_config(f"{why}, written to {path}")

    def _origin(self, what: str) -> str | None:
        """An entry's origin stamp (kqp check-config shows it): what wrote it, where and when;
        None when the operator turned stamps off (quotas.stamp_origin)."""
        if self.config is not None and not self.config.quotas.stamp_origin:
            return None
        here = f" through instance {self.fleet.options.instance_id}" if self.fleet is not None else ""
        return f"{what}{here} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"

    async def _store_quotas(self, change: Callable[[QuotaSettings], QuotaSettings], who: str) -> None:
        """AlterClientQuotas (kqp.proxy.quota_admin.QuotaStore): the change applied to the quotas in
        force, written back to the quota file, then reloaded from it.

        One write-back at a time, in the order asked, each on the quotas the previous one left (as
        when they ran inline). The file IO (two fsyncs) and the reload's reading and validation run
        in a worker thread, so the event loop goes on serving every connection meanwhile; the new
        configuration is put in force back on the loop.
        """
        async with self._writeback_turn:
            engine = self.engine
            assert engine is not None  # quota administration runs only with an engine
            settings = change(engine.settings)
            if self.files is None:
                # Command-line only: nothing to write to, so the change lives until a restart.
                engine.update(settings)
                self._share_quotas()
                return
            # Write first, then reload from the file: the engine only ever runs what a file holds, and a
            # write that fails validation leaves both the file and the engine as they were.
            path, config = await asyncio.to_thread(
                self._write_and_read, settings.entries, settings.ip_entries, self._origin(who), "AlterClientQuotas")
            if config is None:
                raise RuntimeError(f"{path} was written but does not reload; see the log")
            self._apply_config(config, f"AlterClientQuotas wrote {path}")

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, self.reload, "SIGHUP")
        await self.start()
        await self._stop.wait()
        await self.stop()

    async def stop(self) -> None:
        """Stop in dependency order: the fleet first (its pending claims are charged here), then the
        listeners and connections, then the endpoint, and the capture writer after the connections, so
        that their last records are written.
        """
        if self._maintenance is not None:
            self._maintenance.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintenance
        if self.guard is not None:
            await self.guard.stop()
        if self.fleet is not None:
            await self.fleet.stop()
        if self.host is not None:
            await self.host.stop()
        if self.server is not None:
            await self.server.stop()
        if self._fleet_writebacks:
            # Quotas taken from the fleet before it stopped are written (the file is what a restart runs).
            await asyncio.gather(*self._fleet_writebacks, return_exceptions=True)
        if self.endpoint is not None:
            await self.endpoint.stop()
        if self.capture is not None:
            self.capture.stop()
        if self.engine is not None:
            self.engine.close()


def app_settings_from_config(config: KqpConfig) -> AppSettings:
    """The settings of one proxy process: the sections as they are, the proxy's with the
    upstream added. Nothing is mapped field by field, so a setting added to a section
    reaches the IO layer with its one default."""
    upstream = config.upstream
    proxy = ProxyOptions.model_validate({
        **config.proxy.given(),
        "upstream_bootstrap": upstream.addresses() if upstream is not None else (),
        "upstream_tls": upstream.tls if upstream is not None else None,
    })
    if proxy.tls is not None:
        # Rules are Kafka's grammar, checked here so that a bad value stops `kqp serve` at start.
        parse_principal_mapping_rules(proxy.tls.principal_mapping_rules)
    return AppSettings(
        proxy=proxy,
        enforcement=config.enforcement,
        metrics=config.metrics,
        capture=config.capture,
        fleet=fleet_options(config, proxy),
    )


def fleet_options(config: KqpConfig, proxy: ProxyOptions, enable: bool = False) -> FleetOptions | None:
    """The `fleet` section as the exchange runs it; None when it is off, unless `enable` (`--workers`)."""
    f = config.fleet
    if not (f.enabled or enable):
        return None
    upstream_servers = config.upstream.bootstrap_servers if config.upstream is not None else ()
    return FleetOptions.model_validate({
        **f.given(),
        "bootstrap_servers": f.bootstrap_servers or upstream_servers,
        "instance_id": f.instance_id or default_instance_id(proxy.bootstrap_port),
        "ssl_context": upstream_context(proxy.upstream_tls) if proxy.upstream_tls is not None else None,
    })


@dataclass(frozen=True, slots=True)
class ServeSetup:
    """What `kqp serve` runs with: the merged config, its files (for reloads), the settings."""

    config: KqpConfig
    files: ConfigFiles | None
    settings: AppSettings
    command_line: CommandLine


def load_serve_setup(config_paths: list[str], command_line: CommandLine | None = None) -> ServeSetup | None:
    """The config files and command-line options, validated; None (reason logged) if invalid."""
    files = ConfigFiles(config_paths) if config_paths else None
    command_line = command_line or CommandLine()
    try:
        config = load_config(config_paths) if config_paths else KqpConfig()
        config = config.with_command_line(command_line)
        if config.upstream is None:
            raise ValueError("no upstream brokers: set upstream.bootstrap_servers in a config file or give --upstream")
        settings = app_settings_from_config(config)
    except (ConfigError, ValueError) as exc:
        log.error("%s", exc)
        return None
    for warning in unreadable_login_warnings(config):
        log.warning("%s", warning)
    return ServeSetup(config, files, settings, command_line)


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run_app(setup: ServeSetup) -> None:
    """Run one proxy process on a new uvloop event loop until SIGTERM/SIGINT."""
    import uvloop

    async def main() -> None:
        app = ProxyApp(setup.settings, QuotaEngine(setup.config.quota_settings()), config=setup.config,
                       files=setup.files, command_line=setup.command_line)
        await app.run()

    uvloop.run(main())


def serve_forever(config_paths: list[str], command_line: CommandLine | None = None) -> int:
    """`kqp serve`: run until SIGTERM/SIGINT; SIGHUP or a file change reloads the config."""
    configure_logging()
    setup = load_serve_setup(config_paths, command_line)
    if setup is None:
        return 2
    run_app(setup)
    return 0
