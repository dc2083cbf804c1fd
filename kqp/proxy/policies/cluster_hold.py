"""`scope: cluster` holds: a throttle on a cluster-wide budget mutes the client's other
connections too, as the one broker that budget stands for would (opt-in, not Kafka's).

Connections register their (principal, client-id) per request, not per connection: the
client id comes with each request header and may differ between requests of one connection.
They are kept only while some quota has `scope: cluster`.
"""

from __future__ import annotations

from kqp.proxy.hooks import ClientView, Exchange, RequestVerdict
from kqp.proxy.policies.policy import Policy
from kqp.proxy.policies.registry import ClientKey, PolicyRegistry


class ClusterHold(Policy):
    """Registers the connection under its clients; a throttle holds the client's others."""

    def __init__(self, registry: PolicyRegistry) -> None:
        self._engine = registry.engine
        self._connections = registry.cluster_connections
        # The clients this connection registered, to unregister them when it closes.
        self._keys: set[ClientKey] = set()

    def request(self, client: ClientView, exchange: Exchange, frame: bytes, now_ms: float) -> RequestVerdict | None:
        connections = self._connections
        in_use = connections.in_use if connections.checked_for is self._engine.settings else connections.check(
            self._engine)
        if in_use:
            key = (client.principal, exchange.header.client_id or "")
            connections.add(key, client.connection_id, client.control)
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
