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
request at a time), and the last of them to be recorded sets the next end. Turns are fair in
bytes, not requests: a connection whose requests are smaller than the largest of the span
(librdkafka re-sends a timed-out batch in small requests after reconnecting) waits only
that part of the hold. The ThrottleTimeMs in each response stays Kafka's number; the mute
of a connection can be longer or shorter than it.

A turn also lasts at least as long as its bytes take at the quota's rate (`charged` with
the limit): Kafka's throttle holds the rate over its sliding window, so when a whole turn's
burst (ten 1 MB requests) leaves the window the next burst went through at once, 1.13-1.22x
of the quota in total; pacing the turns closes that.

Fetches differ in one way: a throttled fetch is answered empty (Kafka's answer, its bytes
unrecorded), so consumers released together race and all but the first get nothing. A fetch
answered empty therefore sizes its connection's turn but does not pace it (`charged` with
`delivered=False`), and the proxy holds a connection that got its bytes for a round of the
budget's connections (`taking_part`, kqp.proxy.policies.fair_turns), so the others go first.

Measured (10 librdkafka producers x 1 MiB/s, one client-id, 90 s, docs/quotas.md): 0.98x of
the quota in total, every producer within 0.84x-1.3x of an equal share, no request
time-out; Kafka's broker, same clients: 1.22x, 0.09x-4.9x, 388 time-outs.

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
    # When the bytes charged so far would have passed at the quota's rate: a turn lasts at
    # least that long, whatever Kafka's window makes of the burst.
    paced_until_ms: float = 0.0
    # connection id -> when it last charged this budget (ms)
    charged_at: dict[int, float] = field(default_factory=dict)
    # connection id -> its largest charge within the last span, and when
    largest_of: dict[int, tuple[float, float]] = field(default_factory=dict)
    # The largest single charge within the last span, and when: a turn is worth that much.
    largest: float = 0.0
    largest_at: float = 0.0

    def share_of_turn(self, connection_id: int) -> float:
        """What part of a turn the connection's requests use (1: a whole one), by its
        largest charge of the span: a connection that sent one small request may send a
        large one next."""
        own = self.largest_of.get(connection_id)
        if self.largest <= 0.0 or own is None:
            return 1.0
        return min(1.0, own[0] / self.largest)


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

    def charged(self, budget: Hashable, connection_id: int, amount: float, now_ms: float,
                limit: float | None = None, *, delivered: bool = True) -> None:
        """`connection_id` recorded `amount` (bytes) into `budget`, whose quota is `limit`/s.

        `delivered=False`: a throttled fetch answered empty (and unrecorded). The amount is still
        what the connection's requests are worth (it asks for the same again), so it sizes the
        connection's share of a turn, but no byte passed, so it does not pace the turn."""
        state = self._budgets.setdefault(budget, _Budget())
        if limit and delivered:
            state.paced_until_ms = max(state.paced_until_ms, now_ms) + amount * 1000.0 / limit
        state.charged_at[connection_id] = now_ms
        own = state.largest_of.get(connection_id)
        if own is None or amount >= own[0] or now_ms - own[1] > self._span_ms:
            state.largest_of[connection_id] = (amount, now_ms)
        if amount >= state.largest or now_ms - state.largest_at > self._span_ms:
            state.largest, state.largest_at = amount, now_ms
        self._budgets_of.setdefault(connection_id, set()).add(budget)

    def throttled(self, budget: Hashable, connection_id: int, throttle_ms: int, now_ms: float) -> list[Mute]:
        """A request of `connection_id` got `throttle_ms`: the mutes to apply, its own first.

        `throttle_ms` may be 0 (Kafka does not throttle it): the connection still waits for
        the turn. Its own mute runs to the budget's latest end, at least the paced end; when
        its charge moves that end, every
        other connection that takes part is muted to the new end too (a mute that already
        runs longer is not shortened: the proxy only ever extends a mute). A connection whose
        last request was smaller than the largest of the span waits that part of the time
        only, so turns are fair in bytes, not in requests: its next request comes sooner."""
        state = self._budgets.setdefault(budget, _Budget())
        state.charged_at.setdefault(connection_id, now_ms)
        self._budgets_of.setdefault(connection_id, set()).add(budget)
        end = max(now_ms + throttle_ms, state.paced_until_ms)
        until_ms = max(end, state.until_ms)
        mutes = [Mute(connection_id, math.ceil((until_ms - now_ms) * state.share_of_turn(connection_id)))]
        if end > state.until_ms:
            state.until_ms = end
            stale_before = now_ms - self._span_ms
            mutes += [Mute(other, math.ceil((end - now_ms) * state.share_of_turn(other)))
                      for other, charged_at in state.charged_at.items()
                      if other != connection_id and charged_at >= stale_before]
        return mutes

    def taking_part(self, budget: Hashable, now_ms: float) -> int:
        """How many connections charged `budget` within the last quota span."""
        state = self._budgets.get(budget)
        if state is None:
            return 0
        stale_before = now_ms - self._span_ms
        return sum(1 for charged_at in state.charged_at.values() if charged_at >= stale_before)

    def closed(self, connection_id: int) -> None:
        for budget in self._budgets_of.pop(connection_id, ()):
            state = self._budgets.get(budget)
            if state is not None:
                state.charged_at.pop(connection_id, None)
                state.largest_of.pop(connection_id, None)
                if not state.charged_at:
                    del self._budgets[budget]

    def expire(self, now_ms: float) -> None:
        """Forget connections that stopped charging a budget, and budgets left with none."""
        stale_before = now_ms - self._span_ms
        for budget, state in list(self._budgets.items()):
            for connection_id, charged_at in list(state.charged_at.items()):
                if charged_at < stale_before:
                    del state.charged_at[connection_id]
                    state.largest_of.pop(connection_id, None)
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

