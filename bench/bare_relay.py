"""The floor of any Python hop: a TCP relay on uvloop that parses nothing.

    python bench/bare_relay.py LISTEN_PORT:TARGET_PORT [...]

Each pair relays 127.0.0.1:LISTEN_PORT to 127.0.0.1:TARGET_PORT, bytes as they come, with
flow control both ways (a side that cannot keep up pauses reading from the other). It is
what kqp would cost if it did nothing but move bytes; bench/proxy_throughput.py runs it
against a broker listener that advertises the relay's port, so clients stay on the relay.
"""

from __future__ import annotations

import asyncio
import functools
import sys

import uvloop


class _Side(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.early: list[bytes] = []  # client bytes that arrive before the upstream is connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.early.append(data)
        else:
            peer.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    # Our outgoing buffer is full: stop reading from the side that feeds it.
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _ClientSide(_Side):
    def __init__(self, target_port: int) -> None:
        super().__init__()
        self.target_port = target_port

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        upstream = _Side()
        upstream.peer, self.peer = self, upstream
        try:
            await asyncio.get_running_loop().create_connection(lambda: upstream, "127.0.0.1", self.target_port)
        except OSError:
            assert self.transport is not None
            self.transport.close()
            return
        assert upstream.transport is not None
        for data in self.early:
            upstream.transport.write(data)
        self.early.clear()


async def _serve(pairs: list[tuple[int, int]]) -> None:
    loop = asyncio.get_running_loop()
    for listen_port, target_port in pairs:
        await loop.create_server(functools.partial(_ClientSide, target_port), "127.0.0.1", listen_port)
    print("relaying " + " ".join(f"{a}->{b}" for a, b in pairs), flush=True)
    await asyncio.Event().wait()


def main(argv: list[str]) -> int:
    pairs = [(int(a), int(b)) for a, b in (arg.split(":") for arg in argv)]
    uvloop.run(_serve(pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
