"""A client that leaves with requests at the broker: their answers are still charged.

A broker records the request it is handling even when the client has gone (the produce
response callback records, then finds the channel closed), so those bytes count against the
client's quota. The proxy forwarded them and the broker handles them, so the proxy waits for
their answers, runs them through the hooks (which charge them) and drops them before it
closes the broker connection. Requests it had read but not forwarded are dropped, as a broker
drops the unread bytes of a closed socket. librdkafka disconnects after a request time-out,
which a throttled client meets often: uncharged, those bytes were admitted on top of the quota.
"""

from __future__ import annotations

import asyncio

from kqp.proxy.server import ProxyServer
from tests.unit.helpers.fake_broker import FakeBroker, RawClient
from tests.unit.helpers.proxy import HEARTBEAT_KEY, EventLog, answer_heartbeat, heartbeat_request, start_proxy


async def wait_until_closed(proxy: ProxyServer, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while proxy.connections:
        assert asyncio.get_running_loop().time() < deadline, "the connection did not close"
        await asyncio.sleep(0.02)


async def leave_with_requests_at_a_slow_broker(count: int, one_at_a_time: bool) -> tuple[EventLog, list[int]]:
    """A client pipelines `count` Heartbeats to a broker that takes 0.3 s each and leaves 0.1 s
    later; returns the hooks' events and the correlation ids the broker received, once closed."""
    broker = FakeBroker(handlers={HEARTBEAT_KEY: answer_heartbeat}, delay_s=0.3)
    await broker.start()
    hooks = EventLog(one_at_a_time)
    proxy = await start_proxy(broker, hooks)
    client = await RawClient.connect(proxy.bootstrap_port)
    for correlation_id in range(1, count + 1):
        client.send(heartbeat_request(correlation_id))
    await asyncio.sleep(0.1)
    client.close()
    await wait_until_closed(proxy)
    await proxy.stop()
    await broker.stop()
    return hooks, [header.correlation_id for header in broker.received if header.api_key == HEARTBEAT_KEY]


async def test_answers_to_a_departed_clients_forwarded_requests_reach_the_hooks() -> None:
    hooks, _ = await leave_with_requests_at_a_slow_broker(2, one_at_a_time=False)  # both with the broker
    assert hooks.events == ["request 1", "request 2", "response 1", "response 2"]


async def test_every_request_forwarded_for_a_departed_throttled_client_is_charged() -> None:
    # One at a time (a throttled client): request 1 is with the broker and the client is not
    # read meanwhile, so the proxy learns that it left only when it reads again, as a broker
    # learns it only once it unmutes the channel. Whatever it forwarded by then, the broker
    # handled, and every one of those answers reaches the hooks.
    hooks, forwarded = await leave_with_requests_at_a_slow_broker(3, one_at_a_time=True)
    assert forwarded[0] == 1
    assert [event for event in hooks.events if event.startswith("response")] == [
        f"response {correlation_id}" for correlation_id in forwarded
    ]


async def test_a_client_leaving_with_nothing_at_the_broker_closes_at_once() -> None:
    broker = FakeBroker(handlers={HEARTBEAT_KEY: answer_heartbeat})
    await broker.start()
    hooks = EventLog(one_at_a_time=False)
    proxy = await start_proxy(broker, hooks)
    client = await RawClient.connect(proxy.bootstrap_port)
    client.send(heartbeat_request(1))
    await client.receive()
    client.close()
    await wait_until_closed(proxy, timeout_s=1.0)
    await proxy.stop()
    await broker.stop()
