"""One request at a time after a throttle, on every connection of the client (not Kafka's).

A broker reads one request per connection at a time, so a throttled connection's pipelined
requests wait in its socket; the gate does the same on the connection that got the throttle
(kqp.protocol.gate). A client that opens a new connection while throttled (librdkafka does
after a request timeout) would pipeline its backlog through that one: so every connection of
a client throttled recently (its throttle plus one quota span) is read one request at a time.
"""

from __future__ import annotations

from kqp.proxy.hooks import ClientView, Exchange, RequestVerdict
from kqp.proxy.policies.policy import Policy
from kqp.proxy.policies.registry import PolicyRegistry


class OneAtATime(Policy):
    """Follows the client's throttles (`throttled`) and reads it one at a time after them."""

    def __init__(self, registry: PolicyRegistry) -> None:
        self._recent = registry.recent_throttles

    def request(self, client: ClientView, exchange: Exchange, frame: bytes, now_ms: float) -> RequestVerdict | None:
        recent = self._recent
        if not recent.until:
            return None
        seconds = recent.one_at_a_time_s((client.principal, exchange.header.client_id or ""), now_ms)
        return RequestVerdict(one_at_a_time_s=seconds) if seconds else None

    def throttled(self, client: ClientView, exchange: Exchange, throttle_ms: int, now_ms: float) -> None:
        self._recent.note((client.principal, exchange.header.client_id or ""), throttle_ms, now_ms)
