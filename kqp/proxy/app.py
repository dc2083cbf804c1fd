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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kqp.capture.writer import CaptureWriter
from kqp.config import ConfigError, ConfigFiles, KqpConfig, find_quota_file, load_config, write_quota_entries
from kqp.config.check import unreadable_login_warnings
from kqp.config.models import ListenerSaslSection, parse_host_port
from kqp.config.writeback import decode_quota_snapshot, encode_quota_snapshot
from kqp.proxy.enforcement import EnforcementSettings, QuotaEnforcement
from kqp.proxy.fleet import FleetExchange, FleetOptions, default_instance_id
from kqp.proxy.hooks import HookChain, TrafficHooks
from kqp.proxy.http_endpoint import ObservabilityEndpoint
from kqp.proxy.metrics import ProxyMetrics
from kqp.proxy.observation import ObservationHooks
from kqp.proxy.options import ListenerTls, ProxyOptions, UpstreamTls
from kqp.proxy.quota_admin import QuotaAdminHooks
from kqp.proxy.server import ProxyServer
from kqp.proxy.tls import parse_principal_mapping_rules, upstream_context
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import IpQuotaEntry, QuotaEngine, QuotaEntry, QuotaSettings

log = logging.getLogger(__name__)

_MAINTENANCE_INTERVAL_S = 1.0
# Sections a reload cannot change on a running proxy (listeners, sockets, files in use).
_RESTART_SECTIONS = ("proxy", "upstream", "metrics", "capture", "fleet")


@dataclass(frozen=True, slots=True)
class MetricsOptions:
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 9644
    top_n_client_ids: int = 20
    # A worker's endpoint: a loopback socket its supervisor listens on and scrapes.
    listen_socket: socket.socket | None = None


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
    enforcement: EnforcementSettings
    metrics: MetricsOptions
    capture: CaptureOptions
    # The usage exchange of a fleet of proxies with one budget; None: this instance alone.
    fleet: FleetOptions | None = None


