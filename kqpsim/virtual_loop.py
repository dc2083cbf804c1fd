"""A virtual-time asyncio event loop and in-memory transports, for the deterministic simulator.

`VirtualLoop` is asyncio's own `BaseEventLoop` (the same ready queue, timers and task
machinery the proxy runs on) with two things replaced: its clock is a number that only moves
when the loop would otherwise wait, straight to the next timer, and its "network" is an
in-memory `Network` of listeners, so `create_server(sock=...)` and `create_connection(host,
port)` join protocols through `MemoryTransport` pairs instead of sockets. Nothing reads the
wall clock and nothing depends on the host's speed or load: a seed gives the same numbers
on any machine.

Timing faults are inputs (`Faults`): a one-way network latency with seeded jitter (FIFO per
direction, as TCP keeps order) and, for a busy host, a seeded delay added to each wait of the
loop (timers fire late, as on a loaded machine).

A callback takes no virtual time: the clock moves only while the loop waits. A process that
does take time to handle what it reads (the proxy: one event loop, one frame at a time) is a
`Host`: its listeners' connections and the connections it opens hand each chunk they read to
its protocol only once the host has handled it, one chunk at a time across all of them.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import selectors
import socket
from asyncio import events
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from heapq import heapify, heappop, heappush
from typing import Any


class Deadlock(RuntimeError):
    """Nothing is ready and no timer is set: the simulated world waits forever."""


@dataclass(frozen=True, slots=True)
class Faults:
    """Timing faults, all in seconds; zero is a perfect world."""

    latency_s: float = 0.0005  # one-way, each direction of each link
    jitter_s: float = 0.0  # up to this much more per delivery, uniform
    loop_delay_s: float = 0.0  # busy host: up to this much added to each wait of the loop
    loop_delay_chance: float = 0.0  # ... on this fraction of the waits


@dataclass(slots=True)
class Host:
    """A process whose handling of what it reads takes virtual time: one thing at a time, as one
    event loop handles one callback at a time. Each chunk one of its connections reads (a write
    of the peer: one Kafka frame, as the modelled clients and broker write them) costs
    `accepted_read_s` on a connection to one of its listeners (for the proxy: a client's
    request) and `opened_read_s` on a connection it opened (the broker's response). A chunk's
    handling starts when it is readable and the host has finished the chunks before it, on any of
    its connections; the protocol gets it (and what it writes in answer leaves) when its handling
    ends. Nothing else the process does (its timers, its writes) costs time here."""

    accepted_read_s: float
    opened_read_s: float
    busy_until: float = 0.0  # when the host has handled every chunk it has read so far

    def handle(self, now: float, cost_s: float) -> float:
        """When a chunk readable at `now` that costs `cost_s` has been handled."""
        self.busy_until = max(now, self.busy_until) + cost_s
        return self.busy_until


# The host whose code is running (None: a modelled client or broker, whose handling is modelled
# by its own timers). asyncio runs each callback and task in the context it was created in, so
# what a host's protocol starts (the proxy's upstream connection, opened from the task its
# accepted connection starts) runs as that host; each end of a connection sets its own host when
# the network hands it something, so a delivery does not run as its writer.
_RUNNING_HOST: contextvars.ContextVar[Host | None] = contextvars.ContextVar("kqpsim_running_host", default=None)


def _run_as(host: Host | None) -> None:
    """The callback running now runs as `host`'s code (and what it starts, too)."""
    if _RUNNING_HOST.get() is not host:  # most runs have no host: nothing to set
        _RUNNING_HOST.set(host)


class _VirtualSelector(selectors.BaseSelector):
    """The selector a `SelectorEventLoop` is given (its public `selector=` argument): "waiting"
    `timeout` moves the virtual clock by it, and nothing is ever ready. What the loop registers
    (its self-pipe, which only threads write to) is kept and never reported."""

    def __init__(self) -> None:
        self.loop: VirtualLoop | None = None
        self._keys: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, fileobj if isinstance(fileobj, int) else fileobj.fileno(), events, data)
        self._keys[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj)

    def get_map(self) -> dict[Any, selectors.SelectorKey]:
        return self._keys

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        # What asyncio's own turn of the loop would call; VirtualLoop._run_once jumps the clock
        # itself, the same way, and does not call it.
        loop = self.loop
        assert loop is not None
        if timeout is None:
            raise Deadlock(f"nothing ready and no timer set at t={loop.time():.6f}")
        if timeout > 0:
            loop.advance(timeout + loop.busy_delay())
        return []


