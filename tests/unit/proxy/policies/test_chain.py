"""kqp.proxy.policies.chain: policies made per connection, run in phases, their verdicts folded
by the written rule; called directly (no sockets), with stand-in policies where the rule is
the subject and the real ones where the dispatch is."""

from __future__ import annotations

from kqp.config.models import EnforcementSection
from kqp.protocol.api_keys import ApiKey
from kqp.protocol.apis import PRODUCE_KEY
from kqp.protocol.headers import encode_response_header, response_body_offset
from kqp.proxy.hook_chain import HookChain
from kqp.proxy.hooks import ClientView, Exchange, RequestVerdict, ResponseVerdict
from kqp.proxy.observation import ObservationHooks
from kqp.proxy.policies.chain import POLICIES, EnforcementPolicies
from kqp.proxy.policies.fair_turns import FairTurns
from kqp.proxy.policies.policy import Policy
from kqp.proxy.policies.registry import PolicyRegistry
from kqp.proxy.policies.tables import ConnectionPolicies
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings
from tests.unit.helpers.client_views import client_view
from tests.unit.helpers.exchanges import exchange_for, produce_pair, request_frame

TOLD: list[tuple[str, int]] = []


class Throttles(Policy):
    """Throttles every response for its `ms` and asks a mute as long."""

    ms = 0

    def __init__(self, registry: PolicyRegistry) -> None:
        self.registry = registry

    def response(self, client: ClientView, exchange: Exchange, frame: bytes | bytearray, body_offset: int,
                 body_size: int, now_ms: float) -> ResponseVerdict | None:
        return ResponseVerdict(mute_ms=self.ms, throttle_ms=self.ms) if self.ms else None


class Short(Throttles):
    ms = 200


class Long(Throttles):
    ms = 500


class Follower(Policy):
    def __init__(self, registry: PolicyRegistry) -> None:
        pass

    def throttled(self, client: ClientView, exchange: Exchange, throttle_ms: int, now_ms: float) -> None:
        TOLD.append(("throttled", throttle_ms))


class Turn(Policy):
    response_apis = frozenset({ApiKey.PRODUCE})

    def __init__(self, registry: PolicyRegistry) -> None:
        pass

    def turn(self, client: ClientView, exchange: Exchange, body_size: int, throttle_ms: int,
             now_ms: float, delivered: bool = True) -> int | None:
        TOLD.append(("turn", throttle_ms))
        return 120


def produce_exchange() -> tuple[Exchange, bytes, int]:
    request, response = produce_pair(9, {"name": "orders"}, (0, 0))
    answer = encode_response_header(PRODUCE_KEY, 9, 7) + bytes(response.encode())
    return exchange_for(request_frame(PRODUCE_KEY, 9, request)), answer, response_body_offset(answer, PRODUCE_KEY, 9)


def chain_of(*factories: type[Policy], settings: QuotaSettings | None = None) -> EnforcementPolicies:
    return EnforcementPolicies(QuotaEngine(settings or QuotaSettings()), EnforcementSection(), lambda: 1_000.0,
                               TopicDirectory(), factories=factories)


def test_throttles_fold_to_the_largest_and_followers_hear_the_fold_once() -> None:
    TOLD.clear()
    exchange, answer, body_offset = produce_exchange()
    verdict = chain_of(Short, Long, Follower).response(client_view(), exchange, answer, body_offset)
    assert verdict is not None
    assert (verdict.throttle_ms, verdict.mute_ms) == (500, 500)
    assert TOLD == [("throttled", 500)]
    # The exchange records the folded throttle: what observation reads.
    assert exchange.proxy_throttle_ms == 500


def test_a_turn_replaces_the_folded_mute_and_the_throttle_stays() -> None:
    TOLD.clear()
    exchange, answer, body_offset = produce_exchange()
    verdict = chain_of(Long, Follower, Turn).response(client_view(), exchange, answer, body_offset)
    assert verdict is not None
    assert (verdict.throttle_ms, verdict.mute_ms) == (500, 120)
    assert TOLD == [("throttled", 500), ("turn", 500)]


def test_without_a_throttle_no_follower_is_told_and_no_verdict_is_made() -> None:
    TOLD.clear()
    exchange, answer, body_offset = produce_exchange()
    assert chain_of(Follower).response(client_view(), exchange, answer, body_offset) is None
    assert TOLD == []
    assert exchange.proxy_throttle_ms == 0


def test_the_fold_rule() -> None:
    first = RequestVerdict(frame=b"a", mute_ms=5, one_at_a_time_s=2.0, throttle_ms=5)
    first.fold(RequestVerdict(answer=b"b", mute_ms=3, one_at_a_time_s=4.0, throttle_ms=9))
    assert first == RequestVerdict(frame=b"a", answer=b"b", mute_ms=5, one_at_a_time_s=4.0, throttle_ms=9)
    response = ResponseVerdict(frame=b"x", mute_ms=7, throttle_ms=1)
    response.fold(ResponseVerdict(frame=b"y", mute_ms=2, throttle_ms=3))
    assert response == ResponseVerdict(frame=b"y", mute_ms=7, throttle_ms=3)


