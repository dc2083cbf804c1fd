"""`--workers N`: the workers of one host share one budget through their supervisor's relay
(kqp.proxy.host_exchange), within a turn of the event loop, and order partition mutations
through it. Relay and workers run here on one loop over real Unix socket pairs."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable

import pytest

from kqp.protocol.api_keys import ApiKey
from kqp.proxy.host_exchange import (
    CLAIM,
    MAX_QUEUED_BYTES,
    USAGE,
    FrameError,
    FrameReader,
    HostExchange,
    HostLink,
    HostRelay,
    frame,
)
from kqp.quotas import QuotaEngine, QuotaType
from kqp.quotas.fleet import UsageDelta, UsageReport, encode_report
from kqp.quotas.recording import QuotaClient, RequestCharges
from tests.unit.helpers.quotas import D, settings_for

PRODUCE: QuotaType = "producer_byte_rate"
MUTATION: QuotaType = "controller_mutation_rate"
QUOTA = 100_000.0


def now_ms() -> float:
    return time.monotonic() * 1000.0


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        await asyncio.sleep(0.001)


class Host:
    """A supervisor's relay and its workers, each with its own engine, on this loop."""

    def __init__(self, quota_type: QuotaType = PRODUCE, limit: float = QUOTA) -> None:
        self.relay = HostRelay(claim_history_s=60.0)
        self.quota_type, self.limit = quota_type, limit
        self.workers: dict[int, HostExchange] = {}

    async def start_worker(self, index: int) -> HostExchange:
        sock = self.relay.socket_for(index)
        await self.relay.attach(index)
        engine = QuotaEngine(settings_for(self.quota_type, {(None, D): self.limit}, scope="cluster"))
        worker = HostExchange(HostLink(sock, f"h:w{index}", "h:w"), engine, now_ms)
        await worker.start()
        self.workers[index] = worker
        return worker

    async def stop(self) -> None:
        for worker in self.workers.values():
            await worker.stop()
        self.relay.close()


@pytest.fixture
async def host() -> AsyncIterator[Host]:
    h = Host()
    yield h
    await h.stop()


def test_frames_come_out_whole_however_the_stream_cuts_them() -> None:
    stream = frame(USAGE, b"first") + frame(CLAIM, b"") + frame(USAGE, b"x" * 1000)
    reader = FrameReader()
    got = [(kind, payload) for i in range(0, len(stream), 3) for kind, payload, _ in reader.feed(stream[i:i + 3])]
    assert got == [(USAGE, b"first"), (CLAIM, b""), (USAGE, b"x" * 1000)]
    with pytest.raises(FrameError):
        list(FrameReader().feed(b"Z\x00\x00\x00\x01x"))


async def test_a_workers_usage_is_in_the_others_sensors_within_milliseconds(host: Host) -> None:
    a, b, c = await host.start_worker(0), await host.start_worker(1), await host.start_worker(2)
    await until(lambda: all(w.workers == 3 for w in (a, b, c)), "every worker counts three")
    started = time.monotonic()
    for _ in range(10):  # ten requests in one turn of the loop: one frame
        a.engine.record_produce("1", "u", "c", 1000, now_ms())
    tags = {"user": "", "client-id": "c"}

    def measured(worker: HostExchange) -> float:
        return worker.engine.manager(PRODUCE).sensor_for_tags(None, tags, int(now_ms())).rate.total(int(now_ms()))

    await until(lambda: measured(b) == 10_000 and measured(c) == 10_000, "a's usage in b's and c's sensors")
    assert time.monotonic() - started < 0.5
    assert a.frames_sent == 1 and b.deltas_applied == c.deltas_applied == 1
    await asyncio.sleep(0.01)
    assert measured(a) == 10_000  # never sent back to its sender


async def test_one_budget_the_second_worker_throttles_on_the_first_ones_usage(host: Host) -> None:
    a, b = await host.start_worker(0), await host.start_worker(1)
    # Twelve windows' worth through worker a (more than a whole window holds)...
    a.engine.record_produce("1", "u", "c", int(QUOTA * 12), now_ms())
    await until(lambda: b.deltas_applied == 1, "a's usage at b")
    # ...and worker b throttles the same client, as one process would.
    assert b.engine.record_produce("1", "u", "c", 1000, now_ms()) > 0


