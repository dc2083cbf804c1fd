"""Rewriting every broker address a response carries, so clients stay on the proxy.

A Kafka client learns broker addresses from Metadata, FindCoordinator, DescribeCluster,
the NodeEndpoints of Produce and Fetch (KIP-951) and of ShareFetch and ShareAcknowledge
(KIP-932), and DescribeQuorum's node listeners. If any of them reaches the client
unrewritten, the client connects to the broker directly and leaves the proxy. The rewrite
is a callback so the proxy can open a listener for a broker it has not seen before.
Controller addresses (DescribeCluster for controllers, DescribeQuorum's listeners) are left
out instead: the proxy fronts brokers only.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from kqp.protocol.apis import (
    API_SPECS,
    API_VERSIONS_KEY,
    DECODED_APIS,
    DESCRIBE_CLUSTER_KEY,
    DESCRIBE_QUORUM_KEY,
    FETCH_KEY,
    FIND_COORDINATOR_KEY,
    METADATA_KEY,
    PRODUCE_KEY,
    SHARE_ACKNOWLEDGE_KEY,
    SHARE_FETCH_KEY,
    can_decode,
)
from kqp.protocol.codec import decode_body, decode_body_exactly, encode_body
from kqp.protocol.errors import ProtocolDecodeError, ProtocolError
from kqp.protocol.node_endpoints import may_carry_node_endpoints

# (node_id, upstream host, upstream port) -> (advertised host, advertised port)
AddressMapper = Callable[[int, str, int], tuple[str, int]]

# API keys whose responses always carry broker addresses.
ADDRESS_BEARING_APIS = frozenset({METADATA_KEY, FIND_COORDINATOR_KEY, DESCRIBE_CLUSTER_KEY, DESCRIBE_QUORUM_KEY})
# First versions whose responses may carry NodeEndpoints.
NODE_ENDPOINT_VERSIONS: dict[int, int] = {PRODUCE_KEY: 10, FETCH_KEY: 16, SHARE_FETCH_KEY: 0, SHARE_ACKNOWLEDGE_KEY: 0}
_PRODUCE_NODE_ENDPOINTS = NODE_ENDPOINT_VERSIONS[PRODUCE_KEY]
_DESCRIBE_CLUSTER_CONTROLLERS = 2


def carries_addresses(api_key: int, api_version: int) -> bool:
    """Whether responses of this API version may hold broker addresses."""
    if api_key in ADDRESS_BEARING_APIS:
        return True
    first = NODE_ENDPOINT_VERSIONS.get(api_key)
    return first is not None and api_version >= first


def _rewrite_nodes(nodes: Any, id_field: str, mapper: AddressMapper) -> None:
    for node in nodes:
        node.host, node.port = mapper(getattr(node, id_field), node.host, node.port)


def rewrite_addresses(message: Any, api_key: int, api_version: int, mapper: AddressMapper) -> bool:
    """Rewrite a decoded response in place; True when anything was changed."""
    if api_key == METADATA_KEY:
        _rewrite_nodes(message.brokers, "node_id", mapper)
        return bool(message.brokers)
    if api_key == FIND_COORDINATOR_KEY:
        if api_version >= 4:
            # Entries with an error carry node -1 and an empty host; leave them as they are.
            live = [c for c in message.coordinators if c.error_code == 0]
            _rewrite_nodes(live, "node_id", mapper)
            return bool(live)
        if message.error_code == 0:
            message.host, message.port = mapper(message.node_id, message.host, message.port)
            return True
        return False
    if api_key == DESCRIBE_CLUSTER_KEY:
        if getattr(message, "endpoint_type", 1) == _DESCRIBE_CLUSTER_CONTROLLERS:
            # KIP-919 controller endpoints: not proxied, so not passed on (a broker answers
            # this with UNSUPPORTED_ENDPOINT_TYPE and no nodes anyway).
            had = bool(message.brokers)
            message.brokers = []
            return had
        _rewrite_nodes(message.brokers, "broker_id", mapper)
        return bool(message.brokers)
    if api_key == DESCRIBE_QUORUM_KEY:
        # v2+: the controllers' listeners (KIP-853). Left out: the proxy fronts brokers only.
        nodes = getattr(message, "nodes", None) or []
        changed = False
        for node in nodes:
            if node.listeners:
                node.listeners = []
                changed = True
        return changed
    if carries_addresses(api_key, api_version):
        endpoints = getattr(message, "node_endpoints", None) or []
        _rewrite_nodes(endpoints, "node_id", mapper)
        return bool(endpoints)
    return False


def rewrite_response_body(
    api_key: int, api_version: int, body: bytes | memoryview, mapper: AddressMapper,
    on_decoded: Callable[[Any], None] | None = None,
) -> bytes | None:
    """Decode, rewrite and re-encode a response body; None when nothing needed changing.
    `on_decoded` sees the decoded message first (the proxy learns topic ids from Metadata)."""
    message = decode_body(api_key, api_version, body, is_request=False)
    if on_decoded is not None:
        on_decoded(message)
    if not rewrite_addresses(message, api_key, api_version, mapper):
        return None
    return encode_body(message, api_version)


def client_response(
    api_key: int, api_version: int, frame: bytes, body_offset: int, mapper: AddressMapper,
    on_metadata: Callable[[Any], None] | None = None, *, produce_throttle_offset: int | None = None,
) -> tuple[bytes, bool]:
    """A broker's whole response frame as the client must get it: ApiVersions with the
    proxy's caps, every broker address rewritten. Returns the frame (the same object when
    nothing changed) and whether KIP-951 NodeEndpoints in it were rewritten.
    `produce_throttle_offset` saves a second walk over a Produce response when the caller
    already found its ThrottleTimeMs."""
    if api_key == PRODUCE_KEY and produce_throttle_offset is not None:
        # Every Produce response comes here. Before v10 none carries addresses; after, only
        # one with a top-level tag after ThrottleTimeMs may (NodeEndpoints): the byte after
        # the field is the tag count, and a one-byte 0 is the usual empty section.
        tags = produce_throttle_offset + 4
        if api_version < _PRODUCE_NODE_ENDPOINTS or (tags < len(frame) and frame[tags] == 0):
            return frame, False
    body = memoryview(frame)[body_offset:]
    rewritten: bytes | None = None
    if api_key == API_VERSIONS_KEY:
        rewritten = proxy_api_versions_body(api_version, body)
    elif carries_addresses(api_key, api_version) and (
        api_key not in NODE_ENDPOINT_VERSIONS
        or _may_carry_node_endpoints(api_key, api_version, frame, body_offset, produce_throttle_offset)
    ):
        rewritten = rewrite_response_body(api_key, api_version, body, mapper,
                                          on_metadata if api_key == METADATA_KEY else None)
    if rewritten is None:
        return frame, False
    return frame[:body_offset] + rewritten, api_key in NODE_ENDPOINT_VERSIONS


def _may_carry_node_endpoints(
    api_key: int, api_version: int, frame: bytes, body_offset: int, throttle_offset: int | None
) -> bool:
    """Whether a Produce/Fetch/ShareFetch/ShareAcknowledge response needs the full decode."""
    try:
        return may_carry_node_endpoints(api_key, api_version, frame, body_offset, throttle_offset)
    except ProtocolError:
        return True  # the full decode then reports what is wrong with it


def cap_api_versions(message: Any) -> bool:
    """Cap the APIs the proxy must decode to the versions its definitions describe.

    Everything else is left exactly as the broker advertised it (forward by default): the
    proxy passes those requests on as opaque bytes. The broker's minimum is kept as it is:
    Kafka advertises Produce from v0 although it rejects v0-2, to keep old librdkafka
    versions working. Returns whether anything changed.
    """
    kept = []
    changed = False
    for entry in message.api_keys:
        if entry.api_key not in DECODED_APIS:
            kept.append(entry)
            continue
        max_version = min(entry.max_version, API_SPECS[entry.api_key].max_version)
        if entry.min_version > max_version:
            changed = True
            continue
        if max_version != entry.max_version:
            entry.max_version = max_version
            changed = True
        kept.append(entry)
    message.api_keys = kept
    return changed


def decode_api_versions(api_version: int, body: bytes | memoryview) -> tuple[Any, int]:
    """An ApiVersions response body, read as Kafka's client reads it: in the request's
    version first, then as v0 (a broker answers a version it does not support with a v0
    body; other errors, e.g. INVALID_REQUEST, come in the request's version)."""
    first: tuple[Any, int] | None = None
    if api_version != 0 and can_decode(API_VERSIONS_KEY, api_version):
        try:
            message, used = decode_body_exactly(API_VERSIONS_KEY, api_version, body, is_request=False)
        except ProtocolDecodeError:
            pass
        else:
            if used == len(body):
                return message, api_version
            first = (message, api_version)
    try:
        return decode_body(API_VERSIONS_KEY, 0, body, is_request=False), 0
    except ProtocolDecodeError:
        if first is not None:
            return first
        raise


def proxy_api_versions_body(api_version: int, body: bytes | memoryview) -> bytes | None:
    """An upstream ApiVersions response body with the proxy's caps applied; None when the
    broker's bytes can go to the client unchanged."""
    return _capped_api_versions(api_version, bytes(body))


# A cluster answers ApiVersions with the same bytes every time, and every client connection
# asks: decode and check each distinct answer once (a decode costs 100-400 us).
@lru_cache(maxsize=64)
def _capped_api_versions(api_version: int, body: bytes) -> bytes | None:
    message, version = decode_api_versions(api_version, body)
    if not cap_api_versions(message):
        return None
    return encode_body(message, version)
