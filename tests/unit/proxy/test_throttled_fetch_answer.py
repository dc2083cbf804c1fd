"""A throttled Fetch is answered as Kafka's broker answers it: empty, with the throttle and the
broker's fetch session id, its bytes unrecorded, the client muted for the throttle (KIP-219),
on the streamed (cut-through) path and the whole-frame path alike; the broker's data, already
read from the broker, is dropped, and the responses behind it stay in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from kafka.protocol.consumer import FetchResponse

from kqp.config.models import EnforcementSection
from kqp.protocol.apis import FETCH_KEY
from kqp.protocol.headers import RequestHeader, response_correlation_id
from kqp.protocol.session import CUT_THROUGH_MIN_BYTES
from kqp.proxy.hook_chain import HookChain
from kqp.proxy.hooks import ClientView, Exchange, ResponseVerdict, TrafficHooks
from kqp.proxy.policies.chain import EnforcementPolicies
from kqp.proxy.server import ProxyServer
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import QuotaEngine
from kqp.quotas.settings import QuotaEntity, QuotaEntry, QuotaSettings
from tests.unit.helpers.fake_broker import FakeBroker, RawClient
from tests.unit.helpers.fetch import FETCH_VERSION, TOPIC_ID, decode, fetch_request, records
from tests.unit.helpers.proxy import HEARTBEAT_KEY, answer_heartbeat, heartbeat_request, start_proxy

SESSION_ID = 424_242
# The consumer's fetches are incremental in SESSION_ID, so Kafka's throttled answer keeps
# the session's id (IncrementalFetchContext.getThrottledResponse).
INCREMENTAL_EPOCH = 3
LARGE = records(600_000)  # streamed: over CUT_THROUGH_MIN_BYTES
SMALL = records(30_000)  # forwarded whole


def answer_fetch_in_session(data: bytes) -> Callable[[RequestHeader, bytes], bytes]:
    """A broker in an incremental fetch session: one partition of `data`, the session's id."""

    def answer(header: RequestHeader, body: bytes) -> bytes:
        data_cls = FetchResponse.FetchableTopicResponse.PartitionData
        partition = data_cls(
            partition_index=0, error_code=0, high_watermark=1_000, last_stable_offset=1_000, log_start_offset=0,
            diverging_epoch=None, current_leader=data_cls.LeaderIdAndEpoch(leader_id=1, leader_epoch=3),
            snapshot_id=None, aborted_transactions=[], preferred_read_replica=-1, records=data)
        return bytes(FetchResponse[FETCH_VERSION](
            throttle_time_ms=0, error_code=0, session_id=SESSION_ID, node_endpoints=[],
            responses=[FetchResponse.FetchableTopicResponse(topic_id=TOPIC_ID, partitions=[partition])]).encode())

    return answer


class Seen(TrafficHooks):
    """What the hooks after enforcement (observation) are told the client got."""

    def __init__(self) -> None:
        self.whole: list[bytes] = []
        self.streamed: list[int] = []

    def response(
        self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int
    ) -> ResponseVerdict | None:
        if exchange.header.api_key == FETCH_KEY:
            self.whole.append(bytes(frame))
        return None

    def response_streamed(self, client: ClientView, exchange: Exchange, frame_size: int, body_offset: int) -> None:
        self.streamed.append(frame_size)


async def broker_of(data: bytes) -> FakeBroker:
    # Pieces: the proxy sees the response arrive in parts, as from a real socket.
    fake = FakeBroker(handlers={HEARTBEAT_KEY: answer_heartbeat, FETCH_KEY: answer_fetch_in_session(data)},
                      piece_bytes=16_384)
    await fake.start()
    return fake


@pytest.fixture
async def large() -> AsyncIterator[FakeBroker]:
    fake = await broker_of(LARGE)
    yield fake
    await fake.stop()


@pytest.fixture
async def small() -> AsyncIterator[FakeBroker]:
    fake = await broker_of(SMALL)
    yield fake
    await fake.stop()


async def proxy_with(broker: FakeBroker, rate: float) -> tuple[ProxyServer, QuotaEngine, Seen]:
    engine = QuotaEngine(QuotaSettings(entries=(QuotaEntry(QuotaEntity(client_id="consumer"),
                                                           {"consumer_byte_rate": rate}),)))
    loop = asyncio.get_running_loop()
    enforcement = EnforcementPolicies(engine, EnforcementSection(), lambda: loop.time() * 1000.0, TopicDirectory())
    seen = Seen()
    proxy = await start_proxy(broker, HookChain([enforcement, seen]))
    return proxy, engine, seen