# BaseEventLoop's constants for its timer heap (asyncio/base_events.py, 3.11-3.13).
_MAX_WAIT_S = 24 * 3600.0
_MIN_SCHEDULED_TIMER_HANDLES = 100
_MIN_CANCELLED_TIMER_HANDLES_FRACTION = 0.5


class VirtualLoop(asyncio.SelectorEventLoop):
    """asyncio's loop on virtual time and an in-memory network (see the module docstring):
    `SelectorEventLoop` as asyncio ships it, given a selector that does not wait, with `time`
    and the two connection calls answered here.

    One turn of the loop (`_run_once`) and the timer heap (`call_at`) are also the loop's own,
    for speed alone: a simulated run is a million turns of about one callback each, and
    asyncio's heap of `TimerHandle`s compares them with a Python `__lt__` (7.5 million calls for
    one seed of each row). A turn here costs a fifth less CPU (a bench of 200,000 timers and
    67,000 ready callbacks: 1.62 s against asyncio's 2.00 s). Here the heap holds `(when,
    handle)` pairs, which compare as floats in C; on equal times the pair falls back to the
    handles' own `==` and `<`, so every comparison gives what comparing the handles gives, the
    heap keeps the same shape, and the timers fire in exactly asyncio's order (`python -m kqpsim
    digests` is unchanged by it). The turn is asyncio's, step for step: cancelled timers dropped
    as it drops them, the wait (the selector's `select`: the clock jumps) only when nothing is
    ready, every timer due within the clock's resolution made ready, then the ready callbacks
    that were there run. Debug mode's slow-callback warnings, which read the wall clock, are not
    kept."""

    def __init__(self, seed: int, faults: Faults | None = None) -> None:
        self._now = 0.0
        self.jumps = 0  # how many times the clock moved (each a wait the loop did not do)
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self.faults = faults or Faults()
        # One generator per concern, so adding draws to one does not move the others.
        self.net_random = random.Random(f"net-{seed}")
        self.loop_random = random.Random(f"loop-{seed}")
        self.client_random = random.Random(f"clients-{seed}")
        self.broker_random = random.Random(f"broker-{seed}")  # the modelled broker's handling times
        self.network = Network(self)

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self.jumps += 1

    def call_at(  # type: ignore[override]
        self, when: float, callback: Callable[..., object], *args: Any, context: Any = None,
    ) -> asyncio.TimerHandle:
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        timer = events.TimerHandle(when, callback, args, self, context)
        heappush(self._scheduled, (when, timer))
        timer._scheduled = True  # type: ignore[attr-defined]
        return timer

    def _run_once(self) -> None:
        scheduled: list[tuple[float, asyncio.TimerHandle]] = self._scheduled  # type: ignore[has-type]
        count = len(scheduled)
        if count > _MIN_SCHEDULED_TIMER_HANDLES and \
                self._timer_cancelled_count / count > _MIN_CANCELLED_TIMER_HANDLES_FRACTION:  # type: ignore[has-type]
            kept = []
            for entry in scheduled:
                if entry[1]._cancelled:
                    entry[1]._scheduled = False  # type: ignore[attr-defined]
                else:
                    kept.append(entry)
            heapify(kept)
            self._scheduled = scheduled = kept
            self._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0][1]._cancelled:
                self._timer_cancelled_count -= 1
                heappop(scheduled)[1]._scheduled = False  # type: ignore[attr-defined]
        ready: deque[events.Handle] = self._ready  # type: ignore[attr-defined]
        if not ready and not self._stopping:  # type: ignore[attr-defined]
            # The selector's wait: the clock jumps to the next timer.
            if not scheduled:
                raise Deadlock(f"nothing ready and no timer set at t={self._now:.6f}")
            timeout = min(max(0, scheduled[0][0] - self._now), _MAX_WAIT_S)
            if timeout > 0:
                self.advance(timeout + self.busy_delay())
        end_time = self._now + self._clock_resolution  # type: ignore[attr-defined]
        while scheduled:
            when, timer = scheduled[0]
            if when >= end_time:
                break
            heappop(scheduled)
            timer._scheduled = False  # type: ignore[attr-defined]
            ready.append(timer)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()

    def busy_delay(self) -> float:
        f = self.faults
        if f.loop_delay_s <= 0 or self.loop_random.random() >= f.loop_delay_chance:
            return 0.0
        return self.loop_random.uniform(0.0, f.loop_delay_s)

    # ---- the in-memory network ---------------------------------------------------------

    async def create_server(  # type: ignore[override]
        self, protocol_factory: Callable[[], asyncio.BaseProtocol], host: Any = None, port: Any = None, *,
        sock: socket.socket | None = None, **_: Any,
    ) -> MemoryServer:
        if sock is not None:
            host, port = sock.getsockname()[:2]
        return self.network.listen((str(host), int(port)), protocol_factory, sock)

    async def create_connection(  # type: ignore[override]
        self, protocol_factory: Callable[[], asyncio.BaseProtocol], host: str | None = None,
        port: int | None = None, **_: Any,
    ) -> tuple[MemoryTransport, asyncio.BaseProtocol]:
        opener = _RUNNING_HOST.get()
        await asyncio.sleep(self.faults.latency_s * 2)  # the TCP handshake's round trip
        return self.network.connect((str(host), int(port or 0)), protocol_factory, opener=opener)