class ProxyApp:
    """Owns everything the proxy process runs; `run()` until SIGTERM/SIGINT, reload on SIGHUP."""

    def __init__(
        self,
        settings: AppSettings,
        engine: QuotaEngine | None = None,
        config: KqpConfig | None = None,
        files: ConfigFiles | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.config = config
        self.files = files
        self.metrics: ProxyMetrics | None = None
        self.endpoint: ObservabilityEndpoint | None = None
        self.capture: CaptureWriter | None = None
        self.server: ProxyServer | None = None
        self.enforcement: QuotaEnforcement | None = None
        self.fleet: FleetExchange | None = None
        # The last quota configuration known to be the fleet's (read from or sent to its topic).
        self._fleet_quotas: tuple[tuple[QuotaEntry, ...], tuple[IpQuotaEntry, ...]] | None = None
        self._stop = asyncio.Event()
        self._maintenance: asyncio.Task[None] | None = None

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
            self.enforcement = QuotaEnforcement(self.engine, settings.enforcement, self.now_ms, topics)
            hooks.append(self.enforcement)
        if self.metrics is not None or self.capture is not None:
            hooks.append(ObservationHooks(self.metrics, self.capture, settings.capture.sample_one_in,
                                          clock=asyncio.get_running_loop().time, topics=topics))
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
        )
        await self.server.start()
        if settings.fleet is not None and self.engine is not None:
            fleet = settings.fleet
            if not fleet.instance_id:
                fleet = dataclasses.replace(fleet, instance_id=default_instance_id(settings.proxy.bootstrap_port))
            engine = self.engine
            self.fleet = FleetExchange(
                fleet, engine, self.now_ms,
                lambda: engine.settings.window_num * engine.settings.window_size_s * 1000.0, self.metrics,
                on_quotas=self._apply_fleet_quotas, on_no_quotas=self._share_quotas,
            )
            if self.enforcement is not None:
                self.enforcement.mutation_order = self.fleet
            await self.fleet.start()
        if self.metrics is not None:
            self.endpoint = ObservabilityEndpoint(
                self.metrics.registry, settings.metrics.host, settings.metrics.port, ready=self._ready,
                sock=settings.metrics.listen_socket,
            )
            await self.endpoint.start()
        self._maintenance = asyncio.get_running_loop().create_task(self._maintain())

    def _admin_principals(self) -> frozenset[str] | None:
        # Read at each request: enforcement settings apply live on reload.
        enforcement = self.enforcement.settings if self.enforcement is not None else self.settings.enforcement
        return enforcement.admin_principals

    def _report_throttle(self, quota_type: str, tags: Mapping[str, str], throttle_ms: int, enforced: bool) -> None:
        metrics = self.metrics
        if metrics is not None:
            user, client_id = tags.get("user", ""), tags.get("client-id", "")
            metrics.throttled(quota_type, user, client_id, throttle_ms, enforced, "proxy")

    def _label_configured_entities(self) -> None:
        if self.metrics is None or self.config is None:
            return
        entities = [entry.entity.to_entity() for entry in self.config.quotas.entries]
        self.metrics.set_labelled_entities(
            users=[e.user for e in entities if e.user is not None],
            client_ids=[e.client_id for e in entities if e.client_id is not None],
        )

    def _ready(self) -> tuple[bool, str]:
        server = self.server
        if server is None:
            return False, "starting"
        if not server.directory.known_nodes():
            return False, "no upstream broker discovered yet"
        if self.fleet is not None:
            # Still serving under the fallback policy: ready, with the fallback in the body.
            return True, self.fleet.describe()
        return True, "ok"

    async def _maintain(self) -> None:
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
        try:
            config = load_config(self.files.paths)
        except ConfigError as exc:
            log.error("config reload (%s) rejected, running config unchanged:\n%s", why, exc)
            if self.metrics is not None:
                self.metrics.config_reload(False)
            return False
        previous = self.config
        if previous is not None:
            for section in _RESTART_SECTIONS:
                if getattr(previous, section) != getattr(config, section):
                    log.warning("config reload: changes to %r take effect only after a restart", section)
        self.config = config
        if self.engine is not None:
            self.engine.update(config.quota_settings())
        if self.enforcement is not None:
            self.enforcement.settings = enforcement_settings(config)
        self._label_configured_entities()
        if self.metrics is not None:
            self.metrics.config_reload(True)
        log.info("config reloaded (%s): %d quota entries", why, len(config.quotas.entries))
        self._share_quotas()
        return True

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
        self._fleet_quotas = (entries, ip_entries)
        engine = self.engine
        if engine is None or (tuple(engine.settings.entries), tuple(engine.settings.ip_entries)) == self._fleet_quotas:
            return
        if self.files is None:
            engine.update(dataclasses.replace(engine.settings, entries=entries, ip_entries=ip_entries))
            log.info("quotas from instance %s through the fleet: %d entries", instance, len(entries))
            return
        path = find_quota_file(self.files.paths)
        try:
            origin = self._origin(f"the fleet's quota topic, from instance {instance}")
            write_quota_entries(path, entries, ip_entries, origin)
        except ConfigError as exc:
            log.error("quotas from instance %s could not be written to %s, quotas unchanged:\n%s", instance, path, exc)
            return
        self.reload(f"quotas from instance {instance} through the fleet, written to {path}")

    def _origin(self, what: str) -> str:
        """An entry's origin stamp (kqp check-config shows it): what wrote it, where and when."""
        here = f" through instance {self.fleet.options.instance_id}" if self.fleet is not None else ""
        return f"{what}{here} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"

    def _store_quotas(self, settings: QuotaSettings, who: str) -> None:
        """AlterClientQuotas: write the entries back to the quota file, then reload from it."""
        if self.files is None:
            # Command-line only: nothing to write to, so the change lives until a restart.
            if self.engine is not None:
                self.engine.update(settings)
                self._share_quotas()
            return
        path = find_quota_file(self.files.paths)
        write_quota_entries(path, settings.entries, settings.ip_entries, self._origin(who))
        if not self.reload(f"AlterClientQuotas wrote {path}"):
            raise RuntimeError(f"{path} was written but does not reload; see the log")

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
        if self._maintenance is not None:
            self._maintenance.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintenance
        if self.fleet is not None:
            await self.fleet.stop()
        if self.server is not None:
            await self.server.stop()
        if self.endpoint is not None:
            await self.endpoint.stop()
        if self.capture is not None:
            self.capture.stop()
        if self.engine is not None:
            self.engine.close()


