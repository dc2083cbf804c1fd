"""The workers of one host (`kqp serve --workers N`) hold one budget through their supervisor,
at a loop tick's lag rather than a topic's round trip.

Why not the topic: a worker that measures the others' usage 100 ms + a round trip late admits,
whenever room opens in a quota window, as if it were alone. Room opens for every worker at the
same moment (the samples of an earlier burst leave the window together, and the throttled
connections of every worker come back together), so each worker fills the same room before the
others' usage reaches it: bursts of N times the room, once per quota window. The less lag, the
less of the room is filled twice; on one host the lag can be one turn of each event loop.

How: the supervisor creates a Unix socket pair per worker before it forks it. A worker sends,
once per turn of its event loop in which it recorded anything, what its sensors recorded since
(kqp.quotas.fleet: `take_host_usage`, the report codec of the topic), and the supervisor's
`HostRelay` writes each such frame as it is to every other worker, which records it at once
(`record_remote_usage(via_host=True)`). The sharing rules are FleetSharing's, the same as the
topic's. Partition-mutation claims go the same way: the supervisor writes every claim to every
worker, its sender included, in the order it read them, so every worker charges the claims in
one order (kqp.proxy.claims), as the topic's single partition orders them for a fleet; a
(re)started worker first gets the claims of the last quota window plus 30 s.

Nothing blocks: writes are buffered by the event loop, and a peer with more than
`MAX_QUEUED_BYTES` waiting is skipped (the frame is dropped and counted) rather than waited
for. A dropped usage frame under-counts that worker's usage once; a dropped claim is charged
alone by its sender after `CLAIM_DEADLINE_S`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import cast

from kqp.proxy.claims import ClaimBook
from kqp.proxy.hooks import FleetCharge
from kqp.proxy.metrics import ProxyMetrics
from kqp.quotas import QuotaEngine
from kqp.quotas.fleet import (
    MutationClaim,
    ReportError,
    UsageReport,
    decode_record,
    decode_report,
    encode_claim,
    encode_report,
    split_usage,
)
from kqp.quotas.recording import QuotaClient, RequestCharges

log = logging.getLogger(__name__)

# A frame: a kind byte and the payload's length, then the payload (a report or claim in the
# topic's JSON, or the member count).
_HEADER = struct.Struct(">cI")
USAGE = b"U"  # a worker's usage: to every other worker
CLAIM = b"C"  # a worker's mutation claim: to every worker, in the supervisor's order
HISTORY = b"H"  # a claim sent before the receiving worker started
MEMBERS = b"M"  # how many workers the supervisor relays for
_KINDS = frozenset({USAGE, CLAIM, HISTORY, MEMBERS})
MAX_FRAME_BYTES = 16 * 1024 * 1024
# Bytes waiting to be written to one peer past which frames to it are dropped, not queued: a
# stuck worker (or supervisor) must not grow the others' memory or hold their loops.
MAX_QUEUED_BYTES = 4 * 1024 * 1024
# A claim's round trip through the supervisor takes about a millisecond; one not back by then
# went to a stuck or dead supervisor, and the request is charged here alone.
CLAIM_DEADLINE_S = 2.0
_DELTAS_PER_FRAME = 5_000


class FrameError(ValueError):
    """Bytes on a relay socket that are not a frame (a bug, never a peer's choice)."""


def frame(kind: bytes, payload: bytes) -> bytes:
    return _HEADER.pack(kind, len(payload)) + payload


class FrameReader:
    """Frames out of a byte stream, however the stream cuts them."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[tuple[bytes, bytes, bytes]]:
        """(kind, payload, whole frame) of each frame `data` completes."""
        self._buffer += data
        buffer = self._buffer
        start = 0
        try:
            while len(buffer) - start >= _HEADER.size:
                kind, size = _HEADER.unpack_from(buffer, start)
                if kind not in _KINDS or size > MAX_FRAME_BYTES:
                    raise FrameError(f"not a relay frame: kind {kind!r}, {size} bytes")
                end = start + _HEADER.size + size
                if len(buffer) < end:
                    break
                yield kind, bytes(buffer[start + _HEADER.size:end]), bytes(buffer[start:end])
                start = end
        finally:
            del buffer[:start]


def _send(transport: asyncio.Transport | None, data: bytes) -> bool:
    """Write unless the peer is gone or too far behind; False if the frame was dropped."""
    if transport is None or transport.is_closing() or transport.get_write_buffer_size() > MAX_QUEUED_BYTES:
        return False
    transport.write(data)
    return True


# ---- the supervisor's side ---------------------------------------------------------------------


class _RelayPeer(asyncio.Protocol):
    def __init__(self, relay: HostRelay, index: int) -> None:
        self.relay = relay
        self.index = index
        self.reader = FrameReader()
        self.transport: asyncio.Transport | None = None
        self.behind = False  # frames to it are being dropped (logged once per episode)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream transport (uvloop's is not a subclass)
        self.relay.joined(self)

    def data_received(self, data: bytes) -> None:
        try:
            for kind, _payload, whole in self.reader.feed(data):
                self.relay.relay(self, kind, whole)
        except FrameError as exc:
            log.error("host relay: worker %d sent %s; closing its relay socket", self.index, exc)
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.left(self)


class HostRelay:
    """The supervisor's end: one socket per worker, each frame passed on within the loop turn
    that read it (module docstring)."""

    def __init__(self, claim_history_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._claim_history_s = claim_history_s
        self._clock = clock
        self._peers: dict[int, _RelayPeer] = {}
        # Supervisor ends created for a worker and not connected to the loop yet.
        self._unattached: dict[int, socket.socket] = {}
        # (when relayed, the claim as a HISTORY frame), oldest first.
        self._claims: collections.deque[tuple[float, bytes]] = collections.deque()
        self.frames_relayed = 0
        self.frames_dropped = 0

    def socket_for(self, index: int) -> socket.socket:
        """A new pair for worker `index` (before its fork): the worker's end is returned, the
        supervisor's kept for `attach` after the fork."""
        self.detach(index)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._unattached[index] = mine
        return theirs

    def supervisor_fds(self) -> list[int]:
        """Every file descriptor of the supervisor's ends, for a new worker to close after its fork."""
        fds = [sock.fileno() for sock in self._unattached.values()]
        for peer in self._peers.values():
            sock = peer.transport.get_extra_info("socket") if peer.transport is not None else None
            if sock is not None:
                fds.append(sock.fileno())
        return [fd for fd in fds if fd >= 0]

    async def attach(self, index: int) -> None:
        """Start relaying for worker `index` (its end went with its fork)."""
        sock = self._unattached.pop(index, None)
        if sock is None:
            return  # the worker died before its relay started: detach closed its end
        loop = asyncio.get_running_loop()
        await loop.create_unix_connection(lambda: _RelayPeer(self, index), sock=sock)

    def detach(self, index: int) -> None:
        """Worker `index` is gone: its usage stays in the others' windows until it ages out."""
        sock = self._unattached.pop(index, None)
        if sock is not None:
            sock.close()
        peer = self._peers.get(index)
        if peer is not None and peer.transport is not None:
            peer.transport.close()  # connection_lost removes it

    def joined(self, peer: _RelayPeer) -> None:
        self._peers[peer.index] = peer
        self._forget_old_claims()
        for _, history in self._claims:
            if not _send(peer.transport, history):
                self.frames_dropped += 1
        self._announce_members()

    def left(self, peer: _RelayPeer) -> None:
        if self._peers.get(peer.index) is peer:
            del self._peers[peer.index]
            self._announce_members()

    def relay(self, sender: _RelayPeer, kind: bytes, whole: bytes) -> None:
        if kind == USAGE:
            targets = [peer for peer in self._peers.values() if peer is not sender]
        elif kind == CLAIM:
            # Every worker, the sender included: the order the supervisor writes them in is the order
            # every worker charges them in.
            targets = list(self._peers.values())
            self._claims.append((self._clock(), HISTORY + whole[1:]))
            self._forget_old_claims()
        else:
            log.error("host relay: worker %d sent a %r frame, which only the supervisor sends", sender.index, kind)
            return
        for peer in targets:
            if _send(peer.transport, whole):
                self.frames_relayed += 1
                if peer.behind:
                    peer.behind = False
                    log.warning("host relay: worker %d reads its frames again", peer.index)
            else:
                self.frames_dropped += 1
                if not peer.behind:
                    peer.behind = True
                    log.warning("host relay: worker %d is more than %d bytes behind; frames for it are dropped "
                                "until it catches up", peer.index, MAX_QUEUED_BYTES)

    def _forget_old_claims(self) -> None:
        horizon = self._clock() - self._claim_history_s
        while self._claims and self._claims[0][0] < horizon:
            self._claims.popleft()

    def _announce_members(self) -> None:
        members = frame(MEMBERS, json.dumps(len(self._peers)).encode())
        for peer in self._peers.values():
            _send(peer.transport, members)

    def close(self) -> None:
        for index in list(self._unattached):
            self._unattached.pop(index).close()
        for peer in list(self._peers.values()):
            if peer.transport is not None:
                peer.transport.close()


# ---- a worker's side ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HostLink:
    """What a worker needs to join its host's relay: its end of the socket pair, its instance
    name (also its name on the fleet's topic, if there is one), and the prefix every worker of
    this host's name starts with."""

    sock: socket.socket
    instance_id: str
    siblings_prefix: str

    def is_sibling(self, instance: str) -> bool:
        return instance.startswith(self.siblings_prefix)


class _WorkerPeer(asyncio.Protocol):
    def __init__(self, exchange: HostExchange) -> None:
        self.exchange = exchange
        self.reader = FrameReader()

    def data_received(self, data: bytes) -> None:
        try:
            for kind, payload, _whole in self.reader.feed(data):
                self.exchange.received(kind, payload)
        except FrameError as exc:
            log.error("host exchange: the supervisor sent %s", exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.exchange.lost(exc)


class HostExchange:
    """One worker's end of the relay, on the proxy's event loop (module docstring)."""

    def __init__(self, link: HostLink, engine: QuotaEngine, now_ms: Callable[[], float],
                 metrics: ProxyMetrics | None = None, *, orders_mutations: bool = True,
                 reports_status: bool = True, on_lost: Callable[[], None] | None = None) -> None:
        self.link = link
        self.engine = engine
        self._now_ms = now_ms
        self._metrics = metrics
        # With a fleet's topic as well, the topic orders mutations and tells the fleet's state.
        self._orders_mutations = orders_mutations
        self._reports_status = reports_status
        self._on_lost = on_lost
        self._loop: asyncio.AbstractEventLoop | None = None
        self._transport: asyncio.Transport | None = None
        self._flush_due = False
        self._stopping = False
        self._seq = 0
        self._claims = ClaimBook(link.instance_id, engine, now_ms, metrics, "host exchange")
        self.workers = 1
        # Running totals, for tests and the bench.
        self.frames_sent = 0
        self.frames_dropped = 0
        self.deltas_applied = 0

    async def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        transport, _ = await loop.create_unix_connection(lambda: _WorkerPeer(self), sock=self.link.sock)
        self._transport = transport
        self.engine.share_with_host(True, self._flush_soon, mutations_claimed=self._orders_mutations)
        self._report_status()

    def describe(self) -> str:
        return f"host exchange ok, {self.workers} worker(s)"

    def _flush_soon(self) -> None:
        # Called by the engine when the first usage since the last flush is recorded: every request
        # handled in this turn of the loop goes into one frame, sent at the start of the next turn.
        if not self._flush_due and self._loop is not None:
            self._flush_due = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        for chunk in split_usage(self.engine.take_host_usage(), _DELTAS_PER_FRAME):
            self._seq += 1
            self._write(USAGE, encode_report(UsageReport(self.link.instance_id, self._seq, chunk)))

    def _write(self, kind: bytes, payload: bytes) -> bool:
        if _send(self._transport, frame(kind, payload)):
            self.frames_sent += 1
            return True
        self.frames_dropped += 1
        if self._metrics is not None:
            self._metrics.fleet_report_failed()
        return False

    def received(self, kind: bytes, payload: bytes) -> None:
        try:
            if kind == USAGE:
                report = decode_report(payload)
                self.engine.record_remote_usage(report.usage, self._now_ms(), report.instance, via_host=True)
                self.deltas_applied += len(report.usage)
            elif kind in (CLAIM, HISTORY):
                claim = decode_record(payload)
                if not isinstance(claim, MutationClaim):
                    raise ReportError("a claim frame without a claim")
                self._claims.charge(claim, history=kind == HISTORY)
            elif kind == MEMBERS:
                self.workers = int(json.loads(payload))
                self._report_status()
        except (ReportError, ValueError) as exc:
            log.warning("host exchange: a %r frame kqp cannot read: %s", kind, exc)

    def _report_status(self) -> None:
        if self._reports_status and self._metrics is not None:
            self._metrics.fleet_status("ok", self.workers, 1.0)

    def claim(self, client: QuotaClient, charges: RequestCharges) -> asyncio.Future[FleetCharge | None] | None:
        """The enforcement's MutationOrder: a future for the charge once the supervisor has put the
        claim in the host's order; None (charge here at once) while the relay is down."""
        if self._transport is None or self._transport.is_closing() or charges.mutations is None:
            return None
        return self._claims.open(client, charges, CLAIM_DEADLINE_S, self._send_claim)

    def _send_claim(self, claim: MutationClaim) -> None:
        if not self._write(CLAIM, encode_claim(claim)):
            self._claims.timed_out(claim.claim_id, 0.0)

    def lost(self, exc: Exception | None) -> None:
        self._transport = None
        self.engine.share_with_host(False)
        if not self._stopping:
            # The supervisor is gone: this worker would enforce a whole budget of its own.
            log.error("host exchange: the supervisor's relay closed (%s); this worker stops", exc or "end of stream")
            if self._on_lost is not None:
                self._on_lost()

    async def stop(self) -> None:
        self._stopping = True
        self._claims.close()
        if self._transport is not None:
            self._flush()
            self._transport.close()
            self._transport = None
        self.engine.share_with_host(False)
        with contextlib.suppress(OSError):
            self.link.sock.close()