def recorded(engine: QuotaEngine) -> float:
    return sum(s.value for s in engine.snapshot() if s.quota_type == "consumer_byte_rate")


async def throttled_answer_then_heartbeat(broker: FakeBroker, rate: float) -> tuple[bytes, float, QuotaEngine, Seen]:
    """A fetch, then a heartbeat once its answer is in: the fetch's answer, the seconds from it
    to the heartbeat's, and what was recorded and seen."""
    proxy, engine, seen = await proxy_with(broker, rate)
    client = await RawClient.connect(proxy.directory.listeners[broker.node_id].port)
    client.send(fetch_request(1, SESSION_ID, INCREMENTAL_EPOCH))
    answer = await client.receive()
    answered_at = asyncio.get_running_loop().time()
    client.send(heartbeat_request(2))
    heartbeat = await client.receive()
    waited = asyncio.get_running_loop().time() - answered_at
    assert response_correlation_id(answer) == 1
    # The broker's dropped bytes did not leak: the next frame is the heartbeat's, whole.
    assert response_correlation_id(heartbeat) == 2
    client.close()
    await proxy.stop()
    return answer, waited, engine, seen


def assert_kafkas_empty_answer(answer: bytes) -> int:
    message = decode(answer)
    assert message.responses == []
    assert (message.error_code, message.session_id) == (0, SESSION_ID)
    assert message.throttle_time_ms > 0
    throttle_ms: int = message.throttle_time_ms
    return throttle_ms


async def test_a_throttled_streamed_fetch_is_answered_empty_and_muted(large: FakeBroker) -> None:
    # 600 kB on a fresh 11 x 1 s sensor counts over 10 s: 60 kB/s against 57 kB/s, a throttle
    # of about (60 - 57) / 57 x 10 s = 0.5 s.
    answer, waited, engine, seen = await throttled_answer_then_heartbeat(large, 57_000.0)
    throttle_ms = assert_kafkas_empty_answer(answer)
    assert 100 < throttle_ms < 2_000
    assert len(answer) < 100
    # KIP-219: nothing more is read from the client until the throttle has passed.
    assert waited >= throttle_ms / 1000.0 - 0.02
    assert recorded(engine) == 0  # unrecorded: the consumer got none of it
    # Observation hears that the client got the empty answer, not the 600 kB.
    assert seen.streamed == [len(answer)]


async def test_a_throttled_whole_fetch_is_answered_empty_and_muted(small: FakeBroker) -> None:
    # 30 kB over 10 s is 3 kB/s against 2.5 kB/s: a throttle of about 2 s.
    answer, waited, engine, seen = await throttled_answer_then_heartbeat(small, 2_500.0)
    assert len(SMALL) < CUT_THROUGH_MIN_BYTES
    throttle_ms = assert_kafkas_empty_answer(answer)
    assert waited >= throttle_ms / 1000.0 - 0.02
    assert recorded(engine) == 0
    assert seen.whole == [answer] and seen.streamed == []


async def test_a_fetch_within_the_quota_gets_its_data_and_stays_recorded(large: FakeBroker) -> None:
    proxy, engine, _ = await proxy_with(large, 10_000_000.0)
    client = await RawClient.connect(proxy.directory.listeners[large.node_id].port)
    client.send(fetch_request(1, SESSION_ID, INCREMENTAL_EPOCH))
    message = decode(await client.receive())
    assert message.responses[0].partitions[0].records == LARGE
    assert (message.throttle_time_ms, message.session_id) == (0, SESSION_ID)
    assert recorded(engine) > 0
    client.close()
    await proxy.stop()


async def test_a_response_pipelined_behind_a_dropped_stream_comes_whole_and_in_order(large: FakeBroker) -> None:
    # The heartbeat goes upstream before the throttle is known; its response follows the
    # broker's 600 kB, which the proxy reads and drops after sending the empty answer.
    proxy, _, _ = await proxy_with(large, 57_000.0)
    client = await RawClient.connect(proxy.directory.listeners[large.node_id].port)
    client.send(fetch_request(1, SESSION_ID, INCREMENTAL_EPOCH))
    client.send(heartbeat_request(2))
    assert_kafkas_empty_answer(await client.receive())
    heartbeat = await client.receive()
    assert response_correlation_id(heartbeat) == 2 and len(heartbeat) < 100
    client.close()
    await proxy.stop()
