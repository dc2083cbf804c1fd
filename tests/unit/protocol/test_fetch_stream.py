"""Cut-through of Fetch responses: where the held-back tail begins, and its same-length rewrite."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchResponse

from kqp.protocol.apis import API_SPECS, FETCH_KEY
from kqp.protocol.errors import ProtocolDecodeError
from kqp.protocol.fetch_stream import (
    FETCH_NODE_ENDPOINTS_SINCE,
    PADDING_TAG,
    FetchResponseStream,
    rewrite_fetch_tail,
)
from tests.unit.helpers.fast_path_strategies import PROPERTY_SETTINGS, fetch_responses

ENDPOINT_VERSIONS = range(FETCH_NODE_ENDPOINTS_SINCE, API_SPECS[FETCH_KEY].max_version + 1)


def to_proxy(node_id: int, host: str, port: int) -> tuple[str, int]:
    return "127.0.0.1", 9200 + node_id


def split(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(body), *(c % (len(body) + 1) for c in cuts)})
    return [body[a:b] for a, b in itertools.pairwise(points)]


def streamed(body: bytes, version: int, cuts: list[int]) -> tuple[bytes, bytes]:
    """(bytes forwarded at once, held-back tail) when the body arrives in the given pieces."""
    stream = FetchResponseStream(version)
    forwarded, held = bytearray(), bytearray()
    for piece in split(body, cuts):
        passed = stream.feed(piece)
        forwarded += piece[:passed]
        held += piece[passed:]
    return bytes(forwarded), bytes(held)


@pytest.mark.parametrize("version", ENDPOINT_VERSIONS)
@PROPERTY_SETTINGS
@given(data=st.data(), cuts=st.lists(st.integers(0, 1 << 20), max_size=12))
def test_only_the_top_level_tagged_fields_are_held_back(version: int, data: st.DataObject, cuts: list[int]) -> None:
    body, _ = data.draw(fetch_responses(version))
    forwarded, tail = streamed(body, version, cuts)
    assert forwarded + tail == body
    decoded = FetchResponse.decode(body, version=version)
    # The tail is exactly the tagged-field section: empty ({0}) or NodeEndpoints.
    assert tail == (b"\x00" if not decoded.node_endpoints else tail) and tail[0] in (0, 1)
    rewritten = FetchResponse.decode(forwarded + rewrite_fetch_tail(tail, to_proxy), version=version)
    assert len(forwarded) + len(rewrite_fetch_tail(tail, to_proxy)) == len(body)
    assert rewritten.responses == decoded.responses
    assert rewritten.throttle_time_ms == decoded.throttle_time_ms
    for endpoint in rewritten.node_endpoints:
        assert (endpoint.host, endpoint.port) == to_proxy(endpoint.node_id, "", 0)


@pytest.mark.parametrize("version", range(API_SPECS[FETCH_KEY].min_version, FETCH_NODE_ENDPOINTS_SINCE))
def test_versions_without_node_endpoints_stream_whole(version: int) -> None:
    stream = FetchResponseStream(version)
    assert stream.streams_whole and stream.feed(b"\x01" * 1_000) == 1_000 and not stream.in_tail


def response_with_endpoints(version: int, hosts: list[str]) -> bytes:
    endpoints = [FetchResponse.NodeEndpoint(node_id=i, host=h, port=9092, rack="r1") for i, h in enumerate(hosts)]
    message = FetchResponse[version](
        throttle_time_ms=5, error_code=0, session_id=7, responses=[], node_endpoints=endpoints
    )
    return bytes(message.encode())


@pytest.mark.parametrize(
    ("hosts", "kept"),
    [
        (["kafka-broker-1.prod.internal"], True),  # longer than 127.0.0.1: rewritten and padded
        (["a-host-of-just-right-len"], True),
        (["b1"], False),  # too short to hold the proxy's address: left out, the section padded
    ],
)
def test_node_endpoints_rewritten_to_the_same_length(hosts: list[str], kept: bool) -> None:
    version = ENDPOINT_VERSIONS[-1]
    body = response_with_endpoints(version, hosts)
    forwarded, tail = streamed(body, version, [3, 11])
    rewritten = forwarded + rewrite_fetch_tail(tail, to_proxy)
    assert len(rewritten) == len(body)
    decoded = FetchResponse.decode(rewritten, version=version)
    if kept:
        assert [(e.host, e.port, e.rack) for e in decoded.node_endpoints] == [("127.0.0.1", 9200, "r1")]
    else:
        assert decoded.node_endpoints == []
    # No broker address survives in the bytes either way.
    assert all(host.encode() not in rewritten for host in hosts)


def test_the_padding_uses_a_tag_no_fetch_response_defines() -> None:
    assert PADDING_TAG > 1000


def test_a_malformed_tail_is_refused() -> None:
    with pytest.raises(ProtocolDecodeError):
        rewrite_fetch_tail(b"\x01\x00\x09abc", to_proxy)
