"""Whether a Produce or Fetch response carries KIP-951 NodeEndpoints, without decoding it.

NodeEndpoints is a top-level tagged field; a broker adds it only when it tells the client
about a new leader. A response without top-level tagged fields goes to the client untouched,
so this check decides whether the costly decode-rewrite-encode of the rewriter runs at all.
"""

from __future__ import annotations

from kqp.protocol.apis import FETCH_KEY, PRODUCE_KEY
from kqp.protocol.fast_path import parse_fetch_response
from kqp.protocol.headers import read_uvarint
from kqp.protocol.throttle_field import throttle_field_offset


def may_carry_node_endpoints(api_key: int, api_version: int, frame: bytes, body_offset: int) -> bool:
    """False when the response certainly has no NodeEndpoints; raises ProtocolError on bad bytes."""
    if api_key == PRODUCE_KEY:
        # Produce v10+: [Responses] ThrottleTimeMs <tagged fields>; any top-level tag may be one.
        offset = throttle_field_offset(frame, body_offset, api_key, api_version)
        if offset is None:
            return True
        tag_count, _ = read_uvarint(frame, offset + 4)
        return tag_count > 0
    if api_key == FETCH_KEY:
        return parse_fetch_response(memoryview(frame)[body_offset:], api_version).tagged_fields > 0
    return True
