"""Modelled Kafka clients: what each real client does that decides how a quota throttles it.

A model is a `ClientShape` (how it batches, pipelines, reacts to ThrottleTimeMs and times
out) driven by one `ClientConnection` per connection. Demand is saturating by default: each
connection always has a full request ready, so what it gets through is what the quota (and
the throttling path) admits. With an offer (bytes/s, a producer's application producing at
that rate) a request is ready only once the offer has filled it, as a real producer's batch
is: calibrated against the real clients (bench/calibration.py), a saturating producer bursts
at line rate each time Kafka's window lets it and is then throttled for about a second per
request for the rest of the window, 0.92-0.93x of the quota where the real Java producer and
aiokafka offering 1.5x get 1.00x; with the offer modelled they agree (docs/testing.md).

librdkafka offered a rate batches as the real one does (`Batching`, read from librdkafka's
rdkafka_broker.c producer serve and rdkafka_msgset_writer.c): records wait for `linger.ms`, a
batch is made only while no request waits for the socket (`queue.buffering.backpressure.threshold`
1), and without idempotence nothing else bounds what is in flight. While the socket takes them it
sends linger-sized batches; once the kernel's buffers are full behind the broker's mute, each
batch is what the offer built while the one before it waited for room, up to `batch.size`. The
saturating rows (no offer) keep the five-in-flight model of one request size.

What an operator measures is kept per connection: the size and time of every acknowledged
request (Produce) or delivered response (Fetch), and every request time-out.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass, field

from kqp.protocol.apis import CREATE_TOPICS_KEY, FETCH_KEY, PRODUCE_KEY
from kqpsim import wire
from kqpsim.virtual_loop import SOCKET_BUFFERS_BYTES


@dataclass(frozen=True, slots=True)
class Batching:
    """How a producer offered a rate (`Clients.offer`) forms its requests, as librdkafka does."""

    linger_s: float  # linger.ms: a batch is ready once its first record is this old ...
    # ... or when the records waiting fill `Clients.request_bytes` (batch.size, the record
    # batch's bytes with its header).
    backpressure_threshold: int  # queue.buffering.backpressure.threshold: requests not yet written
    # What the kernel holds between the client's writes and a broker that does not read (its
    # mute): the client's send buffer and the broker's receive buffer. A request that does not
    # fit waits in the client (its outbuf) until the broker has read enough.
    socket_buffer_bytes: int
    request_timeout_s: float  # the client's own time-out of a request, from when it was made


@dataclass(frozen=True, slots=True)
class ClientShape:
    """How one kind of client sends and reacts; see the models below."""

    name: str
    api: str  # "produce", "fetch" or "create_topics"
    max_in_flight: int
    honours_throttle: bool  # KIP-219 client side: send nothing on the connection until the throttle ends
    request_timeout_s: float
    reconnect_backoff_s: float = 0.1
    batching: Batching | None = None  # with an offer: how it batches (None: one request size)


# The application's record, as the calibration's real producer sends them: a 1 KiB value, no
# key; the offer (x the quota) counts their values, as the application does. In a batch each
# takes 1,035 bytes: the value and the record's own varints (length, attributes, timestamp and
# offset deltas, key and value lengths, headers).
RECORD_VALUE_BYTES = 1024
LIBRDKAFKA_RECORD_BYTES = 1035
# A v2 record batch's header (baseOffset to recordCount).
RECORD_BATCH_HEADER_BYTES = 61
# What the kernel holds between librdkafka and a muted Kafka broker, as the real producer of
# calibrate-librdkafka found it (docs/testing.md, "librdkafka's batching"): its socket first
# filled at 21 s with 990 requests of about 2,540 bytes awaiting a response, 2.51 MB.
# (librdkafka leaves socket.send.buffer.bytes at 0, so Linux sizes the send buffer itself, up
# to tcp_wmem's 4 MiB; Kafka's end has socket.receive.buffer.bytes, 102,400.) The real buffers
# then grew: the client wrote its whole offer for 10 s more and later had 3-5 requests of up
# to 1 MB awaiting; the model keeps 2.51 MB, which changes how long a request waits in the
# socket, not what Kafka admits (a full socket has a request ready whenever the mute ends).
LIBRDKAFKA_SOCKET_BUFFER_BYTES = 2_510_000

# librdkafka: ignores ThrottleTimeMs (it only reports it). Saturating (no offer): max.in.flight
# 5 per connection (idempotent), request.timeout.ms 30 s, one request size; on a time-out it
# fails the request and reconnects. Offered a rate: its defaults without idempotence
# (`Batching`): max.in.flight 1,000,000, linger.ms 5, backpressure threshold 1, and a request
# times out socket.timeout.ms (60 s) after it was made (rd_kafka_buf_calc_timeout at enqueue).
LIBRDKAFKA = ClientShape("librdkafka", "produce", max_in_flight=5, honours_throttle=False, request_timeout_s=30.0,
                         batching=Batching(linger_s=0.005, backpressure_threshold=1,
                                           socket_buffer_bytes=LIBRDKAFKA_SOCKET_BUFFER_BYTES,
                                           request_timeout_s=60.0))
LIBRDKAFKA_BATCHING_MAX_IN_FLIGHT = 1_000_000
# Kafka's Java producer: max.in.flight.requests.per.connection 5, honours ThrottleTimeMs
# (KIP-219: the connection is muted on the client side too), request.timeout.ms 30 s.
JAVA_PRODUCER = ClientShape("java-producer", "produce", max_in_flight=5, honours_throttle=True,
                            request_timeout_s=30.0)
# aiokafka: one Produce in flight per broker, ThrottleTimeMs ignored, request_timeout_ms 40 s.
AIOKAFKA = ClientShape("aiokafka", "produce", max_in_flight=1, honours_throttle=False, request_timeout_s=40.0)
# A fetching consumer (Java's): one Fetch in flight per broker, honours ThrottleTimeMs,
# request.timeout.ms 30 s.
FETCHING_CONSUMER = ClientShape("consumer", "fetch", max_in_flight=1, honours_throttle=True, request_timeout_s=30.0)

# Kafka's Java Admin client creating topics (CreateTopics v7, strict): one request in flight,
# honours ThrottleTimeMs; topics refused with THROTTLING_QUOTA_EXCEEDED are asked for again.
ADMIN = ClientShape("admin", "create_topics", max_in_flight=1, honours_throttle=True, request_timeout_s=30.0)

CLIENT_SHAPES = {shape.name: shape for shape in (LIBRDKAFKA, JAVA_PRODUCER, AIOKAFKA, FETCHING_CONSUMER, ADMIN)}


@dataclass
class ConnectionRecord:
    """What one connection got: (virtual time, bytes) of each acknowledgement, and time-outs."""

    client_id: str
    acks: list[tuple[float, int]] = field(default_factory=list)
    timeouts: int = 0
    reconnects: int = 0
    max_wait_s: float = 0.0  # the longest a request waited for its answer
    # For the per-second trace (`python -m kqpsim run --trace`): (virtual time, ThrottleTimeMs)
    # of each throttled answer, the time of each time-out, and for each connection this client
    # opened, when the server's end of it did not read it (its mutes and back-pressure).
    throttles: list[tuple[float, int]] = field(default_factory=list)
    timeout_times: list[float] = field(default_factory=list)
    server_read_pauses: list[list[tuple[float, float | None]]] = field(default_factory=list)

    def bytes_between(self, start: float, end: float) -> int:
        return sum(size for at, size in self.acks if start <= at < end)


class ClientConnection(asyncio.Protocol):
    """One connection of a modelled client: keeps `max_in_flight` requests of `request_bytes`
    outstanding, less while the client itself honours a throttle."""

    def __init__(self, loop: asyncio.AbstractEventLoop, shape: ClientShape, client_id: str, request_bytes: int,
                 address: tuple[str, int], record: ConnectionRecord, index: int = 0,
                 fallbacks: tuple[tuple[str, int], ...] = (), offer_bps: float = 0.0) -> None:
        self.loop = loop
        self.shape = shape
        self.client_id = client_id
        self.request_bytes = request_bytes
        self.address = address
        # Other addresses of the same service (a fleet's instances behind a balancer), tried in
        # turn when this one refuses a connection.
        self.addresses = [address, *(a for a in fallbacks if a != address)]
        self.record = record
        self.index = index  # the connection's number in its scenario (names its topics)
        self.transport: asyncio.Transport | None = None
        self.decoder = wire.FrameReader()
        # (correlation id, made at, request size, records): made at is when it was sent, or
        # for a batching producer when the batch was made (its time-out runs from then).
        self.in_flight: deque[tuple[int, float, int, int]] = deque()
        self.next_correlation = 1
        self.blocked_until = 0.0
        self.stopped = False
        self._wake: asyncio.TimerHandle | None = None
        self._timeout: asyncio.TimerHandle | None = None
        self.topics_created = 0
        # The application's offer (0: saturating); what it has produced since the first open
        # and not yet put into a request is the client's backlog.
        self.offer_bps = offer_bps
        self.offer_began: float | None = None
        self.batched_bytes = 0
        # A batching producer (librdkafka offered a rate): its records are numbered from the
        # offer's start; those below `batched_records` are in requests. `outbuf`: requests made
        # and not yet written; `socket_full`: the last one written did not fit in the kernel's
        # buffers (it is still partly in the client, as librdkafka's partial send).
        self.batching = shape.batching if offer_bps and shape.api == "produce" else None
        self.max_in_flight = LIBRDKAFKA_BATCHING_MAX_IN_FLIGHT if self.batching else shape.max_in_flight
        self.request_timeout_s = self.batching.request_timeout_s if self.batching else shape.request_timeout_s
        self.record_interval_s = RECORD_VALUE_BYTES / offer_bps if offer_bps else 0.0
        self.batched_records = 0
        self.outbuf: deque[tuple[int, bytes, float, int]] = deque()  # (correlation, request, made at, records)
        self.socket_full = False
        self.requests: dict[int, bytes] = {}  # a batching producer's requests by their records
        if shape.api == "produce":
            self.template = wire.produce_request(client_id, request_bytes)
            self.api_key, self.version = PRODUCE_KEY, wire.PRODUCE_VERSION
        elif shape.api == "create_topics":
            # `request_bytes` is the partitions of the one topic each request creates.
            self.template = b""
            self.api_key, self.version = CREATE_TOPICS_KEY, wire.CREATE_TOPICS_VERSION
        else:
            self.template = wire.fetch_request(client_id, request_bytes)
            self.api_key, self.version = FETCH_KEY, wire.FETCH_VERSION

    # ---- connecting ----------------------------------------------------------------------

    def open(self) -> None:
        if self.offer_began is None:
            self.offer_began = self.loop.time()
        self.loop.create_task(self._connect())

    async def _connect(self) -> None:
        for _ in range(len(self.addresses)):
            try:
                await self.loop.create_connection(lambda: self, *self.address)
                return
            except ConnectionRefusedError:
                self.addresses.append(self.addresses.pop(0))
                self.address = self.addresses[0]
        self.loop.call_later(self.shape.reconnect_backoff_s, self.open)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = getattr(transport, "peer", None)
        if peer is not None:
            self.record.server_read_pauses.append(peer.read_pauses)
        self.decoder = wire.FrameReader()
        if self.batching is not None:
            # Writing pauses once the kernel's buffers hold `socket_buffer_bytes` and resumes as
            # soon as the request that did not fit has gone in whole.
            above = max(0, self.batching.socket_buffer_bytes - SOCKET_BUFFERS_BYTES)
            transport.set_write_buffer_limits(high=above, low=above)
            self.socket_full = False
        self._send_more()

    def pause_writing(self) -> None:
        if self.batching is not None:
            self.socket_full = True

    def resume_writing(self) -> None:
        if self.batching is not None:
            self.socket_full = False
            self._send_more()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        # An offered producer's requests that got no answer go back to its backlog (its retries).
        self.batched_bytes -= len(self.in_flight) * self.request_bytes if self.offer_bps else 0
        if self.batching is not None:
            # Their records are produced again, first (librdkafka retries them in order).
            self.batched_records -= sum(r[3] for r in self.in_flight) + sum(r[3] for r in self.outbuf)
            self.outbuf.clear()
        self.in_flight.clear()
        if self._timeout is not None:
            self._timeout.cancel()
            self._timeout = None
        if not self.stopped:
            self.record.reconnects += 1
            self.loop.call_later(self.shape.reconnect_backoff_s, self.open)

    def stop(self) -> None:
        self.stopped = True
        for handle in (self._wake, self._timeout):
            if handle is not None:
                handle.cancel()
        if self.transport is not None:
            self.transport.close()

    # ---- sending -------------------------------------------------------------------------

    def _send_more(self) -> None:
        transport = self.transport
        if transport is None or self.stopped:
            return
        now = self.loop.time()
        if now < self.blocked_until:
            if self._wake is None:
                self._wake = self.loop.call_at(self.blocked_until, self._woken)
            return
        if self.batching is not None:
            self._send_batches(transport, self.batching, now)
            return
        while len(self.in_flight) < self.max_in_flight:
            if self.offer_bps and not self._batch_ready(now):
                break
            correlation = self.next_correlation
            self.next_correlation += 1
            request = self._request(correlation)
            transport.write(request)
            self.in_flight.append((correlation, now, len(request) - 4, 0))
        self._arm_timeout()

    def _send_batches(self, transport: asyncio.Transport, batching: Batching, now: float) -> None:
        """librdkafka's producer serve: write what waits while the socket takes it; make a batch
        of the records waiting only while fewer requests than the backpressure threshold wait to
        be written, and only once it is ready (linger.ms, or batch.size filled)."""
        while True:
            while self.outbuf and not self.socket_full and len(self.in_flight) < self.max_in_flight:
                correlation, request, made_at, records = self.outbuf.popleft()
                transport.write(request)
                self.in_flight.append((correlation, made_at, len(request) - 4, records))
            waiting = len(self.outbuf) + (1 if self.socket_full else 0)
            if waiting >= batching.backpressure_threshold:
                break
            records = self._records_ready(now, batching)
            if not records:
                break
            correlation = self.next_correlation
            self.next_correlation += 1
            self.batched_records += records
            self.outbuf.append((correlation, self._batch_request(records, correlation), now, records))
        self._arm_timeout()

    def _records_ready(self, now: float, batching: Batching) -> int:
        """How many records the next batch takes now (0: none is ready; then wake when one is)."""
        assert self.offer_began is not None
        interval = self.record_interval_s
        # Record k (from 0) is produced at offer_began + (k + 1) * interval.
        produced = int((now - self.offer_began) / interval + 1e-9)
        waiting = produced - self.batched_records
        most = max(1, (self.request_bytes - RECORD_BATCH_HEADER_BYTES) // LIBRDKAFKA_RECORD_BYTES)
        linger_ends = self.offer_began + (self.batched_records + 1) * interval + batching.linger_s
        if waiting >= most or (waiting > 0 and now >= linger_ends - 1e-9):
            return min(waiting, most)
        # librdkafka's broker thread waits for the linger's end in whole milliseconds rounded up
        # from when it last served (rd_timeout_ms), so each serve (a response, a resumed write)
        # sets the wait anew; a record produced after the end wakes it at once (the producer
        # signals once the queue's wake-up time has passed), and so does a full batch. With no
        # record waiting, the first one's produce wakes it and it waits linger.ms exactly.
        wake = linger_ends
        if waiting > 0:
            wake = now + math.ceil((linger_ends - now) * 1000.0 - 1e-6) / 1000.0
            produced_after = math.ceil((linger_ends - self.offer_began) / interval - 1e-9)
            wake = min(wake, self.offer_began + produced_after * interval)
        wake = min(wake, self.offer_began + (self.batched_records + most) * interval)
        if self._wake is not None:
            self._wake.cancel()
        self._wake = self.loop.call_at(wake, self._woken)
        return 0

    def _batch_request(self, records: int, correlation: int) -> bytes:
        template = self.requests.get(records)
        if template is None:
            size = records * LIBRDKAFKA_RECORD_BYTES + RECORD_BATCH_HEADER_BYTES + wire.produce_overhead(self.client_id)
            template = wire.produce_request(self.client_id, size)
            self.requests[records] = template
        return wire.with_correlation(template, correlation, request=True)

    def _request(self, correlation: int) -> bytes:
        if self.api_key == CREATE_TOPICS_KEY:
            self.topics_created += 1
            name = f"{self.client_id}-{self.index}-{self.topics_created}"
            return wire.create_topics_request(self.client_id, correlation, [name], self.request_bytes)
        return wire.with_correlation(self.template, correlation, request=True)

    def _batch_ready(self, now: float) -> bool:
        """Whether the offer has filled the next request; if not, wake when it will have."""
        assert self.offer_began is not None
        ready_at = self.offer_began + (self.batched_bytes + self.request_bytes) / self.offer_bps
        if now >= ready_at:
            self.batched_bytes += self.request_bytes
            return True
        if self._wake is None:
            self._wake = self.loop.call_at(ready_at, self._woken)
        return False

    def _woken(self) -> None:
        self._wake = None
        self._send_more()

    def _arm_timeout(self) -> None:
        # One timer, at the oldest request's deadline; when it fires, a request answered since
        # only moves it on (cheaper than re-arming it on every response).
        if self._timeout is None and self.in_flight:
            self._timeout = self.loop.call_at(self.in_flight[0][1] + self.request_timeout_s, self._deadline)

    def _deadline(self) -> None:
        self._timeout = None
        if not self.in_flight or self.transport is None:
            return
        if self.loop.time() < self.in_flight[0][1] + self.request_timeout_s:
            self._arm_timeout()
            return
        # The oldest request was not answered in time: the client fails it and reconnects
        # (librdkafka and Java both close the connection on an in-flight time-out).
        self.record.timeouts += 1
        self.record.timeout_times.append(self.loop.time())
        self.transport.close()

    # ---- receiving -----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        for response in self.decoder.feed(data):
            self._answered(response)

    def _answered(self, response: memoryview) -> None:
        correlation = wire.response_correlation(response)
        expected, sent_at, size, _ = self.in_flight.popleft()
        assert correlation == expected, f"answered {correlation}, expected {expected}"
        now = self.loop.time()
        self.record.max_wait_s = max(self.record.max_wait_s, now - sent_at)
        throttle_ms = wire.response_throttle(response, self.api_key, self.version)
        if self.shape.api == "produce":
            self.record.acks.append((now, size))
        elif self.shape.api == "create_topics":
            self.record.acks.append((now, wire.partitions_created(response)))
        else:
            self.record.acks.append((now, wire.fetch_charge(response, prefixed=False)))
        if throttle_ms > 0:
            self.record.throttles.append((now, throttle_ms))
        if throttle_ms > 0 and self.shape.honours_throttle:
            self.blocked_until = max(self.blocked_until, now + throttle_ms / 1000.0)
        self._arm_timeout()
        self._send_more()
