"""The seam between the byte-moving core and the features that look at the traffic.

A connection calls its hooks for every request and response. The default hooks change
nothing; quota enforcement, metrics and capture each implement some of them. Hooks run on
the event loop, inline with the data path, so they must not block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kqp.protocol.headers import RequestHeader
from kqp.quotas.recording import QuotaTrace

if TYPE_CHECKING:
    from kqp.proxy.connection import ProxiedConnection


@dataclass(slots=True)
class Exchange:
    """One request and, later, its response, as the proxy saw them."""

    header: RequestHeader
    request_bytes: int
    received_at: float  # event-loop clock, seconds
    expects_response: bool = True
    sent_at: float = 0.0
    response_received_at: float = 0.0
    # Set when the proxy answers the request itself instead of forwarding it.
    local_response: bytes | None = None
    # What the quota engine was given for this exchange (enforcement writes, capture reads).
    quota: QuotaTrace | None = None
    # Per-feature state carried from request to response.
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RequestVerdict:
    """What a hook decided for a request: forward it (possibly changed) or answer it here."""

    # Replacement request frame (header + body, no size prefix); None keeps the original.
    frame: bytes | None = None
    # Complete response frame (no size prefix) to send instead of forwarding.
    answer: bytes | None = None
    # Stop reading from the client for this long after the request (acks=0 throttling).
    mute_ms: int = 0


@dataclass(slots=True)
class ResponseVerdict:
    frame: bytes | bytearray | None = None
    mute_ms: int = 0


class TrafficHooks:
    """No-op hooks; subclasses override what they need."""

    def connection_opened(self, connection: ProxiedConnection) -> None:
        return None

    def request(self, connection: ProxiedConnection, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        return None

    def response(
        self, connection: ProxiedConnection, exchange: Exchange, frame: bytes, body_offset: int
    ) -> ResponseVerdict | None:
        return None

    def unanswered(self, connection: ProxiedConnection, exchange: Exchange) -> None:
        """A request was forwarded that gets no response (Produce with acks=0)."""
        return None

    # Cut-through: a large response goes to the client while it streams in, so a hook sees
    # its head (the response header and at least the body's first field) when it starts,
    # may patch the head in place (same length), and hears when the last byte has passed.

    def needs_whole_response(self, connection: ProxiedConnection, exchange: Exchange) -> bool:
        """True when this hook must see the response frame whole (no cut-through)."""
        return False

    def response_started(
        self, connection: ProxiedConnection, exchange: Exchange, head: bytearray, body_offset: int, frame_size: int
    ) -> ResponseVerdict | None:
        """A streamed response began; `frame_size` is its whole size (without the size prefix)."""
        return None

    def response_streamed(
        self, connection: ProxiedConnection, exchange: Exchange, frame_size: int, body_offset: int
    ) -> None:
        """The last byte of a streamed response went to the client."""
        return None

    def connection_closed(self, connection: ProxiedConnection, reason: str) -> None:
        return None


class HookChain(TrafficHooks):
    """Several hooks in order; the first to answer a request wins, later ones see its changes."""

    def __init__(self, hooks: list[TrafficHooks]) -> None:
        self.hooks = hooks

    def connection_opened(self, connection: ProxiedConnection) -> None:
        for hook in self.hooks:
            hook.connection_opened(connection)

    def request(self, connection: ProxiedConnection, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        combined: RequestVerdict | None = None
        for hook in self.hooks:
            verdict = hook.request(connection, exchange, frame)
            if verdict is None:
                continue
            if combined is None:
                combined = verdict
            else:
                combined.mute_ms = max(combined.mute_ms, verdict.mute_ms)
                combined.frame = verdict.frame if verdict.frame is not None else combined.frame
                combined.answer = verdict.answer if verdict.answer is not None else combined.answer
            if combined.frame is not None:
                frame = combined.frame
            if combined.answer is not None:
                break
        return combined

    def response(
        self, connection: ProxiedConnection, exchange: Exchange, frame: bytes, body_offset: int
    ) -> ResponseVerdict | None:
        combined: ResponseVerdict | None = None
        for hook in self.hooks:
            verdict = hook.response(connection, exchange, frame, body_offset)
            if verdict is None:
                continue
            if combined is None:
                combined = ResponseVerdict()
            if verdict.frame is not None:
                frame = bytes(verdict.frame)
                combined.frame = frame
            combined.mute_ms = max(combined.mute_ms, verdict.mute_ms)
        return combined

    def unanswered(self, connection: ProxiedConnection, exchange: Exchange) -> None:
        for hook in self.hooks:
            hook.unanswered(connection, exchange)

    def needs_whole_response(self, connection: ProxiedConnection, exchange: Exchange) -> bool:
        return any(hook.needs_whole_response(connection, exchange) for hook in self.hooks)

    def response_started(
        self, connection: ProxiedConnection, exchange: Exchange, head: bytearray, body_offset: int, frame_size: int
    ) -> ResponseVerdict | None:
        combined: ResponseVerdict | None = None
        for hook in self.hooks:
            verdict = hook.response_started(connection, exchange, head, body_offset, frame_size)
            if verdict is not None:
                combined = combined or ResponseVerdict()
                combined.mute_ms = max(combined.mute_ms, verdict.mute_ms)
        return combined

    def response_streamed(
        self, connection: ProxiedConnection, exchange: Exchange, frame_size: int, body_offset: int
    ) -> None:
        for hook in self.hooks:
            hook.response_streamed(connection, exchange, frame_size, body_offset)

    def connection_closed(self, connection: ProxiedConnection, reason: str) -> None:
        for hook in self.hooks:
            hook.connection_closed(connection, reason)
