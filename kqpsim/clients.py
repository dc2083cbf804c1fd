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

What an operator measures is kept per connection: the size and time of every acknowledged
request (Produce) or delivered response (Fetch), and every request time-out.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from kqp.protocol.apis import CREATE_TOPICS_KEY, FETCH_KEY, PRODUCE_KEY
from kqpsim import wire


@dataclass(frozen=True, slots=True)
class ClientShape:
    """How one kind of client sends and reacts; see the models below."""

    name: str
    api: str  # "produce", "fetch" or "create_topics"
    max_in_flight: int
    honours_throttle: bool  # KIP-219 client side: send nothing on the connection until the throttle ends
    request_timeout_s: float
    reconnect_backoff_s: float = 0.1


# librdkafka: max.in.flight 5 per connection (idempotent), ignores ThrottleTimeMs (it only
# reports it), request.timeout.ms 30 s; on a time-out it fails the request and reconnects.
LIBRDKAFKA = ClientShape("librdkafka", "produce", max_in_flight=5, honours_throttle=False, request_timeout_s=30.0)
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
        self.in_flight: deque[tuple[int, float]] = deque()  # (correlation id, sent at)
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
        self._send_more()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        # An offered producer's requests that got no answer go back to its backlog (its retries).
        self.batched_bytes -= len(self.in_flight) * self.request_bytes if self.offer_bps else 0
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
        while len(self.in_flight) < self.shape.max_in_flight:
            if self.offer_bps and not self._batch_ready(now):
                break
            correlation = self.next_correlation
            self.next_correlation += 1
            transport.write(self._request(correlation))
            self.in_flight.append((correlation, now))
        self._arm_timeout()

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
            self._timeout = self.loop.call_at(self.in_flight[0][1] + self.shape.request_timeout_s, self._deadline)

    def _deadline(self) -> None:
        self._timeout = None
        if not self.in_flight or self.transport is None:
            return
        if self.loop.time() < self.in_flight[0][1] + self.shape.request_timeout_s:
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
        expected, sent_at = self.in_flight.popleft()
        assert correlation == expected, f"answered {correlation}, expected {expected}"
        now = self.loop.time()
        self.record.max_wait_s = max(self.record.max_wait_s, now - sent_at)
        throttle_ms = wire.response_throttle(response, self.api_key, self.version)
        if self.shape.api == "produce":
            self.record.acks.append((now, len(self.template) - 4))
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