async def test_concurrent_mutation_claims_get_one_controllers_verdicts_on_every_worker() -> None:
    host = Host(MUTATION, 5.0)  # 55 tokens
    try:
        a, b = await host.start_worker(0), await host.start_worker(1)
        topics = tuple((f"t{i}", 40) for i in range(7))
        charges = RequestCharges(ApiKey.CREATE_TOPICS, 7, mutations=topics)
        client = QuotaClient("1", "u", "c")
        first, second = a.claim(client, charges), b.claim(client, charges)
        assert first is not None and second is not None
        results = await asyncio.wait_for(asyncio.gather(first, second), 2.0)
        assert all(r is not None for r in results)
        accepted = [sum(40 for ok in r.outcome.mutation.accepted if ok) for r in results  # type: ignore[union-attr]
                    if r is not None]
        # One controller admits two topics of 40 from 55 tokens (55, then 15), whichever came first.
        assert sorted(accepted) == [0, 80]
        # A worker started afterwards gets the claims first and refuses the next topic too.
        c = await host.start_worker(2)
        third = c.claim(client, RequestCharges(ApiKey.CREATE_TOPICS, 7, mutations=(("late", 1),)))
        assert third is not None
        charge = await asyncio.wait_for(third, 2.0)
        assert charge is not None and charge.outcome.mutation is not None
        assert charge.outcome.mutation.accepted == [False]
    finally:
        await host.stop()


async def test_a_dead_worker_leaves_and_a_restarted_one_starts_fresh(host: Host) -> None:
    a, b = await host.start_worker(0), await host.start_worker(1)
    await until(lambda: a.workers == 2, "two workers")
    await b.stop()
    host.relay.detach(1)
    await until(lambda: a.workers == 1, "the dead worker left")
    again = await host.start_worker(1)
    await until(lambda: a.workers == 2 and again.workers == 2, "the restarted worker joined")
    a.engine.record_produce("1", "u", "c", 500, now_ms())
    await until(lambda: again.deltas_applied == 1, "usage reaches the restarted worker")


async def test_a_worker_that_does_not_read_costs_dropped_frames_never_a_blocked_relay(host: Host) -> None:
    a = await host.start_worker(0)
    sock = host.relay.socket_for(1)  # a worker that never reads its end
    await host.relay.attach(1)
    b = await host.start_worker(2)
    # 200 clients with long names: about 200 KB a frame, so that a few dozen frames outgrow what
    # the relay queues for one peer.
    report = _report([UsageDelta(PRODUCE, None, (("user", ""), ("client-id", f"{i}-" + "c" * 1000)), 1.0)
                      for i in range(200)])
    started = time.monotonic()
    for _ in range(2 * MAX_QUEUED_BYTES // len(report)):
        assert a._write(USAGE, report)  # the sender is never held up
        await asyncio.sleep(0)
    await until(lambda: host.relay.frames_dropped > 0, "frames for the stuck worker dropped")
    assert time.monotonic() - started < 5.0
    await until(lambda: b.deltas_applied == 200 * (2 * MAX_QUEUED_BYTES // len(report)),
                "the reading worker still gets every frame", timeout_s=10.0)
    sock.close()


def _report(usage: list[UsageDelta], instance: str = "h:w0") -> bytes:
    return encode_report(UsageReport(instance, 1, tuple(usage)))


def test_on_the_fleets_topic_a_siblings_usage_marks_it_alive_but_is_not_counted_twice() -> None:
    from kqp.proxy.fleet import FleetExchange, FleetOptions

    options = FleetOptions.model_validate({"bootstrap_servers": ("k:9092",), "instance_id": "h:w0"})
    engine = QuotaEngine(settings_for(PRODUCE, {(None, D): QUOTA}, scope="cluster"))
    link = HostLink(socket_pair_end(), "h:w0", "h:w")
    exchange = FleetExchange(options, engine, now_ms, lambda: 11_000.0, same_host=link.is_sibling)
    tags = (("user", ""), ("client-id", "c"))
    for instance in ("h:w1", "elsewhere:w1"):
        exchange._apply(_report([UsageDelta(PRODUCE, None, tags, 1000.0)], instance), "h:w0", now_ms())
    sensor = engine.manager(PRODUCE).sensor_for_tags(None, dict(tags), int(now_ms()))
    assert sensor.rate.total(int(now_ms())) == 1000.0  # the other host's only: the sibling's came by the relay
    assert exchange.view.instances(now_ms()) == 3
    link.sock.close()


def socket_pair_end() -> socket.socket:
    mine, theirs = socket.socketpair()
    theirs.close()
    return mine
