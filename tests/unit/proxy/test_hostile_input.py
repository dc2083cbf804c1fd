"""Hostile and broken peers at the connection level, against the scripted broker.

Each case closes only the offending connection, logs why, and counts it in
kqp_frames_rejected_total and kqp_connections_closed_total; a second client on the same proxy
keeps working throughout. Slow and non-reading clients are held to bounded memory and closed
by the proxy's timeouts, and KIP-612 connection-rate throttling holds then closes new
connections as a broker does. (test_connection_io.py covers the basic oversized-frame and
bad-header cases; these add the metric and the remaining shapes of bad input.)
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from kafka.protocol.consumer import HeartbeatResponse
from kafka.protocol.metadata import MetadataResponse

from kqp.protocol.headers import encode_response_header, response_correlation_id
from kqp.proxy.metrics import ProxyMetrics
from kqp.proxy.observation import ObservationHooks
from kqp.proxy.options import ProxyOptions
from kqp.proxy.server import ProxyServer
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import QuotaEngine
from kqp.quotas.settings import IpQuotaEntry, QuotaSettings
from tests.unit.helpers.fake_broker import FakeBroker, RawClient
from tests.unit.helpers.proxy import HEARTBEAT_KEY, heartbeat_request

BIG_RESPONSE_BYTES = 512 * 1024


@dataclass
class Proxied:
    proxy: ProxyServer
    metrics: ProxyMetrics

    def rejected(self, reason: str) -> float:
        return self.metrics.registry.get_sample_value("kqp_frames_rejected_total", {"reason": reason}) or 0.0

    def closed(self, reason: str) -> float:
        labels = {"listener": "bootstrap", "upstream_node": "bootstrap", "reason": reason}
        return self.metrics.registry.get_sample_value("kqp_connections_closed_total", labels) or 0.0

    async def client(self) -> RawClient:
        return await RawClient.connect(self.proxy.bootstrap_port)

    async def wait_connections(self, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.proxy.connections) != count:
            assert time.monotonic() < deadline, f"{len(self.proxy.connections)} connections, expected {count}"
            await asyncio.sleep(0.01)


def answer(header: object, body: bytes) -> bytes:
    return bytes(HeartbeatResponse[4](throttle_time_ms=0, error_code=0).encode())


@pytest.fixture
async def broker() -> AsyncIterator[FakeBroker]:
    fake = FakeBroker(handlers={HEARTBEAT_KEY: answer})
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def start(broker: FakeBroker) -> AsyncIterator[Callable[..., asyncio.Future[Proxied]]]:
    started: list[ProxyServer] = []

    async def start_proxy(accept_throttle: Callable[[str], int] | None = None, **overrides: object) -> Proxied:
        options = ProxyOptions(upstream_bootstrap=(("127.0.0.1", broker.port),), bootstrap_port=0,
                               node_ports={broker.node_id: 0}, **overrides)  # type: ignore[arg-type]
        metrics = ProxyMetrics()
        topics = TopicDirectory()
        observation = ObservationHooks(metrics, None, clock=asyncio.get_running_loop().time, topics=topics)
        proxy = ProxyServer(options, observation, topics=topics, accept_throttle=accept_throttle,
                            on_frame_rejected=metrics.frame_rejected)
        await proxy.start()
        started.append(proxy)
        return Proxied(proxy, metrics)

    yield start_proxy  # type: ignore[misc]
    for proxy in started:
        await proxy.stop(grace_s=1)


async def still_serves(client: RawClient, correlation_id: int) -> None:
    client.send(heartbeat_request(correlation_id))
    assert response_correlation_id(await client.receive()) == correlation_id


def response_shaped_frame() -> bytes:
    """What a broker sends for Metadata v12, correlation id 1: read as a request it claims Produce v1."""
    body = MetadataResponse[12](throttle_time_ms=0, brokers=[], cluster_id="c", controller_id=1, topics=[]).encode()
    return encode_response_header(3, 12, 1) + bytes(body)


TLS_CLIENT_HELLO_START = bytes.fromhex("16030100f5010000f10303")

FRAMING = "bad frame from client"  # the size prefix itself is unacceptable
REQUEST = "bad request from client"  # a whole frame arrived but is not a request we can forward

# (bytes the client sends, what the log says, the rejection metric's reason, the close reason)
HOSTILE_FRAMES = [
    pytest.param(b"GET / HTTP/1.1\r\nHost: kafka\r\n\r\n", "exceeds the limit", "oversized request", FRAMING,
                 id="http"),
    pytest.param(TLS_CLIENT_HELLO_START, "exceeds the limit", "oversized request", FRAMING,
                 id="tls-hello-on-plaintext"),
    pytest.param(b"\x00\x00\x00\x03abc" + struct.pack(">i", 14) + heartbeat_request(1)[:14],
                 "request header needs", "malformed request", REQUEST, id="garbage-before-a-frame"),
    # The rest of a frame that claims too few bytes is read as the next size prefix.
    pytest.param(struct.pack(">i", 10) + heartbeat_request(1), "exceeds the limit", "oversized request", FRAMING,
                 id="length-shorter-than-the-frame"),
    pytest.param(struct.pack(">i", 10) + heartbeat_request(1)[:10], "client id runs past", "malformed request",
                 REQUEST, id="header-longer-than-the-frame"),
    pytest.param(struct.pack(">i", -5), "negative frame size", "malformed request", FRAMING, id="negative-length"),
    # An API the proxy must decode (Metadata), in a version it cannot; other APIs are forwarded.
    pytest.param(struct.pack(">i", 10) + struct.pack(">hhih", 3, 400, 1, -1), "API 3 v400 is outside",
                 "unsupported request", REQUEST, id="impossible-api-version"),
    pytest.param(struct.pack(">i", len(response_shaped_frame())) + response_shaped_frame(),
                 "API 0 v1 is outside the versions the proxy decodes", "unsupported request", REQUEST,
                 id="client-sends-a-response"),
]


@pytest.mark.parametrize(("payload", "logged", "reason", "close_reason"), HOSTILE_FRAMES)
async def test_bad_input_closes_only_its_connection(
    start: Callable[..., asyncio.Future[Proxied]], caplog: pytest.LogCaptureFixture,
    payload: bytes, logged: str, reason: str, close_reason: str,
) -> None:
    proxied = await start(max_frame_bytes=1024 * 1024)
    good = await proxied.client()
    await still_serves(good, 1)
    bad = await proxied.client()
    with caplog.at_level(logging.WARNING):
        bad.writer.write(payload)
        assert await bad.closed_by_peer()
    assert logged in caplog.text
    assert proxied.rejected(reason) == 1
    assert proxied.closed(close_reason) == 1
    await still_serves(good, 2)
    # The proxy still accepts and serves new connections.
    await still_serves(await proxied.client(), 3)


async def test_truncated_frame_then_eof(start: Callable[..., asyncio.Future[Proxied]],
                                        caplog: pytest.LogCaptureFixture) -> None:
    proxied = await start()
    good = await proxied.client()
    bad = await proxied.client()
    await proxied.wait_connections(2)
    frame = heartbeat_request(1)
    with caplog.at_level(logging.WARNING):
        bad.writer.write(struct.pack(">i", len(frame)) + frame[:9])
        await bad.writer.drain()
        bad.writer.write_eof()
        await proxied.wait_connections(1)
    assert "truncated frame from client (client went away 9 bytes into a frame)" in caplog.text
    assert proxied.rejected("truncated request") == 1
    assert proxied.closed("truncated frame from client") == 1
    await still_serves(good, 2)


async def test_frame_longer_than_sent_times_out(start: Callable[..., asyncio.Future[Proxied]],
                                                caplog: pytest.LogCaptureFixture) -> None:
    """A frame that claims more bytes than the client sends is a stalled frame: the read timeout ends it."""
    proxied = await start(frame_read_timeout_seconds=0.3)
    good = await proxied.client()
    bad = await proxied.client()
    frame = heartbeat_request(1)
    with caplog.at_level(logging.WARNING):
        bad.writer.write(struct.pack(">i", len(frame) + 50) + frame)
        assert await bad.closed_by_peer(timeout=5)
    assert "request frame not received whole in time (within 0.3 s)" in caplog.text
    await still_serves(good, 2)


async def test_slowloris_is_closed_by_the_frame_read_timeout(
    start: Callable[..., asyncio.Future[Proxied]], broker: FakeBroker
) -> None:
    proxied = await start(frame_read_timeout_seconds=0.5, idle_timeout_seconds=30.0)
    good = await proxied.client()
    slow = await proxied.client()
    frame = struct.pack(">i", 1000) + bytes(1000)
    started = asyncio.get_running_loop().time()
    sent = 0
    # One byte every 20 ms would take 20 s; the proxy must hang up long before.
    while not slow.reader.at_eof() and sent < len(frame):
        slow.writer.write(frame[sent : sent + 1])
        sent += 1
        try:
            await asyncio.wait_for(slow.reader.read(1), 0.02)
        except TimeoutError:
            continue
    elapsed = asyncio.get_running_loop().time() - started
    assert slow.reader.at_eof()
    assert 0.5 <= elapsed < 3.0, elapsed
    assert sent < len(frame)
    assert proxied.closed("request frame not received whole in time") == 1
    assert all(h.client_id != "slow" for h in broker.received)
    await still_serves(good, 1)


async def test_client_that_never_reads_is_bounded_then_closed(
    start: Callable[..., asyncio.Future[Proxied]], broker: FakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    broker.handlers[HEARTBEAT_KEY] = lambda header, body: bytes(BIG_RESPONSE_BYTES)
    high = 256 * 1024
    proxied = await start(write_buffer_high_bytes=high, idle_timeout_seconds=1.0)
    sink = await proxied.client()
    # 200 pipelined requests ask for 100 MiB of responses that the client never reads.
    for correlation_id in range(200):
        sink.send(heartbeat_request(correlation_id))
    await sink.writer.drain()
    await proxied.wait_connections(1)
    (connection,) = proxied.proxy.connections
    deadline = time.monotonic() + 10
    while not connection.client_not_reading:
        assert time.monotonic() < deadline, "the proxy never paused reading from the broker"
        await asyncio.sleep(0.01)
    # Whatever the broker still has to send stays in the broker and the kernel, not the proxy.
    peak = 0
    with caplog.at_level(logging.WARNING):
        while not connection.closed:
            client = connection.client
            if client is not None and not client.is_closing():
                peak = max(peak, client.get_write_buffer_size())
            assert time.monotonic() < deadline, "the connection was never closed"
            await asyncio.sleep(0.02)
    assert 0 < peak <= high + BIG_RESPONSE_BYTES + 4
    assert connection.in_flight > 0  # responses were still owed: in-flight work does not keep it open
    assert "not reading its responses (for more than 1 s)" in caplog.text


async def test_broker_answering_out_of_order_is_counted(
    start: Callable[..., asyncio.Future[Proxied]], broker: FakeBroker
) -> None:
    proxied = await start()
    broker.reverse_pairs = True
    bad = await proxied.client()
    bad.send(heartbeat_request(1))
    bad.send(heartbeat_request(2))
    assert await bad.closed_by_peer()
    assert proxied.rejected("out-of-order response") == 1
    assert proxied.closed("bad response from broker") == 1
    broker.reverse_pairs = False
    await still_serves(await proxied.client(), 3)


async def test_connection_rate_throttle_holds_then_closes(
    start: Callable[..., asyncio.Future[Proxied]], broker: FakeBroker
) -> None:
    asked: list[str] = []

    def throttle(ip: str) -> int:
        asked.append(ip)
        return 400 if len(asked) == 2 else 0

    proxied = await start(accept_throttle=throttle)
    first = await proxied.client()
    await still_serves(first, 1)
    held = await proxied.client()
    loop = asyncio.get_running_loop()
    opened = loop.time()
    held.writer.write(struct.pack(">i", 4) + b"\x00\x12")  # garbage, never read, so never judged
    held.send(heartbeat_request(2))
    assert await closed_unread(held)
    assert loop.time() - opened >= 0.39
    assert [h.correlation_id for h in broker.received if h.client_id == "test"] == [1]
    assert proxied.rejected("malformed request") == 0  # never read, so never judged
    assert proxied.closed("connection_creation_rate quota exceeded") == 1
    assert asked == ["127.0.0.1", "127.0.0.1"]
    await still_serves(await proxied.client(), 3)


async def closed_unread(client: RawClient) -> bool:
    """Closed by the proxy; a socket closed with unread input is reset rather than shut down."""
    try:
        return await client.closed_by_peer(timeout=5)
    except ConnectionResetError:
        return True


async def test_connection_rate_quota_from_the_engine(
    start: Callable[..., asyncio.Future[Proxied]], broker: FakeBroker
) -> None:
    engine = QuotaEngine(QuotaSettings(ip_entries=(IpQuotaEntry("127.0.0.1", 1.0),)))
    proxied = await start(accept_throttle=lambda ip: engine.connection_created(ip, time.monotonic() * 1000))
    clients = [await proxied.client() for _ in range(15)]
    for correlation_id, client in enumerate(clients):
        client.send(heartbeat_request(correlation_id))
    answered = 0
    for client in clients:
        try:
            await client.receive(timeout=2)
            answered += 1
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass  # held unanswered, then closed
    # 1 connection/s measured over at least 10 s of windows admits about ten at once, not fifteen.
    assert 5 <= answered < 15
    forwarded = sorted(h.correlation_id for h in broker.received if h.client_id == "test")
    assert len(forwarded) == answered
    for client in clients:
        client.close()
