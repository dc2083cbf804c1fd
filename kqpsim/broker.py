"""The modelled broker: answers Produce and Fetch after a latency, one request at a time per
connection as Kafka's SocketServer does (the channel is muted while a request is handled).

With `kafka` (kafka_reference.KafkaQuotas, written from Kafka's source and sharing no code
with kqp.quotas) it is also Kafka's figure: it records and throttles as KafkaApis does (a
Produce's request size when it is handled, a Fetch's MaxBytes capped by the quota window and
its response size recorded, then unrecorded and answered empty when throttled), sends
ThrottleTimeMs in the response, and keeps the channel muted for the throttle after sending it
(SocketServer's KIP-219 mute), so "Kafka's figure" of a scenario is the same clients in front
of this broker instead of the proxy.

Each request's handling time is `latency_s` plus up to `latency_spread_s`, drawn uniformly per
request from the loop's `broker_random` (seeded by the seed alone, so a seed gives the same
times on any machine). A broker whose handling never varies puts a throttled client in one
phase of Kafka's arithmetic on every seed (docs/quotas.md, "The simulator's open findings"); a real
broker's log append and fetch read vary by far more than the spread.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from dataclasses import dataclass, field

from kqp.protocol.apis import CREATE_TOPICS_KEY, FETCH_KEY, METADATA_KEY, PRODUCE_KEY
from kqp.protocol.framing import frame
from kqp.protocol.headers import RequestHeader, encode_response_header, parse_request_header
from kqp.protocol.mutations import THROTTLING_QUOTA_EXCEEDED
from kqpsim import wire
from kqpsim.kafka_reference import KafkaQuotas

BROKER_HOST = "broker-1.sim"
BROKER_PORT = 9092
NODE_ID = 1
USER = "ANONYMOUS"  # the principal's name, the user tag of an unauthenticated client


@dataclass
class BrokerModel:
    """One broker (node 1). `kafka`: enforce the quotas itself (Kafka's reference)."""

    latency_s: float = 0.002  # least time to handle a request (log append, fetch read)
    latency_spread_s: float = 0.0  # up to this much more per request, uniformly (0: always latency_s)
    fetch_available_bytes: int = 1 << 20  # what a fetch finds per partition (a consumer that keeps up)
    kafka: KafkaQuotas | None = None
    produced_bytes: int = 0
    fetched_bytes: int = 0
    throttles: list[int] = field(default_factory=list)

    def listen(self, loop: asyncio.AbstractEventLoop) -> None:
        network = loop.network  # type: ignore[attr-defined]
        network.listen((BROKER_HOST, BROKER_PORT), lambda: _BrokerConnection(self, loop))

    def handling_time(self, loop: asyncio.AbstractEventLoop) -> float:
        """One request's handling time: drawn only when it varies, so a broker that does not
        vary draws nothing from the seed's generator."""
        if self.latency_spread_s <= 0:
            return self.latency_s
        draws: random.Random = loop.broker_random  # type: ignore[attr-defined]
        return self.latency_s + draws.uniform(0.0, self.latency_spread_s)

    def now_ms(self, loop: asyncio.AbstractEventLoop) -> int:
        """Kafka's time.milliseconds(): whole milliseconds."""
        return int(loop.time() * 1000.0)


class _BrokerConnection(asyncio.Protocol):
    def __init__(self, broker: BrokerModel, loop: asyncio.AbstractEventLoop) -> None:
        self.broker = broker
        self.loop = loop
        self.decoder = wire.FrameReader()
        self.queue: deque[memoryview] = deque()
        self.transport: asyncio.Transport | None = None
        self.busy = False  # handling a request, or muted after a throttled response

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.queue.extend(self.decoder.feed(data))
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
        handling_s = self.broker.handling_time(self.loop)
        self.loop.call_later(handling_s, self._answer, request, handling_s)

    def _answer(self, request: memoryview, handling_s: float) -> None:
        transport = self.transport
        if transport is None:
            return
        header = parse_request_header(request)
        response, throttle_ms = self._respond(header, request, handling_s)
        if response is not None:
            transport.write(response)
        if throttle_ms > 0:
            self.broker.throttles.append(throttle_ms)
            # KIP-219: the channel stays muted for the throttle after the response is sent.
            self.loop.call_later(throttle_ms / 1000.0, self._unmute)
        else:
            self._unmute()

    def _unmute(self) -> None:
        self.busy = False
        self._next()

    def _respond(self, header: RequestHeader, request: memoryview, handling_s: float) -> tuple[bytes | None, int]:
        broker = self.broker
        kafka = broker.kafka
        now_ms = broker.now_ms(self.loop)
        client_id = header.client_id or ""
        # KIP-124: the request's time on a handler thread (requestThreadTimeNanos), here its
        # handling time.
        thread_nanos = round(handling_s * 1e9)
        if header.api_key == PRODUCE_KEY:
            size = len(request)  # request.sizeInBytes: header and body, no size prefix
            broker.produced_bytes += size
            throttle = 0
            if kafka is not None:
                throttle = kafka.handle_produce(USER, client_id, size, thread_nanos, now_ms)
            return wire.response_with(wire.produce_response_template(), PRODUCE_KEY, header.api_version,
                                      header.correlation_id, throttle), throttle
        if header.api_key == FETCH_KEY:
            max_bytes = wire.fetch_max_bytes(request, header.body_offset)
            if kafka is not None:
                max_bytes = kafka.fetch_max_bytes(USER, client_id, max_bytes)
            template = wire.fetch_response_template(min(max_bytes, broker.fetch_available_bytes))
            throttle = 0
            if kafka is not None:
                # FetchContext.getResponseSize: the response's size prefix and body.
                answer = kafka.handle_fetch(USER, client_id, wire.fetch_charge(template), thread_nanos, now_ms)
                throttle = answer.throttle_ms
                if answer.empty:
                    template = wire.fetch_response_template(0)  # getThrottledResponse
            broker.fetched_bytes += wire.fetch_charge(template)
            return wire.response_with(template, FETCH_KEY, header.api_version, header.correlation_id,
                                      throttle), throttle
        if header.api_key == CREATE_TOPICS_KEY:
            asked = wire.create_topics_asked(header, request)
            accepted, throttle = [True] * len(asked), 0
            if kafka is not None:
                accepted, throttle = kafka.handle_mutation(USER, client_id, header.api_key, header.api_version,
                                                           asked, thread_nanos, now_ms)
            errors = [0 if ok else THROTTLING_QUOTA_EXCEEDED for ok in accepted]
            return wire.create_topics_response(header, asked, errors, throttle), throttle
        if header.api_key == METADATA_KEY:
            body = wire.metadata_response_body(header.api_version, NODE_ID, BROKER_HOST, BROKER_PORT)
            return frame(encode_response_header(METADATA_KEY, header.api_version, header.correlation_id) + body), 0
        raise AssertionError(f"the modelled broker does not answer API {header.api_key}")
