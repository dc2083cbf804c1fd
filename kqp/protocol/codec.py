"""Full decode/encode of message bodies through kafka-python's schema-driven codec.

Only control-plane messages go through here (Metadata, FindCoordinator, ApiVersions, ...);
Produce and Fetch stay on the zero-copy fast path. kafka-python 3.0.12 cannot re-encode a
decoded message: `decode` bypasses `__init__`, so the `_header` slot is never set and
`encode` fails reading it. We set it to None after decoding.
"""

from __future__ import annotations

from typing import Any

from kqp.protocol.apis import API_SPECS
from kqp.protocol.errors import ProtocolDecodeError, UnsupportedApiError


def _message_class(api_key: int, is_request: bool) -> Any:
    spec = API_SPECS.get(api_key)
    if spec is None:
        raise UnsupportedApiError(f"unknown API key {api_key}")
    return spec.request_class if is_request else spec.response_class


def decode_body(api_key: int, api_version: int, body: bytes | memoryview, *, is_request: bool) -> Any:
    cls = _message_class(api_key, is_request)
    try:
        message = cls.decode(bytes(body), version=api_version)
    except Exception as exc:  # the codec raises struct/Value/Index errors on bad bytes
        kind = "request" if is_request else "response"
        raise ProtocolDecodeError(
            f"cannot decode {API_SPECS[api_key].name} v{api_version} {kind}: {exc!r}"
        ) from exc
    message._header = None
    return message


def encode_body(message: Any, api_version: int) -> bytes:
    return bytes(message.encode(version=api_version))


def build_response(api_key: int, api_version: int, **fields: Any) -> Any:
    """A new response message of the given version (fields by their snake_case names)."""
    cls = _message_class(api_key, is_request=False)
    return cls[api_version](**fields)
