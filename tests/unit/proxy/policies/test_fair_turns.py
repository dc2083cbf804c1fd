"""kqp.proxy.policies.fair_turns through the enforcement chain, called directly (no sockets):
the connections charging one budget are muted together (the arithmetic is kqp.quotas.turns',
tested in tests/unit/quotas/test_turns.py)."""

from __future__ import annotations

from kqp.config.models import EnforcementSection
from kqp.protocol.apis import PRODUCE_KEY
from kqp.protocol.headers import encode_response_header, response_body_offset
from kqp.proxy.hooks import ClientView, ResponseVerdict
from kqp.proxy.policies.chain import EnforcementPolicies
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings
from tests.unit.helpers.exchanges import exchange_for, produce_pair, request_frame


class Mutes:
    """A connection control that records the mutes other connections' policies give it."""

    def __init__(self) -> None:
        self.mutes: list[int] = []

    def mute(self, throttle_ms: int, *, one_at_a_time: bool = True) -> None:
        self.mutes.append(throttle_ms)


def produce_through(chain: EnforcementPolicies, client: ClientView) -> ResponseVerdict | None:
    request, response = produce_pair(9, {"name": "orders"}, (0, 0))
    frame = request_frame(PRODUCE_KEY, 9, request)
    exchange = exchange_for(frame)
    chain.request(client, exchange, frame)
    answer = encode_response_header(PRODUCE_KEY, 9, 7) + bytes(response.encode())
    return chain.response(client, exchange, answer, response_body_offset(answer, PRODUCE_KEY, 9))


def two_connections(fair: bool) -> tuple[ResponseVerdict | None, ResponseVerdict | None, Mutes]:
    # 100 B/s for client-1: the second request of the budget is over it.
    settings = QuotaSettings(entries=(QuotaEntry(QuotaEntity(client_id="client-1"), {"producer_byte_rate": 100}),))
    chain = EnforcementPolicies(QuotaEngine(settings), EnforcementSection(fair_connection_turns=fair),
                                lambda: 5_000.0, TopicDirectory())
    first_mutes = Mutes()
    first = ClientView(1, "127.0.0.1:1", "bootstrap", 1, "ANONYMOUS", first_mutes)
    second = ClientView(2, "127.0.0.1:2", "bootstrap", 1, "ANONYMOUS", Mutes())
    return produce_through(chain, first), produce_through(chain, second), first_mutes


def test_a_throttle_on_one_connection_holds_the_budgets_other_connection() -> None:
    _, throttled, first_mutes = two_connections(fair=True)
    assert throttled is not None and throttled.throttle_ms > 0
    # Both connections charged the budget within the span: the first is muted to its end too.
    assert first_mutes.mutes and first_mutes.mutes[-1] > 0
    assert throttled.mute_ms >= first_mutes.mutes[-1]


def test_without_fair_turns_only_the_throttled_connection_waits() -> None:
    _, throttled, first_mutes = two_connections(fair=False)
    assert throttled is not None and throttled.mute_ms == throttled.throttle_ms > 0
    assert first_mutes.mutes == []
