"""Every error code in a response, for the metrics (Kafka's ErrorsPerSec counts each one).

The body is not decoded: for each (API, version) a collector generated from Kafka's JSON
definitions (kqp.protocol.generated.walks, by harness/kafka_codegen.py) skips every field by its
wire layout and reads only the int16 fields named ErrorCode, at any depth, in straight-line
code. The codes come out in the order the full decode's dict form gives them
(`decoded_error_codes`, kept as a reference the tests hold the scan to): a struct's own code
first, then those nested in it, depth first.

Most small responses repeat byte for byte (a Heartbeat's "no error", a cluster's
ApiVersions answer, an OffsetCommit of the same partitions): bodies up to
`MEMO_MAX_BODY_BYTES` are memoized, so a repeated one costs a hash and a dict lookup,
less than walking it. Produce/Fetch never come here.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from kqp.protocol.apis import API_SPECS, ERROR_CODES, response_layout_version, supported_spec
from kqp.protocol.codec import decode_body
from kqp.protocol.errors import ProtocolDecodeError
from kqp.protocol.wire import SHORT_READ

# (buffer, offset, found) -> offset after the body; or the size of a body without codes.
Collector = Callable[[bytes | memoryview, int, list[int]], int] | int

MEMO_MAX_BODY_BYTES = 2048
_MEMO_ENTRIES = 1024


def error_code_walker(api_key: int, api_version: int) -> Collector:
    """The generated walk of a response body of this version (raises UnsupportedApiError)."""
    supported_spec(api_key, api_version)
    collector: Collector = ERROR_CODES[api_key][api_version]
    return collector


def scan_error_codes(api_key: int, api_version: int, body: bytes | memoryview) -> tuple[int, ...]:
    """The non-zero error codes of a response body, walked without decoding (raises ProtocolError)."""
    walker = error_code_walker(api_key, response_layout_version(api_key, api_version, body, 0))
    found: list[int] = []
    try:
        end = walker if isinstance(walker, int) else walker(body, 0, found)
    except SHORT_READ as exc:
        raise ProtocolDecodeError(f"truncated {API_SPECS[api_key].name} v{api_version} response: {exc!r}") from exc
    # Fixed-size fields are skipped without reading them: a cut inside the last ones shows here.
    if end > len(body):
        raise ProtocolDecodeError(
            f"{API_SPECS[api_key].name} v{api_version} response needs {end} bytes, has {len(body)}")
    return tuple(found)


_memoized_error_codes = lru_cache(maxsize=_MEMO_ENTRIES)(scan_error_codes)


def response_error_codes(api_key: int, api_version: int, body: bytes | memoryview) -> tuple[int, ...]:
    """The non-zero error codes of a response body, top level first (raises ProtocolError)."""
    if len(body) <= MEMO_MAX_BODY_BYTES:
        return _memoized_error_codes(api_key, api_version, bytes(body))
    return scan_error_codes(api_key, api_version, body)


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


def decoded_error_codes(api_key: int, api_version: int, body: bytes | memoryview) -> tuple[int, ...]:
    """The same codes read through a full decode: the reference for tests and bench/error_codes.py,
    tens of times slower than the scan, never called by the proxy."""
    found: list[int] = []
    collect_error_codes(decode_body(api_key, api_version, body, is_request=False).to_dict(), found)
    return tuple(found)