class MemoryServer:
    """What `create_server` returns: enough of asyncio.Server for the proxy's use of it."""

    def __init__(self, network: Network, address: tuple[str, int], sock: socket.socket | None) -> None:
        self._network = network
        self.address = address
        self._sock = sock
        self.sockets = [sock] if sock is not None else []

    def close(self) -> None:
        self._network.listeners.pop(self.address, None)
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def wait_closed(self) -> None:
        return

    def is_serving(self) -> bool:
        return self.address in self._network.listeners


class Network:
    """Listeners by (host, port); each connection is a pair of `MemoryTransport`s."""

    def __init__(self, loop: VirtualLoop) -> None:
        self.loop = loop
        self.listeners: dict[tuple[str, int], Callable[[], asyncio.BaseProtocol]] = {}
        # Every server opened on this network, in order: what a dying process closes.
        self.servers: list[MemoryServer] = []
        # The host behind a listener (`run_on`): its accepted connections cost it time to read.
        self.hosts: dict[tuple[str, int], Host] = {}
        self._next_client_port = 40000

    def run_on(self, host: Host, servers: list[MemoryServer]) -> None:
        """These listeners are `host`'s: what their connections read, and what the connections
        their protocols open read, takes that host's time (`Host`)."""
        for server in servers:
            self.hosts[server.address] = host

    def listen(self, address: tuple[str, int], protocol_factory: Callable[[], asyncio.BaseProtocol],
               sock: socket.socket | None = None) -> MemoryServer:
        if address in self.listeners:
            raise OSError(f"{address} is already listening")
        self.listeners[address] = protocol_factory
        server = MemoryServer(self, address, sock)
        self.servers.append(server)
        return server

    def connect(self, address: tuple[str, int], protocol_factory: Callable[[], asyncio.BaseProtocol],
                client_ip: str = "10.0.0.1", opener: Host | None = None,
                ) -> tuple[MemoryTransport, asyncio.BaseProtocol]:
        """A connection to `address`, opened by `opener` (None: not a host's code)."""
        accept = self.listeners.get(address)
        if accept is None:
            raise ConnectionRefusedError(f"nothing listens on {address[0]}:{address[1]}")
        self._next_client_port += 1
        client_address = (client_ip, self._next_client_port)
        client = MemoryTransport(self.loop, sockname=client_address, peername=address)
        server = MemoryTransport(self.loop, sockname=address, peername=client_address)
        client.peer, server.peer = server, client
        host = self.hosts.get(address)
        if host is not None:
            server.run_on(host, host.accepted_read_s)
        if opener is not None:
            client.run_on(opener, opener.opened_read_s)
        server_protocol = accept()
        client_protocol = protocol_factory()
        server.set_protocol(server_protocol)
        client.set_protocol(client_protocol)
        # Each side's protocol learns of the connection as its own process (what it starts runs so).
        running = _RUNNING_HOST.set(host)
        try:
            server_protocol.connection_made(server)
        finally:
            _RUNNING_HOST.reset(running)
        running = _RUNNING_HOST.set(opener)
        try:
            client_protocol.connection_made(client)
        finally:
            _RUNNING_HOST.reset(running)
        return client, client_protocol


