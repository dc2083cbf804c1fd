"""A scripted stand-in for a broker, for unit tests of the proxy's IO layer only.

Integration tests use a real Kafka broker; this one exists to provoke what a real broker
will not do on demand (answer out of order, stall, send garbage).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from kafka.protocol.metadata import MetadataResponse

from kqp.protocol.apis import METADATA_KEY
from kqp.protocol.framing import FrameDecoder, frame
from kqp.protocol.headers import RequestHeader, encode_response_header, parse_request_header

# A handler gets the parsed header and the body; it returns the response body, or None to stay silent.
Handler = Callable[[RequestHeader, bytes], bytes | None]


@dataclass
class FakeBroker:
    node_id: int = 1
    handlers: dict[int, Handler] = field(default_factory=dict)
    received: list[RequestHeader] = field(default_factory=list)
    # When set, responses are held and released in reverse order in pairs (misbehaviour).
    reverse_pairs: bool = False
    # Seconds to wait before answering each request (a slow broker).
    delay_s: float = 0.0
    # When set, responses go out in pieces of this many bytes, each flushed on its own (the
    # proxy sees frames arrive in parts), and a response waits at `hold_at` bytes until
    # `release` is set.
    piece_bytes: int = 0
    hold_at: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)
    request_seen: asyncio.Event = field(default_factory=asyncio.Event)
    server: asyncio.Server | None = None
    port: int = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    def metadata_body(self, version: int) -> bytes:
        broker = MetadataResponse.MetadataResponseBroker(node_id=self.node_id, host="127.0.0.1", port=self.port,
                                                         rack=None)
        return bytes(MetadataResponse[version](throttle_time_ms=0, brokers=[broker], cluster_id="fake",
                                               controller_id=self.node_id, topics=[]).encode())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        held: list[bytes] = []
        try:
            while data := await reader.read(65536):
                for request in decoder.feed(data):
                    header = parse_request_header(request)
                    self.received.append(header)
                    if header.client_id != "kqp-discovery":
                        self.request_seen.set()
                    body = request[header.body_offset :]
                    if header.api_key == METADATA_KEY and METADATA_KEY not in self.handlers:
                        response_body: bytes | None = self.metadata_body(header.api_version)
                    else:
                        response_body = self.handlers[header.api_key](header, body)
                    if response_body is None:
                        continue
                    if self.delay_s:
                        await asyncio.sleep(self.delay_s)
                    response = frame(encode_response_header(header.api_key, header.api_version,
                                                            header.correlation_id) + response_body)
                    if self.reverse_pairs:
                        held.append(response)
                        if len(held) == 2:
                            writer.write(held[1] + held[0])
                            held.clear()
                    elif self.piece_bytes:
                        await self._write_in_pieces(writer, response)
                    else:
                        writer.write(response)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


    async def _write_in_pieces(self, writer: asyncio.StreamWriter, response: bytes) -> None:
        for start in range(0, len(response), self.piece_bytes):
            if self.hold_at and start <= self.hold_at < start + self.piece_bytes:
                writer.write(response[start : self.hold_at])
                await writer.drain()
                await self.release.wait()
                writer.write(response[self.hold_at : start + self.piece_bytes])
            else:
                writer.write(response[start : start + self.piece_bytes])
            await writer.drain()
            await asyncio.sleep(0)


class RawClient:
    """A minimal Kafka client speaking raw frames, to see exactly what the proxy sends back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    def send(self, payload: bytes) -> None:
        self.writer.write(frame(payload))

    async def receive_exactly(self, count: int, timeout: float = 5.0) -> bytes:
        return await asyncio.wait_for(self.reader.readexactly(count), timeout)

    async def receive(self, timeout: float = 5.0) -> bytes:
        size = struct.unpack(">i", await asyncio.wait_for(self.reader.readexactly(4), timeout))[0]
        return await asyncio.wait_for(self.reader.readexactly(size), timeout)

    async def closed_by_peer(self, timeout: float = 5.0) -> bool:
        data = await asyncio.wait_for(self.reader.read(), timeout)
        return data == b""

    def close(self) -> None:
        self.writer.close()