def test_each_connection_gets_its_own_policy_objects_and_keeps_them() -> None:
    chain = EnforcementPolicies(QuotaEngine(QuotaSettings()), EnforcementSection(), lambda: 1_000.0,
                                TopicDirectory())
    first, second = client_view(1), client_view(2)
    chain.connection_opened(first)
    chain.connection_opened(second)
    mine, theirs = first.state.policies, second.state.policies
    assert isinstance(mine, ConnectionPolicies) and isinstance(theirs, ConnectionPolicies)
    assert len(mine.policies) == len(POLICIES)
    assert not set(map(id, mine.policies)) & set(map(id, theirs.policies))  # none shared
    request, _ = produce_pair(9, {"name": "orders"}, (0, 0))
    frame = request_frame(PRODUCE_KEY, 9, request)
    chain.request(first, exchange_for(frame), frame)
    assert first.state.policies is mine  # made once, with the connection


def test_only_the_phases_and_apis_a_policy_declares_are_in_its_tables() -> None:
    chain = EnforcementPolicies(QuotaEngine(QuotaSettings()), EnforcementSection(), lambda: 1_000.0,
                                TopicDirectory())
    client = client_view()
    chain.connection_opened(client)
    policies = client.state.policies
    produce, create_topics = policies.calls(ApiKey.PRODUCE), policies.calls(ApiKey.CREATE_TOPICS)
    assert produce.hold == () and len(create_topics.hold) == 1  # the fleet's order, for mutations only
    # No quota has `scope: cluster`: the cluster hold takes no part (and costs a request nothing).
    assert [call.__self__.__class__.__name__ for call in produce.request] == ["KafkaCharging", "OneAtATime"]
    assert [call.__self__.__class__.__name__ for call in produce.response] == ["KafkaCharging"]
    assert produce.turn == ()  # fair turns is off
    # The hook chain does not even call enforcement's `hold` for a Produce.
    hooks = HookChain([chain, ObservationHooks(None, None, clock=lambda: 0.0, topics=TopicDirectory())])
    assert hooks.calls_for("hold", ApiKey.PRODUCE) == ()
    assert len(hooks.calls_for("hold", ApiKey.CREATE_TOPICS)) == 1


def test_a_reload_that_turns_fair_turns_on_reaches_open_connections() -> None:
    settings = QuotaSettings(entries=(QuotaEntry(QuotaEntity(client_id="client-1"), {"producer_byte_rate": 1e9}),))
    chain = chain_of(*POLICIES, settings=settings)
    client = client_view()
    exchange, answer, body_offset = produce_exchange()
    assert chain.response(client, exchange, answer, body_offset) is None
    chain.settings = EnforcementSection(fair_connection_turns=True)
    assert [type(call.__self__) for call in client.state.policies.calls(ApiKey.PRODUCE).turn] == [FairTurns]
    assert len(chain.registry.turns) == 0
    exchange, answer, body_offset = produce_exchange()
    chain.response(client, exchange, answer, body_offset)
    assert len(chain.registry.turns) == 1  # the budget the response charged now takes turns


def test_a_quota_with_cluster_scope_brings_the_cluster_hold_in_for_open_connections() -> None:
    engine = QuotaEngine(QuotaSettings())
    chain = EnforcementPolicies(engine, EnforcementSection(), lambda: 1_000.0, TopicDirectory())
    client = client_view()
    chain.connection_opened(client)
    assert "ClusterHold" not in [type(call.__self__).__name__ for call in client.state.policies.calls(0).request]
    engine.update(QuotaSettings(scope="cluster"))
    names = [type(call.__self__).__name__ for call in client.state.policies.calls(ApiKey.PRODUCE).request]
    assert names == ["KafkaCharging", "OneAtATime", "ClusterHold"]


class Rewrites(Policy):
    """Replaces the request's last byte with 0xAA, on the frame it is given."""

    def __init__(self, registry: PolicyRegistry) -> None:
        pass

    def request(self, client: ClientView, exchange: Exchange, frame: bytes, now_ms: float) -> RequestVerdict | None:
        return RequestVerdict(frame=frame[:-1] + b"\xaa")


class AppendsAndRecords(Policy):
    """Records the frame it is given and appends a byte to it."""

    SEEN: list[bytes] = []

    def __init__(self, registry: PolicyRegistry) -> None:
        pass

    def request(self, client: ClientView, exchange: Exchange, frame: bytes, now_ms: float) -> RequestVerdict | None:
        AppendsAndRecords.SEEN.append(frame)
        return RequestVerdict(frame=frame + b"\xbb")


def test_a_later_policy_is_given_the_frame_an_earlier_one_replaced_and_its_replacement_is_sent() -> None:
    AppendsAndRecords.SEEN.clear()
    exchange, _, _ = produce_exchange()
    original = request_frame(PRODUCE_KEY, 9, produce_pair(9, {"name": "orders"}, (0, 0))[0])
    verdict = chain_of(Rewrites, AppendsAndRecords).request(client_view(1), exchange, original)
    assert [original[:-1] + b"\xaa"] == AppendsAndRecords.SEEN
    assert verdict is not None and verdict.frame == original[:-1] + b"\xaa\xbb"
