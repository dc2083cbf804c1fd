"""Per-connection tracking of in-flight requests.

Kafka answers requests on a connection strictly in order, and responses do not carry their
API key, so the only way to read a response is to remember what was asked. Produce with
acks=0 gets no response at all and must not be tracked, or every later response would be
matched to the wrong request.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from kqp.protocol.apis import PRODUCE_KEY
from kqp.protocol.errors import CorrelationError, ProtocolDecodeError
from kqp.protocol.headers import read_uvarint

_INT16 = struct.Struct(">h")


def produce_acks(body: bytes | memoryview, api_version: int) -> int:
    """The acks field of a Produce request body (after transactional_id)."""
    if api_version >= 9:
        length_plus_one, offset = read_uvarint(body, 0)
        offset += max(length_plus_one - 1, 0)
    else:
        if len(body) < 2:
            raise ProtocolDecodeError("truncated Produce request")
        (length,) = _INT16.unpack_from(body, 0)
        offset = 2 + max(length, 0)
    if offset + 2 > len(body):
        raise ProtocolDecodeError("truncated Produce request")
    acks: int = _INT16.unpack_from(body, offset)[0]
    return acks


def expects_response(api_key: int, api_version: int, body: bytes | memoryview) -> bool:
    return not (api_key == PRODUCE_KEY and produce_acks(body, api_version) == 0)


T = TypeVar("T")


@dataclass(slots=True)
class InFlight(Generic[T]):
    correlation_id: int
    api_key: int
    api_version: int
    context: T


@dataclass(slots=True)
class CorrelationTracker(Generic[T]):
    """Requests sent upstream and still waiting for their response, oldest first."""

    _pending: deque[InFlight[T]] = field(default_factory=deque)

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, correlation_id: int, api_key: int, api_version: int, context: T) -> None:
        self._pending.append(InFlight(correlation_id, api_key, api_version, context))

    def match(self, correlation_id: int) -> InFlight[T]:
        """The request this response answers; it must be the oldest one in flight."""
        if not self._pending:
            raise CorrelationError(f"response with correlation id {correlation_id} but nothing in flight")
        head = self._pending[0]
        if head.correlation_id != correlation_id:
            raise CorrelationError(
                f"response with correlation id {correlation_id}, expected {head.correlation_id}"
            )
        return self._pending.popleft()

    def drain(self) -> list[InFlight[T]]:
        pending = list(self._pending)
        self._pending.clear()
        return pending
