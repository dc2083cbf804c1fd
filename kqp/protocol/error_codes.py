"""Every error code in a response, for the metrics (Kafka's ErrorsPerSec counts each one).

A full decode through the codec costs hundreds of microseconds for a small response, and
most small responses repeat byte for byte (a Heartbeat's "no error", a cluster's ApiVersions
answer, an OffsetCommit of the same partitions): bodies up to `MEMO_MAX_BODY_BYTES` are
memoized, so a repeated response costs a hash and a dict lookup. Larger ones (Metadata,
OffsetFetch of many partitions) still get the full decode; Produce/Fetch never come here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from kqp.protocol.codec import decode_body

MEMO_MAX_BODY_BYTES = 2048
_MEMO_ENTRIES = 1024


def collect_error_codes(value: Any, found: list[int]) -> None:
    """Every non-zero `error_code` in a decoded message's dict form, top level first."""
    if isinstance(value, dict):
        code = value.get("error_code")
        if isinstance(code, int) and code:
            found.append(code)
        for item in value.values():
            if isinstance(item, (dict, list)):
                collect_error_codes(item, found)
    elif isinstance(value, list):
        for item in value:
            collect_error_codes(item, found)


def _decoded_error_codes(api_key: int, api_version: int, body: bytes | memoryview) -> tuple[int, ...]:
    found: list[int] = []
    collect_error_codes(decode_body(api_key, api_version, body, is_request=False).to_dict(), found)
    return tuple(found)


_memoized_error_codes = lru_cache(maxsize=_MEMO_ENTRIES)(_decoded_error_codes)


def response_error_codes(api_key: int, api_version: int, body: bytes | memoryview) -> tuple[int, ...]:
    """The non-zero error codes of a response body, top level first (raises ProtocolError)."""
    if len(body) <= MEMO_MAX_BODY_BYTES:
        return _memoized_error_codes(api_key, api_version, bytes(body))
    return _decoded_error_codes(api_key, api_version, body)
