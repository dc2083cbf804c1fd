"""Request and response headers, read without decoding the body.

Request header v1 is (api_key int16, api_version int16, correlation_id int32, client_id
nullable string); v2 adds tagged fields. Flexible API versions use v2. Note that client_id
stays a classic int16-length string even in v2: Kafka kept it that way so any broker can
read the header of any request. Response header v0 is the correlation id; v1 adds tagged
fields, except for ApiVersions, which always answers with v0.
"""

from __future__ import annotations

import struct
from functools import cache

from kqp.protocol.apis import API_SPECS, API_VERSIONS_KEY
from kqp.protocol.errors import ProtocolDecodeError

# Re-exported: the varint and tagged-field rules are kqp.protocol.wire's, shared with the codec.
from kqp.protocol.wire import encode_uvarint as encode_uvarint
from kqp.protocol.wire import read_uvarint as read_uvarint
from kqp.protocol.wire import skip_tagged_fields as skip_tagged_fields

_HEADER_FIXED = struct.Struct(">hhih")
_INT32 = struct.Struct(">i")


class RequestHeader:
    """A request header as read: built for every request, so a plain class with its own
    `__init__` (compiled, kqp/compiled_modules.py, a native class, made and read without the
    interpreter; a named tuple's constructor stays interpreted, a frozen dataclass's too)."""

    __slots__ = ("api_key", "api_version", "body_offset", "client_id", "correlation_id", "known")

    def __init__(self, api_key: int, api_version: int, correlation_id: int, client_id: str | None, body_offset: int,
                 known: bool = True) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.client_id = client_id
        # Where the body starts in the frame. For an API version the codec has no definition of,
        # the header's tagged fields (if any) are left unread: such requests are only forwarded.
        self.body_offset = body_offset
        # Whether the bundled definitions describe this API version (so the body can be decoded).
        self.known = known

    def __repr__(self) -> str:
        return (f"RequestHeader(api_key={self.api_key}, api_version={self.api_version}, "
                f"correlation_id={self.correlation_id}, client_id={self.client_id!r}, "
                f"body_offset={self.body_offset}, known={self.known})")


def request_is_flexible(api_key: int, api_version: int) -> bool | None:
    """Whether the request uses header v2; None when the definitions cannot tell."""
    spec = API_SPECS.get(api_key)
    if spec is None:
        return None
    if spec.supports(api_version):
        return spec.is_flexible(api_version)
    if api_version > spec.max_version and spec.first_flexible is not None:
        # Flexible versions are open-ended ("N+"): a newer version is flexible too. A client
        # probing a newer ApiVersions relies on this.
        return True
    return None


@cache
def _header_layout(api_key: int, api_version: int) -> tuple[bool, bool]:
    """(whether the definitions describe this version, whether its header has tagged fields
    the proxy reads past)."""
    spec = API_SPECS.get(api_key)
    known = spec is not None and spec.supports(api_version)
    flexible = request_is_flexible(api_key, api_version)
    return known, bool(flexible and (known or api_key == API_VERSIONS_KEY))


# Client ids repeat on every request of a connection; decoding each anew costs more than the
# rest of the header. Bounded, so a client inventing ids cannot grow it without limit.
_CLIENT_ID_MEMO_ENTRIES = 4096
_client_ids: dict[bytes, str] = {}


def _client_id(raw: bytes) -> str:
    client_id = _client_ids.get(raw)
    if client_id is None:
        # A broker decodes the client id leniently too; it is only a label here.
        client_id = raw.decode("utf-8", errors="replace")
        if len(_client_ids) >= _CLIENT_ID_MEMO_ENTRIES:
            _client_ids.clear()
        _client_ids[raw] = client_id
    return client_id


def parse_request_header(frame: bytes | memoryview) -> RequestHeader:
    """Parse the header of a request frame (size prefix already removed).

    Any API key and version is accepted: api_key, api_version, correlation_id and client_id
    sit at the same place in every request header, so a request the definitions do not
    describe can still be tracked and forwarded.
    """
    if len(frame) < _HEADER_FIXED.size:
        raise ProtocolDecodeError(f"request header needs {_HEADER_FIXED.size} bytes, frame has {len(frame)}")
    api_key, api_version, correlation_id, client_id_length = _HEADER_FIXED.unpack_from(frame, 0)
    offset = _HEADER_FIXED.size
    client_id: str | None = None
    if client_id_length >= 0:
        end = offset + client_id_length
        if end > len(frame):
            raise ProtocolDecodeError("client id runs past the end of the frame")
        client_id = _client_id(bytes(frame[offset:end]))
        offset = end
    elif client_id_length != -1:
        raise ProtocolDecodeError(f"invalid client id length {client_id_length}")
    known, has_tags = _header_layout(api_key, api_version)
    if has_tags:
        # The usual empty section, checked inline: every flexible request has one.
        offset = offset + 1 if offset < len(frame) and frame[offset] == 0 else skip_tagged_fields(frame, offset)
    return RequestHeader(api_key, api_version, correlation_id, client_id, offset, known)


# Asked for every response; the answer depends on the two numbers only.
@cache
def response_header_flexible(api_key: int, api_version: int) -> bool | None:
    """Whether the response header has a tagged-field section; None when unknown."""
    if api_key == API_VERSIONS_KEY:
        return False
    spec = API_SPECS.get(api_key)
    if spec is None or not spec.supports(api_version):
        return None
    return spec.response_header_version(api_version) == 1


def response_body_offset(frame: bytes | memoryview, api_key: int, api_version: int) -> int:
    """Where the body of a response frame starts (after correlation id and header tags).

    For an API version the definitions do not describe this is 4, right after the
    correlation id: such responses are forwarded as they are and never decoded.
    """
    if len(frame) < 4:
        raise ProtocolDecodeError("response shorter than its correlation id")
    if response_header_flexible(api_key, api_version):
        # The usual empty section inline, as in parse_request_header.
        return 5 if len(frame) > 4 and frame[4] == 0 else skip_tagged_fields(frame, 4)
    return 4


def response_correlation_id(frame: bytes | memoryview) -> int:
    if len(frame) < 4:
        raise ProtocolDecodeError("response shorter than its correlation id")
    correlation_id: int = _INT32.unpack_from(frame, 0)[0]
    return correlation_id


def encode_request_header(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None
) -> bytes:
    encoded_id = b"" if client_id is None else client_id.encode("utf-8")
    id_length = -1 if client_id is None else len(encoded_id)
    header = _HEADER_FIXED.pack(api_key, api_version, correlation_id, id_length)
    header += encoded_id
    if request_is_flexible(api_key, api_version):
        header += b"\x00"
    return header


def encode_response_header(api_key: int, api_version: int, correlation_id: int) -> bytes:
    header = correlation_id.to_bytes(4, "big", signed=True)
    if response_header_flexible(api_key, api_version):
        header += b"\x00"
    return header