# Bytes a direction holds in the kernel (both ends' socket buffers) before its writer's
# transport starts to buffer: what a muted reader lets a writer send before TCP pushes back.
SOCKET_BUFFERS_BYTES = 256 * 1024


# What one read of a socket takes at most (asyncio's selector transports and uvloop read 256 KiB).
READ_BYTES = 256 * 1024


# What separates two deliveries due at once on one direction of a link.
_ORDERING_S = 1e-7


class MemoryTransport(asyncio.Transport):
    """One end of an in-memory connection. `write` delivers to the peer's protocol after the
    link's latency (and jitter), in order; a peer that paused reading keeps what arrives
    until it resumes, and the writer's buffer then grows past its high-water mark and calls
    `pause_writing`, as a full TCP window does."""

    def __init__(self, loop: VirtualLoop, sockname: tuple[str, int], peername: tuple[str, int]) -> None:
        super().__init__()
        self._loop = loop
        self._extra = {"sockname": sockname, "peername": peername}
        self.peer: MemoryTransport | None = None
        self._protocol: asyncio.BaseProtocol | None = None
        self._reading = True
        self._closing = False
        self._lost = False
        self._inbox: deque[bytes] = deque()  # arrived, not yet given to the protocol (paused)
        self._in_transit = 0  # bytes written by this end and not yet read by the peer's protocol
        self._last_arrival = 0.0
        self._high = 64 * 1024
        self._low = 16 * 1024
        self._writing_paused = False
        self._frozen = False  # a stalled process: nothing it receives is read until it thaws
        # The process reading this end, if its reads take time (`run_on`), and what each costs.
        self.host: Host | None = None
        self._read_cost_s = 0.0
        self._handling = False  # a chunk read, its handling not yet over
        self.bytes_written = 0
        # (from, to) virtual times while this end did not read (a mute, back-pressure); the
        # last one open (to = None) while it is still paused. For the per-second trace.
        self.read_pauses: list[tuple[float, float | None]] = []

    # ---- asyncio.BaseTransport ----------------------------------------------------------

    def run_on(self, host: Host, read_cost_s: float) -> None:
        """This end is read by `host`'s process; each chunk it reads costs `read_cost_s` of it."""
        self.host = host
        self._read_cost_s = read_cost_s

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        peer = self.peer
        if peer is not None:
            # The peer learns of the close after what was written before it has arrived.
            self._loop.call_at(self._arrival_time(), peer._peer_closed)
        self._loop.call_soon(self._connection_lost)

    def abort(self) -> None:
        self.close()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    # ---- reading ---------------------------------------------------------------------------

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def pause_reading(self) -> None:
        if self._reading:
            self.read_pauses.append((self._loop.time(), None))
        self._reading = False

    def resume_reading(self) -> None:
        if not self._reading:
            self._reading = True
            self.read_pauses[-1] = (self.read_pauses[-1][0], self._loop.time())
            if self._inbox:
                self._loop.call_soon(self._drain_inbox)

    def _arrive(self, data: bytes) -> None:
        _run_as(self.host)  # this end's process reads it, not the writer's
        if self._lost:
            return
        self._inbox.append(data)
        if self._reading and not self._frozen:
            self._drain_inbox()

    def freeze(self) -> None:
        """The process owning this end stalls: what arrives waits, whatever it paused or not."""
        self._frozen = True

    def thaw(self) -> None:
        self._frozen = False
        if self._inbox and self._reading:
            self._loop.call_soon(self._drain_inbox)

    def _drain_inbox(self) -> None:
        _run_as(self.host)
        if self.host is not None and self._read_cost_s > 0:
            self._read_on_host(self.host)
            return
        while self._inbox and self._reading and not self._frozen and not self._lost:
            data = self._inbox.popleft()
            if self.peer is not None:
                self.peer._read_by_peer(len(data))
            protocol = self._protocol
            assert isinstance(protocol, asyncio.Protocol)
            protocol.data_received(data)

    def _read_on_host(self, host: Host) -> None:
        """One read of this end by its host: what has arrived, up to the loop's read size, as
        one recv takes it; the host handles its chunks one after another, each handed to the
        protocol as its handling ends. The next read of this end comes only after the last."""
        if self._handling or not self._inbox or not self._reading or self._frozen or self._lost:
            return
        chunks: list[bytes] = []
        read = 0
        while self._inbox and read < READ_BYTES:
            data = self._inbox.popleft()
            read += len(data)
            chunks.append(data)
        if self.peer is not None:
            self.peer._read_by_peer(read)  # out of the kernel's buffers: the writer may go on
        self._handling = True
        now = self._loop.time()
        for index, data in enumerate(chunks):
            self._loop.call_at(host.handle(now, self._read_cost_s), self._handled, host, data,
                               index == len(chunks) - 1)

    def _handled(self, host: Host, data: bytes, last: bool) -> None:
        _run_as(host)
        if self._lost:
            return
        protocol = self._protocol
        assert isinstance(protocol, asyncio.Protocol)
        protocol.data_received(data)
        if last:
            self._handling = False
            self._read_on_host(host)

    def _peer_closed(self) -> None:
        _run_as(self.host)
        if self._lost:
            return
        if self._inbox or self._handling:
            # What arrived before the close is read first, once reading resumes.
            self._loop.call_later(0.001, self._peer_closed)
            return
        protocol = self._protocol
        if isinstance(protocol, asyncio.Protocol) and not self._closing:
            protocol.eof_received()
        self.close()

    def _connection_lost(self) -> None:
        _run_as(self.host)
        if self._lost:
            return
        self._lost = True
        self._inbox.clear()
        if self._protocol is not None:
            self._protocol.connection_lost(None)

    # ---- writing ---------------------------------------------------------------------------

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = 64 * 1024 if high is None else high
        self._low = self._high // 4 if low is None else low

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def get_write_buffer_size(self) -> int:
        return max(0, self._in_transit - SOCKET_BUFFERS_BYTES)

    def _arrival_time(self) -> float:
        f = self._loop.faults
        delay = f.latency_s
        if f.jitter_s > 0:
            delay += self._loop.net_random.uniform(0.0, f.jitter_s)
        # FIFO per direction: nothing overtakes what was written before it. Strictly later,
        # since asyncio's timer heap does not keep the order of timers due at the same time.
        self._last_arrival = max(self._last_arrival + _ORDERING_S, self._loop.time() + delay)
        return self._last_arrival

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self.peer is None or not data:
            return
        chunk = bytes(data)  # no copy of bytes; a caller may reuse a bytearray or a view's buffer
        size = len(chunk)
        self._in_transit += size
        self.bytes_written += size
        self._loop.call_at(self._arrival_time(), self.peer._arrive, chunk)
        if not self._writing_paused and self._in_transit - SOCKET_BUFFERS_BYTES > self._high:
            self._writing_paused = True
            protocol = self._protocol
            if protocol is not None:
                protocol.pause_writing()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))  # one copy: join takes views and bytearrays as they are

    def _read_by_peer(self, nbytes: int) -> None:
        self._in_transit -= nbytes
        if self._writing_paused and self.get_write_buffer_size() <= self._low:
            self._writing_paused = False
            if self._protocol is not None and not self._lost:
                self._protocol.resume_writing()

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError


def run(coroutine_factory: Callable[[], Any], seed: int, faults: Faults | None = None) -> Any:
    """Run `coroutine_factory()` to completion on a new VirtualLoop; returns its result."""
    loop = VirtualLoop(seed, faults)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coroutine_factory())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
