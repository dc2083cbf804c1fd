"""`scope: cluster`: a throttle on the one budget holds every connection of the client.

One broker would put the throttle in every response and mute the client's one channel; with
a budget shared across the cluster, the proxy mutes each of the client's connections.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from kqp.config.models import EnforcementSection
from kqp.protocol.apis import PRODUCE_KEY
from kqp.protocol.headers import response_correlation_id
from kqp.proxy.policies.chain import EnforcementPolicies
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import QuotaEngine
from kqp.quotas.settings import QuotaEntity, QuotaEntry, QuotaSettings, Scope
from tests.unit.helpers.fake_broker import FakeBroker, RawClient
from tests.unit.helpers.proxy import (
    HEARTBEAT_KEY,
    answer_heartbeat,
    heartbeat_request,
    produce_acks0_request,
    start_proxy,
)


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    fake = FakeBroker(handlers={HEARTBEAT_KEY: answer_heartbeat, PRODUCE_KEY: lambda header, body: None})
    await fake.start()
    yield fake
    await fake.stop()


async def muted_after_a_throttle_on_one_connection(broker: FakeBroker, scope: Scope) -> tuple[bool, bool]:
    # 1 B/s: the first acks=0 Produce (about 30 bytes over the padded 10 s window) is over it.
    settings = QuotaSettings(scope=scope, entries=(
        QuotaEntry(QuotaEntity(client_id="test"), {"producer_byte_rate": 1.0}),))
    loop = asyncio.get_running_loop()
    enforcement = EnforcementPolicies(QuotaEngine(settings), EnforcementSection(), lambda: loop.time() * 1000.0,
                                   TopicDirectory())
    proxy = await start_proxy(broker, enforcement)
    first, second = await RawClient.connect(proxy.bootstrap_port), await RawClient.connect(proxy.bootstrap_port)
    for client in (first, second):  # both connections are the same client ("test")
        client.send(heartbeat_request(1))
        assert response_correlation_id(await client.receive()) == 1
    broker.request_seen.clear()
    first.send(produce_acks0_request(2))
    # Forwarded means throttled: the proxy mutes in the same step that forwards the Produce.
    await asyncio.wait_for(broker.request_seen.wait(), 5)
    second.send(heartbeat_request(3))
    second_answered = True
    try:
        await second.receive(timeout=0.5)
    except TimeoutError:
        second_answered = False
    muted = sorted(c.muted for c in proxy.connections)
    first.close()
    second.close()
    await proxy.stop()
    assert muted[-1], "the connection that produced is muted in both scopes"
    return muted[0], second_answered


async def test_a_cluster_scoped_throttle_mutes_every_connection_of_the_client(broker: FakeBroker) -> None:
    other_muted, answered = await muted_after_a_throttle_on_one_connection(broker, "cluster")
    assert other_muted and not answered


async def test_a_broker_scoped_throttle_mutes_only_its_connection(broker: FakeBroker) -> None:
    other_muted, answered = await muted_after_a_throttle_on_one_connection(broker, "broker")
    assert not other_muted and answered
