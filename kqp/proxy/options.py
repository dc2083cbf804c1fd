"""The proxy's runtime settings: the `proxy` section of the configuration plus what the
running proxy learns elsewhere (the upstream brokers, their TLS, `--workers`).

Every setting and its default lives once, in kqp.config.models; this module adds fields,
never repeats one, so a setting added to `ProxySection` reaches the listeners as it is.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from kqp.config.models import ListenerSaslSection, ProxySection, UpstreamTlsSection
from kqp.config.section import NodeId
from kqp.protocol.sni_routing import SniRoutes

# Port 0 is a free port the OS picks: the IO layer takes it (tests, embedding), a file cannot.
ListenPort = Annotated[int, Field(ge=0, le=65535)]
_SECTION = ProxySection.model_fields


class ProxyOptions(ProxySection):
    # The section's listener ports, widened to take 0; their defaults are the section's.
    bootstrap_port: ListenPort = _SECTION["bootstrap_port"].default
    node_port_base: ListenPort = _SECTION["node_port_base"].default
    node_ports: dict[NodeId, ListenPort] = Field(default_factory=dict)
    # Upstream brokers the bootstrap listener forwards to, as (host, port): the `upstream`
    # section's, or --upstream's.
    upstream_bootstrap: tuple[tuple[str, int], ...]
    upstream_tls: UpstreamTlsSection | None = None
    # SO_REUSEPORT on every listener: `kqp serve --workers N` runs N processes on the same ports.
    reuse_port: bool = False

    def node_port(self, node_id: int) -> int:
        # A broker with node id N is served on node_port_base + N unless node_ports names it.
        return self.node_ports.get(node_id, self.node_port_base + node_id)

    @property
    def sni_routes(self) -> SniRoutes | None:
        """The SNI routing rules of `sni_routing`; None: a port per broker."""
        return self.sni_routing.to_routes() if self.sni_routing is not None else None

    @property
    def oauthbearer_sub_claim(self) -> str:
        """The JWT claim that names an OAUTHBEARER principal (`sasl`'s, or its default)."""
        return (self.sasl or ListenerSaslSection()).oauthbearer_sub_claim_name