def enforcement_settings(config: KqpConfig) -> EnforcementSettings:
    return EnforcementSettings(
        default_partitions=config.enforcement.default_partitions,
        charge_validate_only=config.enforcement.charge_validate_only,
        admin_principals=(frozenset(config.enforcement.admin_principals)
                          if config.enforcement.admin_principals is not None else None),
    )


def app_settings_from_config(config: KqpConfig) -> AppSettings:
    p = config.proxy
    proxy = ProxyOptions(
        upstream_bootstrap=config.upstream.addresses() if config.upstream else (),
        bind_host=p.bind_host,
        bootstrap_port=p.bootstrap_port,
        node_port_base=p.node_port_base,
        node_ports=dict(p.node_ports),
        advertised_host=p.advertised_host,
        upstream_connect_timeout_s=p.upstream_connect_timeout_seconds,
        max_frame_bytes=p.max_frame_bytes,
        write_buffer_high_bytes=p.write_buffer_high_bytes,
        socket_receive_buffer_bytes=p.socket_receive_buffer_bytes,
        idle_timeout_s=p.idle_timeout_seconds,
        max_connections=p.max_connections,
        max_connections_per_ip=p.max_connections_per_ip,
        shutdown_grace_s=p.shutdown_grace_seconds,
        frame_read_timeout_s=p.frame_read_timeout_seconds,
        certificate_check_interval_s=p.certificate_check_interval_seconds,
        oauthbearer_sub_claim=(p.sasl or ListenerSaslSection()).oauthbearer_sub_claim_name,
        tls=ListenerTls(
            cert_file=p.tls.cert_file, key_file=p.tls.key_file, key_password=p.tls.key_password,
            ca_file=p.tls.ca_file, client_auth=p.tls.client_auth,
            principal_mapping_rules=p.tls.principal_mapping_rules,
            handshake_timeout_s=p.tls.handshake_timeout_seconds,
        ) if p.tls is not None else None,
        sni_routing=p.sni_routing.to_routes() if p.sni_routing is not None else None,
        upstream_tls=UpstreamTls(
            ca_file=u.ca_file, cert_file=u.cert_file, key_file=u.key_file, key_password=u.key_password,
            check_hostname=u.check_hostname,
        ) if (u := config.upstream.tls if config.upstream else None) is not None else None,
    )
    if proxy.tls is not None:
        # Rules are Kafka's grammar, checked here so that a bad value stops `kqp serve` at start.
        parse_principal_mapping_rules(proxy.tls.principal_mapping_rules)
    m, c = config.metrics, config.capture
    return AppSettings(
        fleet=fleet_options(config, proxy),
        proxy=proxy,
        enforcement=enforcement_settings(config),
        metrics=MetricsOptions(enabled=m.enabled, host=m.host, port=m.port, top_n_client_ids=m.top_n_client_ids),
        capture=CaptureOptions(
            enabled=c.enabled, directory=c.directory, proxy_id=c.proxy_id, rotate_bytes=c.rotate_bytes,
            rotate_seconds=c.rotate_seconds, queue_capacity=c.queue_capacity, sample_one_in=c.sample_one_in,
        ),
    )


