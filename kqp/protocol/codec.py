"""Full decode/encode of message bodies through the codec generated from Kafka's definitions.

The classes and their per-version decoders and encoders are in kqp.protocol.generated
(harness/kafka_codegen.py writes them from kqp/protocol/kafka_message_definitions). Decoded
messages keep the tagged fields the definitions do not know (`unknown_tags`) and write them back
when re-encoded, so a rewritten response loses nothing a newer broker added. Only what the proxy
reads goes through here; Produce and Fetch stay on the zero-copy fast path.
"""

from __future__ import annotations

from typing import Any

from kqp.protocol.apis import API_SPECS, supported_spec
from kqp.protocol.errors import ProtocolDecodeError
from kqp.protocol.wire import Message


def _message_class(api_key: int, api_version: int, is_request: bool) -> Any:
    spec = supported_spec(api_key, api_version)
    return spec.request_class if is_request else spec.response_class


def decode_body_exactly(
    api_key: int, api_version: int, body: bytes | memoryview, *, is_request: bool
) -> tuple[Any, int]:
    """Decode a body; returns the message and how many bytes of the body it used."""
    decode = _message_class(api_key, api_version, is_request).DECODERS[api_version]
    try:
        message, used = decode(body, 0)
    except Exception as exc:  # struct/Index/Unicode errors and ProtocolDecodeError on bad bytes
        kind = "request" if is_request else "response"
        raise ProtocolDecodeError(
            f"cannot decode {API_SPECS[api_key].name} v{api_version} {kind}: {exc!r}"
        ) from exc
    return message, used


def decode_body(api_key: int, api_version: int, body: bytes | memoryview, *, is_request: bool) -> Any:
    return decode_body_exactly(api_key, api_version, body, is_request=is_request)[0]


def encode_body(message: Message, api_version: int) -> bytes:
    return message.encode(api_version)


def build_response(api_key: int, api_version: int, **fields: Any) -> Any:
    """A new response message of the given version (fields by their snake_case names)."""
    cls = _message_class(api_key, api_version, is_request=False)
    return cls(**fields)
