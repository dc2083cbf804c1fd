"""The YAML configuration as frozen pydantic models, one class per section: here the proxy's
own sections (listeners, upstream, metrics, capture, enforcement, fleet, workers) and the whole
`KqpConfig`; the quota sections (`quotas`, `guard`) in kqp.config.quota_sections; the base they
all build on in kqp.config.section.

Every model forbids unknown keys and validates in strict mode (no "9192" for 9192), and
every field name carries its unit (`_bytes`, `_seconds`, `_rate` in bytes/s as Kafka names
them). Quota entries use Kafka's own entity and config names and accept exactly the values
Kafka's AlterClientQuotas accepts (kafka-quota-spec.md section 8.3).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    Field,
    field_validator,
    model_validator,
)

from kqp.config.quota_sections import GuardSection, QuotasSection
from kqp.config.section import (
    HostPort,
    NodeId,
    NonEmptyText,
    Port,
    PositiveSeconds,
    Section,
    SocketBufferBytes,
    nested_error,
    parse_host_port,
)
from kqp.protocol.framing import DEFAULT_MAX_FRAME_BYTES
from kqp.protocol.proxy_header import Mode as ProxyProtocolMode
from kqp.protocol.sasl import DEFAULT_OAUTHBEARER_SUB_CLAIM, READABLE_MECHANISMS
from kqp.protocol.sni_routing import SniNameError, SniRoutes, check_broker_pattern, check_host_name
from kqp.quotas.settings import QuotaSettings

# Kept importable from here (check.py, advise.py), where it lived before the cluster guard needed it in kqp.quotas.
from kqp.quotas.settings import entity_text as entity_text


class ListenerTlsSection(Section):
    """TLS termination on every proxy listener (bootstrap and broker ports)."""

    cert_file: NonEmptyText
    key_file: NonEmptyText
    key_password: str | None = None
    # CAs whose client certificates are accepted; required unless client_auth is "none".
    ca_file: NonEmptyText | None = None
    client_auth: Literal["none", "requested", "required"] = "none"  # Kafka's ssl.client.auth
    principal_mapping_rules: NonEmptyText = "DEFAULT"  # Kafka's ssl.principal.mapping.rules
    handshake_timeout_seconds: PositiveSeconds = 10.0

    @model_validator(mode="after")
    def _ca_for_client_auth(self) -> ListenerTlsSection:
        if self.client_auth != "none" and self.ca_file is None:
            raise nested_error(
                "missing_ca", 'client_auth "{mode}" needs ca_file, the CAs that sign client certificates',
                ("ca_file",), mode=self.client_auth,
            )
        return self


class UpstreamTlsSection(Section):
    """TLS origination to the brokers."""

    ca_file: NonEmptyText | None = None  # none: the system's trust store
    cert_file: NonEmptyText | None = None
    key_file: NonEmptyText | None = None
    key_password: str | None = None
    check_hostname: bool = True

    @model_validator(mode="after")
    def _cert_with_key(self) -> UpstreamTlsSection:
        if (self.cert_file is None) != (self.key_file is None):
            missing = "key_file" if self.key_file is None else "cert_file"
            raise nested_error("incomplete_client_certificate", "a client certificate needs both cert_file "
                               "and key_file", (missing,))
        return self


def _sni_host_name(value: str) -> str:
    try:
        return check_host_name(value)
    except SniNameError as exc:
        raise ValueError(str(exc)) from None


def _sni_broker_pattern(value: str) -> str:
    try:
        return check_broker_pattern(value)
    except SniNameError as exc:
        raise ValueError(str(exc)) from None


class SniRoutingSection(Section):
    """One TLS port for the bootstrap and every broker, told apart by the SNI name the client
    sends, instead of a port per broker (node_port_base)."""

    bootstrap_host: Annotated[str, AfterValidator(_sni_host_name)]
    # Names advertised for the brokers, `$(nodeId)` standing for the node id.
    broker_host_pattern: Annotated[str, AfterValidator(_sni_broker_pattern)]
    # The port advertised with those names (a load balancer's); none: bootstrap_port.
    advertised_port: Port | None = None

    @model_validator(mode="after")
    def _bootstrap_not_a_broker(self) -> SniRoutingSection:
        try:
            self.to_routes()
        except SniNameError as exc:
            raise nested_error("ambiguous_name", "{reason}", ("bootstrap_host",), reason=str(exc)) from None
        return self

    def to_routes(self) -> SniRoutes:
        return SniRoutes(self.bootstrap_host, self.broker_host_pattern, self.advertised_port)


# Settings that give brokers ports and an address of their own, meaningless with sni_routing.
_PER_BROKER_PORT_SETTINGS = ("node_port_base", "node_ports", "advertised_host")


class ListenerSaslSection(Section):
    """What the proxy knows of the SASL logins its clients run with the brokers (passed through)."""

    # The mechanisms the brokers' listener behind the proxy enables (Kafka's
    # sasl.enabled.mechanisms); [] for a listener without SASL (PLAINTEXT, SSL, mTLS). Unset:
    # not known, so any mechanism may pass. It only decides check-config's and the startup
    # log's warnings: the proxy never refuses a mechanism, the broker does.
    mechanisms: tuple[NonEmptyText, ...] | None = None
    # The JWT claim that names an OAUTHBEARER principal: Kafka's sasl.oauthbearer.sub.claim.name
    # (the unsecured validator's unsecuredValidatorPrincipalClaimName); set it to the brokers'.
    oauthbearer_sub_claim_name: NonEmptyText = DEFAULT_OAUTHBEARER_SUB_CLAIM

    def unreadable_mechanisms(self) -> tuple[str, ...] | None:
        """The configured mechanisms whose principal the proxy cannot read; None: not known."""
        if self.mechanisms is None:
            return None
        return tuple(m for m in self.mechanisms if m.upper() not in READABLE_MECHANISMS)


def _cidr(value: str) -> str:
    try:
        ipaddress.ip_network(value)
    except ValueError as exc:
        raise ValueError(f"expected a network such as 10.0.0.0/8 or fd00::/8 (host bits zero), or one address: "
                         f"{exc}") from None
    return value


Cidr = Annotated[str, AfterValidator(_cidr)]


class ProxyProtocolSection(Section):
    """The PROXY protocol (HAProxy's, v1 text or v2 binary) on the client listeners: behind a load
    balancer, the client's own address comes in a header before its first bytes, and every
    per-IP rule, the capture, the logs and the metrics use it (docs/deploy.md)."""

    # off: no header is read. v1 / v2: connections from trusted_networks must begin with a
    # header of that version. auto: either version, or none (the socket's address stands).
    # Connections from elsewhere must not send one, whatever the mode.
    mode: ProxyProtocolMode = "off"
    # The balancers' addresses: only their headers are believed.
    trusted_networks: tuple[Cidr, ...] = ()
    # How long a new connection may take to send its header (or, when it need not, its first byte).
    header_timeout_seconds: PositiveSeconds = 10.0

    @model_validator(mode="after")
    def _trusted_when_on(self) -> ProxyProtocolSection:
        if self.mode != "off" and not self.trusted_networks:
            raise nested_error("no_trusted_networks", 'mode "{mode}" needs trusted_networks, the balancers\' '
                               "networks (CIDR): a header from any other source is refused",
                               ("trusted_networks",), mode=self.mode)
        return self

    @property
    def enabled(self) -> bool:
        return self.mode != "off"


class ProxySection(Section):
    # Clients reach broker N on node_port_base + N (or node_ports[N]): the proxy rewrites the
    # addresses in the answers that carry them (Metadata, FindCoordinator, ...) to advertised_host and these.
    bind_host: NonEmptyText = "127.0.0.1"
    bootstrap_port: Port = 9192
    node_port_base: Port = 9200
    # node id -> port, for brokers that must not be served on node_port_base + id.
    node_ports: dict[NodeId, Port] = Field(default_factory=dict)
    advertised_host: NonEmptyText = "127.0.0.1"
    upstream_connect_timeout_seconds: PositiveSeconds = 10.0
    max_frame_bytes: Annotated[int, Field(ge=1)] = DEFAULT_MAX_FRAME_BYTES
    # Flow control: the transports' write high-water mark; past it towards one side, the proxy stops
    # reading the other side until the backlog drains.
    write_buffer_high_bytes: Annotated[int, Field(ge=1)] = 4 * 1024 * 1024
    # Kafka's socket.receive.buffer.bytes and its default, set on the client-facing listeners.
    socket_receive_buffer_bytes: SocketBufferBytes = 102400
    # Kafka's connections.max.idle.ms (600000 on brokers); max_connections / _per_ip as Kafka's
    # max.connections and max.connections.per.ip, closed as soon as they are accepted.
    idle_timeout_seconds: PositiveSeconds = 600.0
    max_connections: Annotated[int, Field(ge=0)] = 0  # 0 = unlimited
    max_connections_per_ip: Annotated[int, Field(ge=0)] = 0
    shutdown_grace_seconds: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 10.0
    # How long a request frame may take to arrive in full once begun; a stalled sender holding a
    # partial frame buffer is closed (the idle sweep in kqp.proxy.server).
    frame_read_timeout_seconds: PositiveSeconds = 120.0
    # How often certificate files are checked for change; new connections get the new ones.
    certificate_check_interval_seconds: PositiveSeconds = 5.0
    tls: ListenerTlsSection | None = None
    sasl: ListenerSaslSection | None = None  # none: as ListenerSaslSection's defaults
    sni_routing: SniRoutingSection | None = None
    proxy_protocol: ProxyProtocolSection | None = None  # none: as mode "off"

    @model_validator(mode="after")
    def _sni_routing_alone(self) -> ProxySection:
        if self.sni_routing is None:
            return self
        if self.tls is None:
            raise nested_error("sni_without_tls", "sni_routing reads the TLS server name: it needs proxy.tls "
                               "(TLS terminated at the proxy)", ("sni_routing",))
        for name in _PER_BROKER_PORT_SETTINGS:
            if name in self.model_fields_set:
                raise nested_error("sni_with_node_ports", "{name} has no meaning with sni_routing: every broker "
                                   "is advertised as sni_routing.broker_host_pattern on one port; remove it",
                                   (name,), name=name)
        return self

    @model_validator(mode="after")
    def _ports_distinct(self) -> ProxySection:
        owner: dict[int, int] = {}
        for node_id, port in sorted(self.node_ports.items()):
            if port == 0:
                continue  # a free port the OS picks, never a clash (only kqp.proxy.options allows 0)
            if port == self.bootstrap_port:
                raise nested_error(
                    "port_clash", "port {port} of node {node} is also the bootstrap_port",
                    ("node_ports", node_id), port=port, node=node_id,
                )
            if port in owner:
                raise nested_error(
                    "port_clash", "port {port} is given to both node {first} and node {node}",
                    ("node_ports", node_id), port=port, first=owner[port], node=node_id,
                )
            owner[port] = node_id
        return self


class UpstreamSection(Section):
    bootstrap_servers: tuple[HostPort, ...]
    tls: UpstreamTlsSection | None = None

    @field_validator("bootstrap_servers")
    @classmethod
    def _at_least_one(cls, servers: tuple[str, ...]) -> tuple[str, ...]:
        # A validator rather than min_length, which would also complain when an item is invalid.
        if not servers:
            raise ValueError("expected at least one host:port")
        return servers

    def addresses(self) -> tuple[tuple[str, int], ...]:
        return tuple(parse_host_port(server) for server in self.bootstrap_servers)


class MetricsSection(Section):
    enabled: bool = True
    host: NonEmptyText = "127.0.0.1"
    port: Port = 9644
    # (user, client-id) pairs that keep their own metric labels; the rest are summed, so that a
    # client generating ids cannot blow up Prometheus' series count.
    top_n_client_ids: Annotated[int, Field(ge=0)] = 20


class CaptureSection(Section):
    enabled: bool = False
    directory: NonEmptyText = "capture"
    # Names the capture files (`<proxy_id>-<seq>.parquet`): a plain file name part.
    proxy_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")] = "kqp"
    # A capture file is closed and a new one started at whichever of size or age comes first.
    rotate_bytes: Annotated[int, Field(ge=1)] = 256 * 1024 * 1024
    rotate_seconds: PositiveSeconds = 3600.0
    # Records waiting for the writer thread; beyond it records are dropped and counted, because the
    # data path never waits on the disk. sample_one_in: capture 1 in N connections (1 = all).
    queue_capacity: Annotated[int, Field(ge=1)] = 100_000
    sample_one_in: Annotated[int, Field(ge=1)] = 1


class EnforcementSection(Section):
    # Partitions charged for a CreateTopics topic that asks for the broker's num.partitions (-1).
    default_partitions: Annotated[int, Field(ge=1)] = 1
    # KRaft brokers charge validateOnly CreateTopics/CreatePartitions; ZooKeeper brokers did not.
    charge_validate_only: bool = False
    # Principals ("User:alice") allowed to describe/alter quotas through the proxy, on top of
    # what the brokers' authorizer allows; None leaves it to the brokers alone.
    admin_principals: tuple[str, ...] | None = None
    # Opt-in, not Kafka's: the connections of one client that charge one byte-rate budget
    # are muted together until the budget's latest throttle ends, so they take turns instead
    # of some starving (kqp.quotas.turns, docs/quotas.md).
    fair_connection_turns: bool = False


class FleetSection(Section):
    """The usage exchange between proxy instances that enforce one budget (docs/scaling.md)."""

    enabled: bool = False
    # A one-partition topic of the fronted cluster, created at start if missing.
    topic: NonEmptyText = "_kqp_fleet_usage"
    # Unique per instance; default host:bootstrap-port:pid.
    instance_id: NonEmptyText | None = None
    # The shortest time between two usage reports of an instance: it waits twice the round trip
    # of its own reports through the topic when that is longer (kqp.quotas.fleet.ReportPacer).
    report_interval_seconds: Annotated[float, Field(ge=0.01, le=10.0, allow_inf_nan=False)] = 0.05
    # How long this instance's own reports may fail to come back before the fallback applies.
    unreachable_after_seconds: PositiveSeconds = 3.0
    # local: enforce this instance's own budget alone; share: quota / instances last seen.
    on_unreachable: Literal["local", "share"] = "share"
    # A client's usage is left out of this instance's reports while its rate is below this
    # share of its quota divided by the number of instances, so the fleet under-counts any
    # client by less than this share of its quota; 0 reports every client with a quota.
    max_unreported_share: Annotated[float, Field(ge=0.0, le=0.5, allow_inf_nan=False)] = 0.02
    # Accepted and without effect since issue 39: what it turned on (a produce throttle counting
    # what the other instances serving the client may have admitted meanwhile, as a fetch
    # throttle does) is how every fleet holds one budget now (docs/scaling.md).
    count_other_instances: bool = False
    # -1: 3, or the number of brokers when there are fewer.
    replication_factor: Annotated[int, Field(ge=-1)] = -1
    # Defaults to upstream.bootstrap_servers and upstream.tls; needs credentials of its own
    # when the brokers require SASL (the proxy holds none of its clients').
    bootstrap_servers: tuple[HostPort, ...] | None = None
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None


class WorkersSection(Section):
    """The `kqp serve --workers N` supervisor (docs/scaling.md): restarts and scrapes."""

    # A worker that dies is restarted after restart_backoff_seconds, doubled (with +-20%
    # jitter) for each further death in a row, up to restart_backoff_max_seconds.
    restart_backoff_seconds: PositiveSeconds = 0.5
    restart_backoff_max_seconds: PositiveSeconds = 30.0
    # A worker that dies this many times in a row, each time within stable_after_seconds of
    # its start, is crash-looping: the supervisor stops every worker and exits non-zero.
    max_restarts: Annotated[int, Field(ge=0)] = 5
    stable_after_seconds: PositiveSeconds = 60.0
    # How long the supervisor's /metrics and /readyz wait for a worker's answer; a worker
    # slower than this is reported as such and its figures left out of that scrape.
    scrape_timeout_seconds: PositiveSeconds = 1.0

    @model_validator(mode="after")
    def _backoff_order(self) -> WorkersSection:
        if self.restart_backoff_max_seconds < self.restart_backoff_seconds:
            raise nested_error("backoff_order", "restart_backoff_max_seconds must be at least "
                               "restart_backoff_seconds", ("restart_backoff_max_seconds",))
        return self


@dataclass(frozen=True, slots=True)
class CommandLine:
    """`kqp serve`'s options that override a setting; None (or empty) leaves it to the files."""

    upstream: Sequence[str] = ()
    bootstrap_port: int | None = None
    node_port_base: int | None = None
    advertised_host: str | None = None
    bind_host: str | None = None
    metrics_port: int | None = None
    capture_dir: str | None = None


class KqpConfig(Section):
    """The whole configuration, after merging every file."""

    proxy: ProxySection = ProxySection()
    # Optional so that a quota-only file (the Spark what-if, check-config) stands alone;
    # `kqp serve` needs it from a file or --upstream.
    upstream: UpstreamSection | None = None
    metrics: MetricsSection = MetricsSection()
    capture: CaptureSection = CaptureSection()
    quotas: QuotasSection = QuotasSection()
    enforcement: EnforcementSection = EnforcementSection()
    fleet: FleetSection = FleetSection()
    workers: WorkersSection = WorkersSection()
    guard: GuardSection = GuardSection()

    @model_validator(mode="after")
    def _guard_fleet_wide_needs_the_fleet(self) -> KqpConfig:
        if self.guard.enabled and self.guard.fleet_wide and not self.fleet.enabled:
            raise nested_error("guard_fleet_wide", "guard.fleet_wide shares the guard's measurements over the "
                               "fleet exchange: it needs the fleet section enabled", ("guard", "fleet_wide"))
        return self

    def with_command_line(self, options: CommandLine) -> KqpConfig:
        """This configuration with `kqp serve`'s options on top, validated as a file would be.

        Raises pydantic's ValidationError (a ValueError) for a value the section refuses.
        """
        proxy = {name: value for name, value in (
            ("bootstrap_port", options.bootstrap_port), ("node_port_base", options.node_port_base),
            ("advertised_host", options.advertised_host), ("bind_host", options.bind_host),
        ) if value is not None}
        upstream = self.upstream
        if options.upstream:
            servers = tuple(options.upstream)
            upstream = (upstream.updated(bootstrap_servers=servers) if upstream is not None
                        else UpstreamSection(bootstrap_servers=servers))
        metrics = self.metrics.updated(port=options.metrics_port) if options.metrics_port is not None else self.metrics
        capture = (self.capture.updated(enabled=True, directory=options.capture_dir) if options.capture_dir
                   else self.capture)
        return self.model_copy(update={
            "proxy": self.proxy.updated(**proxy), "upstream": upstream, "metrics": metrics, "capture": capture,
        })

    def quota_settings(self) -> QuotaSettings:
        q = self.quotas
        return QuotaSettings(
            entries=tuple(entry.to_entry() for entry in q.entries),
            ip_entries=tuple(entry.to_entry() for entry in q.ip_entries),
            scope=q.scope,
            dry_run=q.dry_run,
            window_num=q.window_num,
            window_size_s=q.window_size_seconds,
            controller_window_num=q.controller_window_num,
            controller_window_size_s=q.controller_window_size_seconds,
            sensor_expiry_s=q.sensor_expiry_seconds,
            callback=q.callback.class_ if q.callback else None,
            callback_options=dict(q.callback.options) if q.callback else {},
        )
