"""Fair turns for the connections that share one byte-rate budget (`fair_connection_turns`,
opt-in, not Kafka's; the why and the measurements are in kqp.quotas.turns).

Each Produce or Fetch response's charge is noted against its budget; its connection is then
muted for the budget's turn instead of Kafka's throttle (`turn`), and when that moves the
budget's end, the budget's other connections are muted to it too. The ThrottleTimeMs the
client reads stays Kafka's number.
"""

from __future__ import annotations

import math

from kqp.config.models import EnforcementSection
from kqp.protocol.api_keys import ApiKey
from kqp.proxy.hooks import ClientView, Exchange
from kqp.proxy.policies.policy import Policy
from kqp.proxy.policies.registry import PolicyRegistry
from kqp.quotas import QuotaSettings, QuotaType
from kqp.quotas.recording import broker_label


class FairTurns(Policy):
    """Mutes the connections of one budget together, in turns fair in bytes."""

    response_apis = frozenset({ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.SHARE_FETCH})

    def __init__(self, registry: PolicyRegistry) -> None:
        self._engine = registry.engine
        self._turns = registry.turns
        self._controls = registry.turn_controls

    @classmethod
    def enabled(cls, settings: EnforcementSection, quotas: QuotaSettings) -> bool:
        return settings.fair_connection_turns

    def turn(self, client: ClientView, exchange: Exchange, body_size: int, throttle_ms: int,
             now_ms: float, delivered: bool = True) -> int | None:
        # The budget as the sensor names it, and Produce or Fetch: a consumer sharing a
        # producer's client-id is not held by its throttles.
        api_key = exchange.header.api_key
        family = ApiKey.PRODUCE if api_key == ApiKey.PRODUCE else ApiKey.FETCH
        client_id = exchange.header.client_id or ""
        budget = (broker_label(client.broker), client.principal, client_id, family)
        amount = exchange.request_bytes - 4 if family == ApiKey.PRODUCE else body_size
        quota_type: QuotaType = "producer_byte_rate" if family == ApiKey.PRODUCE else "consumer_byte_rate"
        limit = self._engine.quota(quota_type, client.principal, client_id)
        # A fetch answered empty still sizes the connection's turn (it fetches the same again).
        self._turns.charged(budget, client.connection_id, amount, now_ms, limit, delivered=delivered)
        self._controls[client.connection_id] = client.control
        own, *others = self._turns.throttled(budget, client.connection_id, throttle_ms, now_ms)
        for other in others:
            control = self._controls.get(other.connection_id)
            if control is not None and other.mute_ms > 0:
                control.mute(other.mute_ms)
        if family == ApiKey.FETCH and delivered and throttle_ms <= 0 and limit:
            # Consumers released together race, and Kafka answers all but the first empty (a
            # throttled fetch's bytes pass no more): the first to arrive would take every turn
            # its phase lets it. A connection that got its bytes therefore waits a round, one
            # such fetch per connection of the budget at the quota, and the others go first.
            round_ms = self._turns.taking_part(budget, now_ms) * amount * 1000.0 / limit
            return max(own.mute_ms, math.ceil(round_ms))
        return own.mute_ms

    def closed(self, client: ClientView) -> None:
        self._turns.closed(client.connection_id)
        self._controls.pop(client.connection_id, None)
