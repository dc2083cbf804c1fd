"""`scope: cluster` holds: a throttle on a cluster-wide budget mutes the client's other
connections too, as the one broker that budget stands for would (opt-in, not Kafka's).

Connections register their (principal, client-id) per request, not per connection: the
client id comes with each request header and may differ between requests of one connection.
They are kept only while some quota has `scope: cluster`: otherwise the policy takes no
part (`enabled`), and costs a request nothing.
"""

from __future__ import annotations

from kqp.config.models import EnforcementSection
from kqp.proxy.hooks import ClientView, Exchange, RequestVerdict
from kqp.proxy.policies.policy import Policy
from kqp.proxy.policies.registry import ClientKey, PolicyRegistry
from kqp.quotas import QuotaSettings


class ClusterHold(Policy):
    """Registers the connection under its clients; a throttle holds the client's others."""

    def __init__(self, registry: PolicyRegistry) -> None:
        self._engine = registry.engine
        self._connections = registry.cluster_connections
        # The clients this connection registered, to unregister them when it closes.
        self._keys: set[ClientKey] = set()

    @classmethod
    def enabled(cls, settings: EnforcementSection, quotas: QuotaSettings) -> bool:
        return quotas.scope == "cluster" or any(entry.scope == "cluster" for entry in quotas.entries)

    def request(self, client: ClientView, exchange: Exchange, frame: bytes, now_ms: float) -> RequestVerdict | None:
        key = (client.principal, exchange.header.client_id or "")
        self._connections.add(key, client.connection_id, client.control)
        self._keys.add(key)
        return None

    def throttled(self, client: ClientView, exchange: Exchange, throttle_ms: int, now_ms: float) -> None:
        key = (client.principal, exchange.header.client_id or "")
        others = self._connections.of.get(key)
        if not others or len(others) < 2 or not self._engine.cluster_scoped(*key):
            return
        for connection_id, other in others.items():
            if connection_id != client.connection_id:
                other.mute(throttle_ms, one_at_a_time=False)

    def closed(self, client: ClientView) -> None:
        for key in self._keys:
            self._connections.remove(key, client.connection_id)
