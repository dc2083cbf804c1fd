"""Full decode/encode of message bodies through kafka-python's schema-driven codec.

The classes are compiled from Kafka's own definitions (kqp.protocol.apis), with tagged-field
sections that keep unknown tags (kqp.protocol.tagged_fields). Only what the proxy reads goes
through here; Produce and Fetch stay on the zero-copy fast path. kafka-python 3.0.12 cannot
re-encode a decoded message: `decode` bypasses `__init__`, so the `_header` slot is never
set and `encode` fails reading it. We set it to None after decoding.
"""

from __future__ import annotations

from typing import Any

from kqp.protocol.apis import API_SPECS, supported_spec
from kqp.protocol.errors import ProtocolDecodeError


def _message_class(api_key: int, api_version: int, is_request: bool) -> Any:
    spec = supported_spec(api_key, api_version)
    return spec.request_class if is_request else spec.response_class


def decode_body_exactly(
    api_key: int, api_version: int, body: bytes | memoryview, *, is_request: bool
) -> tuple[Any, int]:
    """Decode a body; returns the message and how many bytes of the body it used."""
    cls = _message_class(api_key, api_version, is_request)
    flexible = cls.flexible_version_q(api_version)
    try:
        decode = cls._struct.compiled_decode_from(api_version, compact=flexible, tagged=flexible, data_class=cls)
        message, used = decode(memoryview(bytes(body)), 0)
    except Exception as exc:  # the codec raises struct/Value/Index errors on bad bytes
        kind = "request" if is_request else "response"
        raise ProtocolDecodeError(
            f"cannot decode {API_SPECS[api_key].name} v{api_version} {kind}: {exc!r}"
        ) from exc
    message._header = None
    message._version = api_version
    return message, int(used)


def decode_body(api_key: int, api_version: int, body: bytes | memoryview, *, is_request: bool) -> Any:
    return decode_body_exactly(api_key, api_version, body, is_request=is_request)[0]


def encode_body(message: Any, api_version: int) -> bytes:
    return bytes(message.encode(version=api_version))


def build_response(api_key: int, api_version: int, **fields: Any) -> Any:
    """A new response message of the given version (fields by their snake_case names)."""
    cls = _message_class(api_key, api_version, is_request=False)
    return cls[api_version](**fields)
