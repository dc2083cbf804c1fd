"""A controller-mutation throttle charged when the request arrives shrinks by the time the
broker took to answer (AbstractControllerMutationQuota.throttleTime), so the client is held
until the instant the bucket is back at zero, not that long after the response."""

from __future__ import annotations

import asyncio

from kqp.protocol.apis import CREATE_TOPICS_KEY
from kqp.protocol.codec import decode_body
from kqp.protocol.headers import response_body_offset
from kqp.proxy.enforcement import EnforcementSettings, QuotaEnforcement
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import QuotaEngine
from kqp.quotas.settings import QuotaEntity, QuotaEntry, QuotaSettings
from tests.unit.proxy.fake_broker import FakeBroker, RawClient
from tests.unit.proxy.test_connection_io import start_proxy
from tests.unit.proxy.test_local_answer_throttle import answer_create_topics, create_topics


async def test_a_permissive_mutation_throttle_is_reduced_by_the_broker_round_trip() -> None:
    broker = FakeBroker(handlers={CREATE_TOPICS_KEY: answer_create_topics}, delay_s=0.3)
    await broker.start()
    loop = asyncio.get_running_loop()
    # 1000 partitions/s over 11 one-second windows: a bucket of 11000 partitions.
    settings = QuotaSettings(entries=(
        QuotaEntry(QuotaEntity(client_id="creator"), {"controller_mutation_rate": 1000.0}),))
    enforcement = QuotaEnforcement(QuotaEngine(settings), EnforcementSettings(), lambda: loop.time() * 1000.0,
                                   TopicDirectory())
    proxy = await start_proxy(broker, enforcement)
    client = await RawClient.connect(proxy.bootstrap_port)
    # CreateTopics v5 is permissive: 12000 partitions leave the bucket 1000 short, a 1000 ms
    # throttle when charged; the broker answers 300 ms later, so about 700 ms remain.
    client.send(create_topics(1, 12_000, version=5))
    response = await client.receive()
    client.close()
    await proxy.stop()
    await broker.stop()
    offset = response_body_offset(response, CREATE_TOPICS_KEY, 5)
    throttle = decode_body(CREATE_TOPICS_KEY, 5, response[offset:], is_request=False).throttle_time_ms
    assert 500 <= throttle <= 710
