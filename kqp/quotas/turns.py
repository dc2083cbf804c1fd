"""Fair turns for the connections that share one byte-rate budget (opt-in, not Kafka's).

What Kafka does: all connections of one client-id (or user) on a broker record into one
sensor, but each connection is muted only for the throttle its own request got
(ClientQuotaManager, KIP-219). The throttle is computed from the rate when that request was
recorded, so a connection whose request lands just after the window drained gets a short
throttle and comes back soon, while one whose request landed in a burst waits out a long one;
the short ones keep the rate near the quota on their own and the long ones starve. Measured
on Kafka 4.3.1 with ten librdkafka producers of one client-id: 0.00x to 0.82x of an equal
share each.

What this does instead, when `enforcement.fair_connection_turns` is on: a budget keeps the
end of the latest throttle it gave, and every connection that charged it within the last
quota span is muted until that end, the one that got the throttle included. The connections
are released together, each sends one request (the proxy reads a throttled connection one
request at a time), and the last of them to be recorded sets the next end. Each connection
thus gets one request per turn, and since nothing is recorded into the budget while all its
connections wait, Kafka's throttle formula brings the rate back to the quota exactly as it
does for one connection. The ThrottleTimeMs in each response stays Kafka's number; only the
mute of a connection can be longer than it.

Pure: time comes in as an argument (ms), connections are ids; the proxy applies the mutes.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field

__all__ = ["ConnectionTurns", "Mute"]


@dataclass(frozen=True, slots=True)
class Mute:
    """Mute `connection_id` for `mute_ms` from now."""

    connection_id: int
    mute_ms: int


@dataclass(slots=True)
class _Budget:
    until_ms: float = 0.0  # when the latest throttle of this budget ends
    # connection id -> when it last charged this budget (ms)
    charged_at: dict[int, float] = field(default_factory=dict)


class ConnectionTurns:
    """The connections of each budget and the end of its latest throttle.

    A budget is whatever key the caller gives: the proxy uses the sensor's (broker, user,
    client-id) and the quota it charged (produce or fetch), so a consumer that shares the
    producer's client-id is not held by the producer's throttles, as on a broker."""

    def __init__(self, span_ms: float) -> None:
        # A connection that has not charged the budget for this long no longer takes part:
        # a quota span (samples x window), after which its bytes have left the rate.
        self._span_ms = span_ms
        self._budgets: dict[Hashable, _Budget] = {}
        self._budgets_of: dict[int, set[Hashable]] = {}

    def charged(self, budget: Hashable, connection_id: int, now_ms: float) -> None:
        """`connection_id` recorded bytes into `budget`."""
        self._budgets.setdefault(budget, _Budget()).charged_at[connection_id] = now_ms
        self._budgets_of.setdefault(connection_id, set()).add(budget)

    def throttled(self, budget: Hashable, connection_id: int, throttle_ms: int, now_ms: float) -> list[Mute]:
        """A request of `connection_id` got `throttle_ms`: the mutes to apply, its own first.

        Its own mute runs to the budget's latest end; when its throttle moves that end, every
        other connection that takes part is muted to the new end too (a mute that already
        runs longer is not shortened: the proxy only ever extends a mute)."""
        state = self._budgets.setdefault(budget, _Budget())
        state.charged_at.setdefault(connection_id, now_ms)
        self._budgets_of.setdefault(connection_id, set()).add(budget)
        end = now_ms + throttle_ms
        mutes = [Mute(connection_id, max(throttle_ms, math.ceil(state.until_ms - now_ms)))]
        if end > state.until_ms:
            state.until_ms = end
            stale_before = now_ms - self._span_ms
            mutes += [Mute(other, throttle_ms) for other, charged_at in state.charged_at.items()
                      if other != connection_id and charged_at >= stale_before]
        return mutes

    def closed(self, connection_id: int) -> None:
        for budget in self._budgets_of.pop(connection_id, ()):
            state = self._budgets.get(budget)
            if state is not None:
                state.charged_at.pop(connection_id, None)
                if not state.charged_at:
                    del self._budgets[budget]

    def expire(self, now_ms: float) -> None:
        """Forget connections that stopped charging a budget, and budgets left with none."""
        stale_before = now_ms - self._span_ms
        for budget, state in list(self._budgets.items()):
            for connection_id, charged_at in list(state.charged_at.items()):
                if charged_at < stale_before:
                    del state.charged_at[connection_id]
                    budgets = self._budgets_of.get(connection_id)
                    if budgets is not None:
                        budgets.discard(budget)
                        if not budgets:
                            del self._budgets_of[connection_id]
            if not state.charged_at and state.until_ms < now_ms:
                del self._budgets[budget]

    def __len__(self) -> int:
        """Budgets tracked (for tests and metrics)."""
        return len(self._budgets)

