"""A request a hook holds (a partition mutation waiting for the fleet's order) keeps its turn.

While it waits, the responses ahead of it still reach the client, nothing behind it is read
or forwarded, and once released the hooks decide it and the connection goes on in order.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kqp.protocol.headers import response_correlation_id
from kqp.proxy.hooks import ClientView, Exchange, RequestVerdict, TrafficHooks
from tests.unit.helpers.fake_broker import FakeBroker, RawClient
from tests.unit.helpers.proxy import HEARTBEAT_KEY, answer_heartbeat, heartbeat_request, start_proxy


class HoldSecond(TrafficHooks):
    """Holds the request with correlation id 2 until the test releases it."""

    def __init__(self) -> None:
        self.release: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.decided: list[int] = []

    def hold(self, client: ClientView, exchange: Exchange, frame: bytes) -> asyncio.Future[Any] | None:
        return self.release if exchange.header.correlation_id == 2 else None

    def request(self, client: ClientView, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        self.decided.append(exchange.header.correlation_id)
        return None


async def test_a_held_request_keeps_its_turn_and_holds_the_requests_behind_it() -> None:
    broker = FakeBroker(handlers={HEARTBEAT_KEY: answer_heartbeat})
    await broker.start()
    hooks = HoldSecond()
    proxy = await start_proxy(broker, hooks)
    client = await RawClient.connect(proxy.bootstrap_port)
    for correlation_id in (1, 2, 3):  # pipelined
        client.send(heartbeat_request(correlation_id))
    first = await client.receive()  # the response ahead of the held request is not held
    assert response_correlation_id(first) == 1
    with_client = [h.correlation_id for h in broker.received if h.client_id == "test"]
    assert with_client == [1]
    assert hooks.decided == [1]
    hooks.release.set_result(None)
    rest = [response_correlation_id(await client.receive()) for _ in range(2)]
    client.close()
    await proxy.stop()
    await broker.stop()
    assert rest == [2, 3]
    assert hooks.decided == [1, 2, 3]
    assert [h.correlation_id for h in broker.received if h.client_id == "test"] == [1, 2, 3]
