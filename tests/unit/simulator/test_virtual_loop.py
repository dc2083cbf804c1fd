"""The simulator's footing: virtual time, in-order in-memory delivery, back-pressure, and the
same numbers for the same seed."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from kqpsim.scenario import Clients, Outcome, Scenario, forget_kafka_runs, simulate
from kqpsim.virtual_loop import Deadlock, Faults, Host, MemoryTransport, VirtualLoop, run


class _Collect(asyncio.Protocol):
    def __init__(self) -> None:
        self.received: list[tuple[float, bytes]] = []
        self.transport: asyncio.Transport | None = None
        self.paused = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received.append((asyncio.get_running_loop().time(), data))

    def pause_writing(self) -> None:
        self.paused += 1


def test_an_hour_of_virtual_time_passes_in_one_jump() -> None:
    async def sleep_an_hour() -> tuple[float, int]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualLoop)
        await asyncio.sleep(3600)
        return loop.time(), loop.jumps

    now, jumps = run(sleep_an_hour, seed=1)
    assert now == pytest.approx(3600.0)
    assert jumps == 1


def test_a_world_where_nothing_can_happen_is_a_deadlock_not_a_hang() -> None:
    async def wait_forever() -> None:
        await asyncio.Event().wait()

    with pytest.raises(Deadlock):
        run(wait_forever, seed=1)


def test_writes_arrive_after_the_latency_in_the_order_written_whatever_the_jitter() -> None:
    async def exchange() -> list[tuple[float, bytes]]:
        loop = asyncio.get_running_loop()
        server = _Collect()
        assert isinstance(loop, VirtualLoop)
        loop.network.listen(("broker", 1), lambda: server)
        client, _ = await loop.create_connection(asyncio.Protocol, "broker", 1)
        for i in range(200):
            client.write(bytes([i]))
        await asyncio.sleep(1)
        return server.received

    received = run(exchange, seed=3, faults=Faults(latency_s=0.01, jitter_s=0.05))
    assert [data for _at, data in received] == [bytes([i]) for i in range(200)]
    assert all(at >= 0.02 + 0.01 for at, _ in received)  # handshake round trip, then the latency


def test_a_reader_that_paused_pushes_back_on_the_writer() -> None:
    async def flood() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        server = _Collect()
        assert isinstance(loop, VirtualLoop)
        loop.network.listen(("broker", 1), lambda: server)
        writer = _Collect()
        client, _ = await loop.create_connection(lambda: writer, "broker", 1)
        assert server.transport is not None
        server.transport.pause_reading()
        for _ in range(100):
            client.write(b"x" * 10_000)
        await asyncio.sleep(1)
        return writer.paused, len(server.received)

    paused, received = run(flood, seed=1)
    assert (paused, received) == (1, 0)


def test_the_same_seed_gives_the_same_numbers_and_another_seed_moves_the_phase() -> None:
    scenario = Scenario(Clients(connections=3), measure_s=30)

    def afresh(seed: int) -> Outcome:
        forget_kafka_runs()  # Kafka's run too, not the one kept from the first
        return simulate(scenario, seed)

    first, again, other = (afresh(seed) for seed in (11, 11, 12))
    for a, b in ((first.kqp, again.kqp), (first.kafka, again.kafka)):
        assert [r.acks for r in a.records] == [r.acks for r in b.records]
    assert [r.acks for r in first.kqp.records] != [r.acks for r in other.kqp.records]


# Everything that orders events in the simulation: several connections, a fleet's exchange, an
# instance that stalls and one that dies (the proxy keeps its connections in a set, whose order
# is the objects' addresses, which differ from one process to the next).
_ORDERING_SCENARIO = ("connections=4,instances=3,count_other_instances=True,jitter_s=0.001,"
                      "instance_stalls_at_s=20,stall_s=2,instance_dies_at_s=30,warmup_s=15,measure_s=25")


def test_the_numbers_do_not_depend_on_the_process_its_hash_seed_or_the_host() -> None:
    # Another interpreter, another PYTHONHASHSEED (set and dict orders of strings change), other
    # addresses: the digest of every acknowledgement must not change.
    code = ("from kqpsim.scenario import parse_scenario, simulate;"
            f"print(simulate(parse_scenario({_ORDERING_SCENARIO!r}), 5).digest())")
    digests = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        digests.add(subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                                   text=True).stdout.strip())
    assert len(digests) == 1


def test_a_frozen_end_reads_nothing_until_it_thaws_even_if_reading() -> None:
    async def stall() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        server = _Collect()
        assert isinstance(loop, VirtualLoop)
        loop.network.listen(("broker", 1), lambda: server)
        client, _ = await loop.create_connection(asyncio.Protocol, "broker", 1)
        assert isinstance(server.transport, MemoryTransport)
        server.transport.freeze()
        client.write(b"during the stall")
        await asyncio.sleep(5)
        during = len(server.received)
        server.transport.thaw()
        await asyncio.sleep(0.001)
        return during, len(server.received)

    assert run(stall, seed=1) == (0, 1)


def test_a_host_handles_what_its_connections_read_one_chunk_at_a_time_across_all_of_them() -> None:
    async def two_clients() -> list[tuple[float, bytes]]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualLoop)
        server = _Collect()
        loop.network.run_on(Host(accepted_read_s=0.01, opened_read_s=0.0),
                            [loop.network.listen(("proxy", 1), lambda: server)])
        first, _ = await loop.create_connection(asyncio.Protocol, "proxy", 1)
        second, _ = await loop.create_connection(asyncio.Protocol, "proxy", 1)
        for i in range(3):
            first.write(b"a%d" % i)
            second.write(b"b%d" % i)
        await asyncio.sleep(1)
        return server.received

    received = run(two_clients, seed=1, faults=Faults(latency_s=0.001))
    # The first of each connection is read as it arrives (at 0.005: two handshakes, then the
    # latency), and the host handles one chunk every 10 ms from then; each connection's next
    # read comes once its last is handled, and takes all that arrived meanwhile.
    assert [data for _at, data in received] == [b"a0", b"b0", b"a1", b"a2", b"b1", b"b2"]
    assert [round(at - received[0][0], 6) for at, _ in received] == [0.0, 0.01, 0.02, 0.03, 0.04, 0.05]
    assert received[0][0] == pytest.approx(0.005 + 0.01)


class _Relay(asyncio.Protocol):
    """A host's protocol: on each accepted connection it opens one to "broker" and relays to it."""

    opened: list[MemoryTransport] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        asyncio.get_running_loop().create_task(self._open())

    async def _open(self) -> None:
        upstream, _ = await asyncio.get_running_loop().create_connection(asyncio.Protocol, "broker", 1)
        assert isinstance(upstream, MemoryTransport)
        _Relay.opened.append(upstream)


def test_the_connections_a_host_opens_are_its_own_and_its_clients_are_not() -> None:
    host = Host(accepted_read_s=0.0, opened_read_s=0.002)

    async def connect() -> tuple[MemoryTransport, MemoryTransport]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualLoop)
        broker = _Collect()
        loop.network.listen(("broker", 1), lambda: broker)
        loop.network.run_on(host, [loop.network.listen(("proxy", 1), _Relay)])
        client, _ = await loop.create_connection(asyncio.Protocol, "proxy", 1)
        await asyncio.sleep(0.1)
        # A client opening another connection from a callback the host's writes led to is
        # still the client: the network hands each end its own process.
        assert broker.transport is not None
        broker.transport.write(b"answer")
        await asyncio.sleep(0.1)
        assert isinstance(client, MemoryTransport)
        return client, _Relay.opened[-1]

    client, upstream = run(connect, seed=1)
    assert (upstream.host, client.host) == (host, None)
