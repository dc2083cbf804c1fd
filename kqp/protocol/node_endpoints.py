"""Whether a Produce, Fetch, ShareFetch or ShareAcknowledge response carries NodeEndpoints,
without decoding it.

In Produce and Fetch (KIP-951) NodeEndpoints is a top-level tagged field; in ShareFetch and
ShareAcknowledge (KIP-932) a plain array after the responses. A broker fills it only when it
tells the client about a new leader. A response without it goes to the client untouched,
so this check decides whether the costly decode-rewrite-encode of the rewriter runs at all.
"""

from __future__ import annotations

import struct

from kqp.protocol.apis import FETCH_KEY, PRODUCE_KEY, SHARE_ACKNOWLEDGE_KEY, SHARE_FETCH_KEY
from kqp.protocol.fast_path import fetch_response_tag_count, read_array_length
from kqp.protocol.headers import read_uvarint
from kqp.protocol.throttle_field import field_location, throttle_field_offset


def may_carry_node_endpoints(
    api_key: int, api_version: int, frame: bytes, body_offset: int, produce_throttle_offset: int | None = None
) -> bool:
    """False when the response certainly has no NodeEndpoints; raises ProtocolError on bad bytes.
    `produce_throttle_offset`: where a Produce response's ThrottleTimeMs is, if already known."""
    if api_key == PRODUCE_KEY:
        # Produce v10+: [Responses] ThrottleTimeMs <tagged fields>; any top-level tag may be one.
        offset = produce_throttle_offset
        if offset is None:
            offset = throttle_field_offset(frame, body_offset, api_key, api_version)
        if offset is None:
            return True
        tag_count, _ = read_uvarint(frame, offset + 4)
        return tag_count > 0
    if api_key == FETCH_KEY:
        return fetch_response_tag_count(memoryview(frame)[body_offset:], api_version) > 0
    if api_key in (SHARE_FETCH_KEY, SHARE_ACKNOWLEDGE_KEY):
        location = field_location(api_key, api_version, "NodeEndpoints")
        if location is None:
            return True
        try:
            offset = body_offset + location if isinstance(location, int) else location(frame, body_offset)
            count, _ = read_array_length(frame, offset, True)
        except (struct.error, IndexError, ValueError):
            return True  # the full decode then reports what is wrong with it
        return count > 0
    return True