def fleet_options(config: KqpConfig, proxy: ProxyOptions, enable: bool = False) -> FleetOptions | None:
    """The `fleet` section as options; None when it is off, unless `enable` (`--workers`)."""
    f = config.fleet
    if not (f.enabled or enable):
        return None
    # Empty until `settings_from_overrides` knows the upstream (a file or --upstream).
    servers = f.bootstrap_servers or _addresses(proxy.upstream_bootstrap)
    return FleetOptions(
        bootstrap_servers=tuple(servers), topic=f.topic, quota_topic=f"{f.topic}-quotas",
        instance_id=f.instance_id or "",
        report_interval_s=f.report_interval_seconds, unreachable_after_s=f.unreachable_after_seconds,
        on_unreachable=f.on_unreachable, max_unreported_share=f.max_unreported_share,
        replication_factor=f.replication_factor,
        ssl_context=upstream_context(proxy.upstream_tls) if proxy.upstream_tls is not None else None,
        sasl_mechanism=f.sasl_mechanism, sasl_username=f.sasl_username, sasl_password=f.sasl_password,
    )


def _addresses(servers: tuple[tuple[str, int], ...]) -> tuple[str, ...]:
    return tuple(f"{host}:{port}" for host, port in servers)


def settings_from_overrides(base: AppSettings | None, overrides: dict[str, Any]) -> AppSettings:
    """Apply `kqp serve` command-line options on top of the configured settings."""
    if base is None:
        base = AppSettings(
            proxy=ProxyOptions(upstream_bootstrap=()),
            enforcement=EnforcementSettings(),
            metrics=MetricsOptions(),
            capture=CaptureOptions(),
        )
    proxy = base.proxy
    if overrides.get("upstream"):
        proxy = dataclasses.replace(proxy, upstream_bootstrap=tuple(parse_host_port(a) for a in overrides["upstream"]))
    if not proxy.upstream_bootstrap:
        raise ValueError("no upstream brokers: set upstream.bootstrap_servers in a config file or give --upstream")
    for key in ("bootstrap_port", "node_port_base", "advertised_host", "bind_host"):
        if overrides.get(key) is not None:
            proxy = dataclasses.replace(proxy, **{key: overrides[key]})
    metrics = base.metrics
    if overrides.get("metrics_port") is not None:
        metrics = dataclasses.replace(metrics, port=overrides["metrics_port"])
    capture = base.capture
    if overrides.get("capture_dir"):
        capture = dataclasses.replace(capture, enabled=True, directory=overrides["capture_dir"])
    fleet = base.fleet
    if fleet is not None and not fleet.bootstrap_servers:
        fleet = dataclasses.replace(fleet, bootstrap_servers=_addresses(proxy.upstream_bootstrap))
    return dataclasses.replace(base, proxy=proxy, metrics=metrics, capture=capture, fleet=fleet)


@dataclass(frozen=True, slots=True)
class ServeSetup:
    """What `kqp serve` runs with: the merged config, its files (for reloads), the settings."""

    config: KqpConfig
    files: ConfigFiles | None
    settings: AppSettings


def load_serve_setup(config_paths: list[str], overrides: dict[str, Any] | None = None) -> ServeSetup | None:
    """The config files and command-line options, validated; None (reason logged) if invalid."""
    files = ConfigFiles(config_paths) if config_paths else None
    config = KqpConfig()
    try:
        if config_paths:
            config = load_config(config_paths)
        settings = settings_from_overrides(app_settings_from_config(config), overrides or {})
    except (ConfigError, ValueError) as exc:
        log.error("%s", exc)
        return None
    for warning in unreadable_login_warnings(config):
        log.warning("%s", warning)
    return ServeSetup(config, files, settings)


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run_app(setup: ServeSetup) -> None:
    """Run one proxy process on a new uvloop event loop until SIGTERM/SIGINT."""
    import uvloop

    async def main() -> None:
        app = ProxyApp(setup.settings, QuotaEngine(setup.config.quota_settings()), config=setup.config,
                       files=setup.files)
        await app.run()

    uvloop.run(main())


def serve_forever(config_paths: list[str], overrides: dict[str, Any] | None = None) -> int:
    """`kqp serve`: run until SIGTERM/SIGINT; SIGHUP or a file change reloads the config."""
    configure_logging()
    setup = load_serve_setup(config_paths, overrides)
    if setup is None:
        return 2
    run_app(setup)
    return 0
