"""Rewriting every broker address a response carries, so clients stay on the proxy.

A Kafka client learns broker addresses from Metadata, FindCoordinator, DescribeCluster
and, since KIP-951, from the NodeEndpoints of Produce and Fetch responses that report a
leader change. If any of them reaches the client unrewritten, the client connects to the
broker directly and leaves the proxy. The rewrite is a callback so the proxy can open a
listener for a broker it has not seen before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kqp.protocol.apis import (
    API_SPECS,
    API_VERSIONS_KEY,
    DESCRIBE_CLUSTER_KEY,
    FETCH_KEY,
    FIND_COORDINATOR_KEY,
    METADATA_KEY,
    PRODUCE_KEY,
)
from kqp.protocol.codec import decode_body, encode_body

# (node_id, upstream host, upstream port) -> (advertised host, advertised port)
AddressMapper = Callable[[int, str, int], tuple[str, int]]

# API keys whose responses always carry broker addresses.
ADDRESS_BEARING_APIS = frozenset({METADATA_KEY, FIND_COORDINATOR_KEY, DESCRIBE_CLUSTER_KEY})
# First versions whose responses may carry KIP-951 NodeEndpoints.
NODE_ENDPOINT_VERSIONS = {PRODUCE_KEY: 10, FETCH_KEY: 16}
_DESCRIBE_CLUSTER_CONTROLLERS = 2


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
        # Controllers (KIP-919 endpoint type 2) are not proxied: the proxy fronts brokers.
        if getattr(message, "endpoint_type", 1) == _DESCRIBE_CLUSTER_CONTROLLERS:
            return False
        _rewrite_nodes(message.brokers, "broker_id", mapper)
        return bool(message.brokers)
    if api_key in NODE_ENDPOINT_VERSIONS and api_version >= NODE_ENDPOINT_VERSIONS[api_key]:
        endpoints = getattr(message, "node_endpoints", None) or []
        _rewrite_nodes(endpoints, "node_id", mapper)
        return bool(endpoints)
    return False


def rewrite_response_body(
    api_key: int, api_version: int, body: bytes | memoryview, mapper: AddressMapper
) -> bytes | None:
    """Decode, rewrite and re-encode a response body; None when nothing needed changing."""
    message = decode_body(api_key, api_version, body, is_request=False)
    if not rewrite_addresses(message, api_key, api_version, mapper):
        return None
    return encode_body(message, api_version)


def intersect_api_versions(message: Any) -> None:
    """Limit an ApiVersions response to the APIs and versions the proxy can decode.

    API keys the proxy does not know are removed, so a client never negotiates something
    the proxy cannot read. The broker's minimum is kept as it is: Kafka advertises Produce
    from v0 although it rejects v0-2, to keep old librdkafka versions working.
    """
    kept = []
    for entry in message.api_keys:
        spec = API_SPECS.get(entry.api_key)
        if spec is None:
            continue
        max_version = min(entry.max_version, spec.max_version)
        if entry.min_version > max_version:
            continue
        entry.max_version = max_version
        kept.append(entry)
    message.api_keys = kept


def proxy_api_versions_body(api_version: int, body: bytes | memoryview) -> bytes:
    """An upstream ApiVersions response body, intersected with what the proxy decodes."""
    # A non-zero error means the broker answered with a v0 body whatever the request
    # version (UNSUPPORTED_VERSION); decode it as v0.
    error_code = int.from_bytes(body[0:2], "big", signed=True) if len(body) >= 2 else 0
    version = 0 if error_code else api_version
    message = decode_body(API_VERSIONS_KEY, version, body, is_request=False)
    intersect_api_versions(message)
    return encode_body(message, version)
