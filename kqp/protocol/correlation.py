"""Which requests get a response.

Kafka answers requests on a connection strictly in order, and responses do not carry their
API key, so the only way to read a response is to remember what was asked (the session,
kqp.protocol.session, does). Produce with acks=0 gets no response at all and must not be
remembered, or every later response would be matched to the wrong request.
"""

from __future__ import annotations

import struct

from kqp.protocol.apis import PRODUCE_KEY
from kqp.protocol.errors import ProtocolDecodeError
from kqp.protocol.headers import read_uvarint

_INT16 = struct.Struct(">h")


def produce_acks(body: bytes | memoryview, api_version: int) -> int:
    """The acks field of a Produce request body (after transactional_id)."""
    if api_version >= 9:
        # The usual one-byte varint inline: read_uvarint is interpreted (kqp.protocol.wire is
        # not compiled), and this runs for every Produce request.
        if len(body) > 0 and body[0] < 0x80:
            length_plus_one, offset = body[0], 1
        else:
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
