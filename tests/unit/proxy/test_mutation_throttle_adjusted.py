"""A controller-mutation throttle charged when the request arrives shrinks by the time the
broker took to answer (AbstractControllerMutationQuota.throttleTime), so the client is held
until the instant the bucket is back at zero, not that long after the response."""

from __future__ import annotations

from kqp.protocol.apis import CREATE_TOPICS_KEY
from kqp.protocol.codec import decode_body
from kqp.protocol.headers import response_body_offset
from tests.unit.helpers.fake_broker import FakeBroker, RawClient
from tests.unit.helpers.mutations import answer_create_topics, create_topics, creator_enforcement
from tests.unit.helpers.proxy import start_proxy


async def test_a_permissive_mutation_throttle_is_reduced_by_the_broker_round_trip() -> None:
    broker = FakeBroker(handlers={CREATE_TOPICS_KEY: answer_create_topics}, delay_s=0.3)
    await broker.start()
    proxy = await start_proxy(broker, creator_enforcement())
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
