"""The proxy's runtime settings, independent of how they were configured."""

from __future__ import annotations

from dataclasses import dataclass, field

from kqp.protocol.framing import DEFAULT_MAX_FRAME_BYTES


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
    idle_timeout_s: float = 600.0  # Kafka's connections.max.idle.ms
    # 0 means unlimited, as Kafka's max.connections / max.connections.per.ip defaults do.
    max_connections: int = 0
    max_connections_per_ip: int = 0
    shutdown_grace_s: float = 10.0

    def node_port(self, node_id: int) -> int:
        return self.node_ports.get(node_id, self.node_port_base + node_id)
