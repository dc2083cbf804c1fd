"""What enforcement's policies share across connections, in one explicit place.

Each policy makes one object per connection (kqp.proxy.policies.chain); what must be seen
from another connection, or outlive one, is here, handed to every policy's factory. One
section per policy, named by it: a policy reads and writes its own section only, and learns
what the others decided from the folded verdict alone, never from their sections.

Pure apart from the connections' mute handles: time comes in as an argument (ms).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from kqp.config.models import EnforcementSection
from kqp.protocol.gate import ONE_AT_A_TIME_AFTER_THROTTLE_S
from kqp.proxy.hooks import ConnectionControl, FleetCharge
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import QuotaEngine
from kqp.quotas.recording import QuotaClient, RequestCharges
from kqp.quotas.turns import ConnectionTurns

# A throttled client is read one request at a time for its throttle plus this span (ms).
ONE_AT_A_TIME_SPAN_MS = ONE_AT_A_TIME_AFTER_THROTTLE_S * 1000.0

# The (principal, client-id) pair a throttle follows across connections.
ClientKey = tuple[str, str]


class MutationOrder(Protocol):
    """Charges partition mutations in an order every proxy of a fleet shares (kqp.proxy.fleet)."""

    def claim(self, client: QuotaClient, charges: RequestCharges) -> asyncio.Future[FleetCharge | None] | None:
        """A future for the charge once the fleet has applied it; None to charge here at once."""
        ...


class RecentThrottles:
    """`one_at_a_time`'s section: when each client's latest throttle ends (ms). A client that
    opens a new connection while throttled (librdkafka does after a request timeout) must not
    pipeline its backlog through it: see `ClientGate.read_one_at_a_time` in kqp.protocol.gate."""

    def __init__(self) -> None:
        self.until: dict[ClientKey, float] = {}

    def __contains__(self, client: object) -> bool:
        return client in self.until

    def note(self, client: ClientKey, throttle_ms: int, now_ms: float) -> None:
        until = now_ms + throttle_ms
        if until > self.until.get(client, 0.0):
            self.until[client] = until

    def one_at_a_time_s(self, client: ClientKey, now_ms: float) -> float:
        """How long the client is still read one request at a time (0: not)."""
        until = self.until.get(client)
        if until is None:
            return 0.0
        remaining_ms = until + ONE_AT_A_TIME_SPAN_MS - now_ms
        return remaining_ms / 1000.0 if remaining_ms > 0 else 0.0

    def forget_expired(self, now_ms: float) -> None:
        """Drop clients whose one-at-a-time span has passed, so the table does not grow with
        every client ever throttled."""
        cutoff = now_ms - ONE_AT_A_TIME_SPAN_MS
        for client in [client for client, until in self.until.items() if until < cutoff]:
            del self.until[client]


class ClientConnections:
    """`cluster_hold`'s section: each client's open connections, kept only while some quota
    has `scope: cluster` (a throttle on that one budget holds every connection, as one broker)."""

    def __init__(self) -> None:
        self.of: dict[ClientKey, dict[int, ConnectionControl]] = {}

    def add(self, client: ClientKey, connection_id: int, control: ConnectionControl) -> None:
        self.of.setdefault(client, {})[connection_id] = control

    def remove(self, client: ClientKey, connection_id: int) -> None:
        connections = self.of.get(client)
        if connections is not None:
            connections.pop(connection_id, None)
            if not connections:
                del self.of[client]


@dataclass(slots=True)
class PolicyRegistry:
    """The state shared by every connection's policies, one proxy (or worker) wide."""

    engine: QuotaEngine
    # Live: replaced when the configuration is reloaded.
    settings: EnforcementSection
    topics: TopicDirectory  # learned from Metadata by the server
    # Kafka's charging (both modules): numbers every engine call, so a replay of the capture
    # can order calls whose clock readings tie (see kqp.quotas.recording.QuotaTrace).
    engine_calls: int = 0
    recent_throttles: RecentThrottles = field(default_factory=RecentThrottles)
    cluster_connections: ClientConnections = field(default_factory=ClientConnections)
    # `fair_turns`: the connections charging each byte-rate budget, muted together until its
    # latest throttle ends (kqp.quotas.turns), and how to mute them.
    turns: ConnectionTurns = field(default_factory=lambda: ConnectionTurns(ONE_AT_A_TIME_SPAN_MS))
    turn_controls: dict[int, ConnectionControl] = field(default_factory=dict)
    # `fleet_mutation_order`: set when the proxy is one of a fleet.
    mutation_order: MutationOrder | None = None

    def forget_expired(self, now_ms: float) -> None:
        """Housekeeping off the data path (the app calls it every second)."""
        self.recent_throttles.forget_expired(now_ms)
        self.turns.expire(now_ms)
