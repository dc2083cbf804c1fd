"""The modelled broker: answers Produce and Fetch after a latency, one request at a time per
connection as Kafka's SocketServer does (the channel is muted while a request is handled).

With a `QuotaEngine` it is also Kafka's reference: it records and throttles with kqp.quotas
as KafkaApis does (a Produce's request size when it is handled, a Fetch's response size, and
an empty Fetch response when throttled, the bytes unrecorded), sends ThrottleTimeMs in the
response, and then keeps the channel muted for the throttle (KIP-219), so "Kafka's figure" of
a scenario is the same clients in front of this broker instead of the proxy.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from kqp.protocol.apis import CREATE_TOPICS_KEY, FETCH_KEY, METADATA_KEY, PRODUCE_KEY
from kqp.protocol.framing import FrameDecoder, frame
from kqp.protocol.headers import RequestHeader, encode_response_header, parse_request_header
from kqp.protocol.mutations import THROTTLING_QUOTA_EXCEEDED
from kqp.quotas import QuotaEngine
from tests.unit.helpers.simulator import wire

BROKER_HOST = "broker-1.sim"
BROKER_PORT = 9092
NODE_ID = 1
USER = "User:ANONYMOUS"


@dataclass
class BrokerModel:
    """One broker (node 1). `engine`: enforce the quotas itself (Kafka's reference)."""

    latency_s: float = 0.002  # time to handle a request (log append, fetch read)
    fetch_available_bytes: int = 1 << 20  # what a fetch finds per partition (a consumer that keeps up)
    engine: QuotaEngine | None = None
    produced_bytes: int = 0
    fetched_bytes: int = 0
    throttles: list[int] = field(default_factory=list)

    def listen(self, loop: asyncio.AbstractEventLoop) -> None:
        network = loop.network  # type: ignore[attr-defined]
        network.listen((BROKER_HOST, BROKER_PORT), lambda: _BrokerConnection(self, loop))

    def now_ms(self, loop: asyncio.AbstractEventLoop) -> float:
        return loop.time() * 1000.0


class _BrokerConnection(asyncio.Protocol):
    def __init__(self, broker: BrokerModel, loop: asyncio.AbstractEventLoop) -> None:
        self.broker = broker
        self.loop = loop
        self.decoder = FrameDecoder(1 << 30)
        self.queue: deque[bytes] = deque()
        self.transport: asyncio.Transport | None = None
        self.busy = False  # handling a request, or muted after a throttled response

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.queue.extend(bytes(f) for f in self.decoder.feed(data))
        self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def _next(self) -> None:
        transport = self.transport
        if self.busy or transport is None:
            return
        if not self.queue:
            transport.resume_reading()
            return
        # The channel is muted while its request is handled: nothing more is read meanwhile.
        transport.pause_reading()
        self.busy = True
        request = self.queue.popleft()
        self.loop.call_later(self.broker.latency_s, self._answer, request)

    def _answer(self, request: bytes) -> None:
        transport = self.transport
        if transport is None:
            return
        header = parse_request_header(request)
        response, throttle_ms = self._respond(header, request)
        if response is not None:
            transport.write(bytes(response))
        if throttle_ms > 0:
            self.broker.throttles.append(throttle_ms)
            # KIP-219: the channel stays muted for the throttle after the response is sent.
            self.loop.call_later(throttle_ms / 1000.0, self._unmute)
        else:
            self._unmute()

    def _unmute(self) -> None:
        self.busy = False
        self._next()

    def _respond(self, header: RequestHeader, request: bytes) -> tuple[bytearray | bytes | None, int]:
        broker = self.broker
        engine = broker.engine
        now_ms = broker.now_ms(self.loop)
        client_id = header.client_id or ""
        # KIP-124: the request's time on the broker's threads, here its handling latency.
        request_ms = broker.latency_s * 1000.0
        if header.api_key == PRODUCE_KEY:
            size = len(request)  # the frame without its size prefix, as kqp.quotas.recording charges it
            broker.produced_bytes += size
            throttle = 0
            if engine is not None:
                # KafkaApis.handleProduceRequest: the larger of the produce and request throttles.
                throttle = engine.record_produce("1", USER, client_id, size, now_ms)
                throttle = max(throttle, engine.record_request_time("1", USER, client_id, PRODUCE_KEY, request_ms,
                                                                    now_ms))
            return wire.response_with(wire.produce_response_template(), PRODUCE_KEY, header.api_version,
                                      header.correlation_id, throttle), throttle
        if header.api_key == FETCH_KEY:
            max_bytes = wire.fetch_max_bytes(request, header.body_offset)
            if engine is not None:
                cap = engine.fetch_max_bytes_cap("1", USER, client_id, now_ms)
                if cap is not None:
                    max_bytes = min(max_bytes, cap)
            data = min(max_bytes, broker.fetch_available_bytes)
            template = wire.fetch_response_template(data)
            throttle = 0
            if engine is not None:
                # KafkaApis.handleFetchRequest: request time first; either throttle empties the
                # response and unrecords its bytes.
                request_throttle = engine.record_request_time("1", USER, client_id, FETCH_KEY, request_ms, now_ms)
                throttle = engine.record_fetch("1", USER, client_id, wire.fetch_charge(template), now_ms,
                                               request_throttle)
                throttle = max(throttle, request_throttle)
                if throttle > 0:
                    template = wire.fetch_response_template(0)
            broker.fetched_bytes += wire.fetch_charge(template)
            return wire.response_with(template, FETCH_KEY, header.api_version, header.correlation_id,
                                      throttle), throttle
        if header.api_key == CREATE_TOPICS_KEY:
            asked = wire.create_topics_asked(header, request)
            accepted, throttle = [True] * len(asked), 0
            if engine is not None:
                # KIP-599: the controller charges topic by topic and refuses those over the quota.
                outcome = engine.mutations("1", USER, client_id, header.api_key, header.api_version, asked, now_ms)
                accepted, throttle = outcome.accepted, outcome.throttle_ms
            errors = [0 if ok else THROTTLING_QUOTA_EXCEEDED for ok in accepted]
            return wire.create_topics_response(header, asked, errors, throttle), throttle
        if header.api_key == METADATA_KEY:
            body = wire.metadata_response_body(header.api_version, NODE_ID, BROKER_HOST, BROKER_PORT)
            return frame(encode_response_header(METADATA_KEY, header.api_version, header.correlation_id) + body), 0
        raise AssertionError(f"the modelled broker does not answer API {header.api_key}")
