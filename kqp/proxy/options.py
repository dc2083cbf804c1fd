"""The proxy's runtime settings, independent of how they were configured."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from kqp.protocol.framing import DEFAULT_MAX_FRAME_BYTES
from kqp.protocol.sasl import DEFAULT_OAUTHBEARER_SUB_CLAIM
from kqp.protocol.sni_routing import SniRoutes

ClientAuth = Literal["none", "requested", "required"]  # Kafka's ssl.client.auth


@dataclass(frozen=True, slots=True)
class ListenerTls:
    """TLS termination on the proxy's listeners."""

    cert_file: str
    key_file: str
    key_password: str | None = None
    # CAs that sign acceptable client certificates; needed when client_auth is not "none".
    ca_file: str | None = None
    client_auth: ClientAuth = "none"
    # Kafka's ssl.principal.mapping.rules: certificate subject -> user principal.
    principal_mapping_rules: str = "DEFAULT"
    handshake_timeout_s: float = 10.0


@dataclass(frozen=True, slots=True)
class UpstreamTls:
    """TLS origination to the brokers."""

    ca_file: str | None = None  # None: the system's trust store
    cert_file: str | None = None  # client certificate, for brokers that require mTLS
    key_file: str | None = None
    key_password: str | None = None
    check_hostname: bool = True


@dataclass(frozen=True, slots=True)
class ProxyOptions:
    # Upstream brokers the bootstrap listener forwards to, as (host, port).
    upstream_bootstrap: tuple[tuple[str, int], ...]
    bind_host: str = "127.0.0.1"
    bootstrap_port: int = 9192
    # A broker with node id N is served on node_port_base + N unless node_ports names it.
    node_port_base: int = 9200
    node_ports: dict[int, int] = field(default_factory=dict)
    advertised_host: str = "127.0.0.1"
    upstream_connect_timeout_s: float = 10.0
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    # Stop reading from one side while the other side has more than this buffered.
    write_buffer_high_bytes: int = 4 * 1024 * 1024
    # SO_RCVBUF of client connections, as Kafka's socket.receive.buffer.bytes (-1: the OS's).
    # Kept small as on a broker, so a muted client feels back-pressure at once instead of
    # queueing megabytes of requests in the kernel that then wait out many throttles.
    socket_receive_buffer_bytes: int = 102400
    idle_timeout_s: float = 600.0  # Kafka's connections.max.idle.ms
    # 0 means unlimited, as Kafka's max.connections / max.connections.per.ip defaults do.
    max_connections: int = 0
    max_connections_per_ip: int = 0
    shutdown_grace_s: float = 10.0
    # A request frame must arrive whole within this long of its first byte (slowloris guard).
    frame_read_timeout_s: float = 120.0
    tls: ListenerTls | None = None
    # One TLS port for everything, brokers told apart by SNI name; None: a port per broker.
    sni_routing: SniRoutes | None = None
    upstream_tls: UpstreamTls | None = None
    # How often certificate files are checked for changes.
    certificate_check_interval_s: float = 5.0
    # The JWT claim naming an OAUTHBEARER principal (Kafka's sasl.oauthbearer.sub.claim.name).
    oauthbearer_sub_claim: str = DEFAULT_OAUTHBEARER_SUB_CLAIM
    # SO_REUSEPORT on every listener: `kqp serve --workers N` runs N processes on the same ports.
    reuse_port: bool = False

    def node_port(self, node_id: int) -> int:
        return self.node_ports.get(node_id, self.node_port_base + node_id)
