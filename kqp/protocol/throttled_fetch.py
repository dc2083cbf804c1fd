"""The empty Fetch response a throttled consumer gets, as Kafka's broker writes it.

When a consumer's fetch is throttled (its byte rate or its request quota), KafkaApis does not
send the data it read: it sends `FetchContext.getThrottledResponse(throttleTimeMs)`, a
response with ThrottleTimeMs and no partitions, so the consumer asks for the same offsets
again once the throttle has passed. The proxy learns of the throttle only when the broker's
response (data and all) is in its hands; it then sends this answer in the data's place, built
from the head of the broker's response: the response header (correlation id, tagged fields)
as the broker wrote it, then the ErrorCode and SessionId (v7+) Kafka's context would give.

Which session id, by the request's fetch context (core/.../server/FetchSession.scala,
checked at apache/kafka 1eb7644, 4.0.0-SNAPSHOT):

* A full fetch (SessionEpoch 0, FullFetchContext) or a sessionless one (SessionEpoch -1 and
  every version before v7, SessionlessFetchContext): FetchContext's default answer, error
  NONE and INVALID_SESSION_ID (0). A throttled full fetch never reaches
  `updateAndGenerateResponseData`, where a FullFetchContext creates its session, so the
  client gets no session and asks for a full fetch again. The broker behind the proxy did
  create one (it answered in full); the client never learns its id and the broker's session
  cache evicts it as it evicts any unused session.
* An incremental fetch (SessionEpoch above 0, IncrementalFetchContext): the session's id,
  with error NONE or INVALID_FETCH_SESSION_EPOCH as the broker found the epoch; both are in
  the broker's response as it wrote them, so they are copied. If the broker found no such
  session or the wrong epoch before handling (SessionErrorContext, whose response has
  session id 0), Kafka's throttled answer is the default one again: NONE and 0.

Layouts (FetchResponse.json, v4-v18): ThrottleTimeMs int32; ErrorCode int16 and SessionId
int32 from v7; Responses, an int32-counted array before v12, a compact array (length + 1 as
an unsigned varint) from v12 on, where the body ends with its tagged fields. None here: Kafka
4.3.1 also passes the NodeEndpoints of leaders it found for partitions in error (v16+), but
without those partitions a client has no use for them (docs/quotas.md).
"""

from __future__ import annotations

import struct

from kqp.protocol.api_keys import ApiKey
from kqp.protocol.apis import API_SPECS
from kqp.protocol.errors import ProtocolDecodeError

Buffer = bytes | bytearray | memoryview

# First Fetch version with ErrorCode and SessionId (KIP-227). Which versions are flexible
# (KIP-482) the generated API table says (`ApiSpec.is_flexible`).
FETCH_SESSION_SINCE = 7
_FETCH = API_SPECS[ApiKey.FETCH]

_INT32 = struct.Struct(">i")
_ERROR_AND_SESSION = struct.Struct(">hi")
# FetchContext's default throttled answer: Errors.NONE and FetchMetadata.INVALID_SESSION_ID.
_NO_SESSION = _ERROR_AND_SESSION.pack(0, 0)
# An empty Responses array: int32 0, or a compact array's length + 1 (= 1), then no tagged fields.
_EMPTY_RESPONSES = _INT32.pack(0)
_EMPTY_RESPONSES_FLEXIBLE = b"\x01\x00"


def throttled_fetch_response(
    head: Buffer, body_offset: int, api_version: int, throttle_ms: int, session_epoch: int = -1
) -> bytes:
    """A Fetch response frame (no size prefix) with no partitions and `throttle_ms` in
    ThrottleTimeMs, carrying the response header of `head`, the broker's response (whole, or at
    least its header and first 10 body bytes), and the ErrorCode and SessionId Kafka gives the
    request's fetch context: `session_epoch` is the request's SessionEpoch (-1 before v7); see
    the module docstring.

    Raises ProtocolDecodeError when `head` is too short to hold them.
    """
    needed = body_offset + (4 + _ERROR_AND_SESSION.size if api_version >= FETCH_SESSION_SINCE else 4)
    if len(head) < needed:
        raise ProtocolDecodeError(f"Fetch response of {len(head)} bytes ends before its session id")
    out = bytearray(head[:body_offset])
    out += _INT32.pack(throttle_ms)
    if api_version >= FETCH_SESSION_SINCE:
        error_and_session = head[body_offset + 4 : needed]
        _error, session_id = _ERROR_AND_SESSION.unpack(error_and_session)
        # Only an incremental fetch of a session the broker found keeps that session's id.
        out += error_and_session if session_epoch > 0 and session_id != 0 else _NO_SESSION
    out += _EMPTY_RESPONSES_FLEXIBLE if _FETCH.is_flexible(api_version) else _EMPTY_RESPONSES
    return bytes(out)
