"""Control-plane codec (kafka-python's schema-driven one) and broker-address rewriting."""

from __future__ import annotations

import pytest
from kafka.protocol.admin import DescribeClusterResponse
from kafka.protocol.metadata import ApiVersionsResponse, FindCoordinatorResponse, MetadataResponse

from kqp.protocol.address_rewrite import proxy_api_versions_body, rewrite_response_body
from kqp.protocol.apis import (
    API_SPECS,
    API_VERSIONS_KEY,
    DESCRIBE_CLUSTER_KEY,
    FIND_COORDINATOR_KEY,
    METADATA_KEY,
)
from kqp.protocol.codec import decode_body, encode_body
from kqp.protocol.errors import ProtocolDecodeError


def _mapper(node_id: int, host: str, port: int) -> tuple[str, int]:
    return "proxy.example", 19000 + node_id


def _metadata(version: int) -> bytes:
    broker = MetadataResponse.MetadataResponseBroker
    message = MetadataResponse[version](
        throttle_time_ms=0,
        brokers=[broker(node_id=1, host="b1.internal", port=9092, rack=None),
                 broker(node_id=2, host="b2.internal", port=9092, rack="r2")],
        cluster_id="c", controller_id=1, topics=[],
    )
    return bytes(message.encode())


def test_decoded_message_can_be_encoded_again() -> None:
    # kafka-python 3.0.12 leaves `_header` unset on decode, so a plain re-encode fails;
    # decode_body works around it. This test fails if the workaround is removed.
    body = _metadata(12)
    raw = MetadataResponse.decode(body, version=12)
    with pytest.raises(AttributeError, match="_header"):
        raw.encode(version=12)
    assert encode_body(decode_body(METADATA_KEY, 12, body, is_request=False), 12) == body


@pytest.mark.parametrize("version", range(0, API_SPECS[METADATA_KEY].max_version + 1))
def test_metadata_brokers_are_rewritten_in_every_version(version: int) -> None:
    rewritten = rewrite_response_body(METADATA_KEY, version, _metadata(version), _mapper)
    assert rewritten is not None
    message = decode_body(METADATA_KEY, version, rewritten, is_request=False)
    assert [(b.node_id, b.host, b.port) for b in message.brokers] == [
        (1, "proxy.example", 19001), (2, "proxy.example", 19002)]


@pytest.mark.parametrize("version", range(0, 4))
def test_find_coordinator_single_form(version: int) -> None:
    fields = {"error_code": 0, "node_id": 2, "host": "b2.internal", "port": 9092}
    if version >= 1:
        fields |= {"throttle_time_ms": 0, "error_message": None}
    body = bytes(FindCoordinatorResponse[version](**fields).encode())
    rewritten = rewrite_response_body(FIND_COORDINATOR_KEY, version, body, _mapper)
    assert rewritten is not None
    message = decode_body(FIND_COORDINATOR_KEY, version, rewritten, is_request=False)
    assert (message.host, message.port) == ("proxy.example", 19002)


@pytest.mark.parametrize("version", range(4, API_SPECS[FIND_COORDINATOR_KEY].max_version + 1))
def test_find_coordinator_batched_form_keeps_failed_entries(version: int) -> None:
    coordinator = FindCoordinatorResponse.Coordinator
    body = bytes(FindCoordinatorResponse[version](throttle_time_ms=0, coordinators=[
        coordinator(key="g1", node_id=3, host="b3.internal", port=9092, error_code=0, error_message=None),
        coordinator(key="g2", node_id=-1, host="", port=-1, error_code=15, error_message="not available"),
    ]).encode())
    rewritten = rewrite_response_body(FIND_COORDINATOR_KEY, version, body, _mapper)
    assert rewritten is not None
    message = decode_body(FIND_COORDINATOR_KEY, version, rewritten, is_request=False)
    assert [(c.key, c.host, c.port) for c in message.coordinators] == [
        ("g1", "proxy.example", 19003), ("g2", "", -1)]


@pytest.mark.parametrize("version", range(0, API_SPECS[DESCRIBE_CLUSTER_KEY].max_version + 1))
def test_describe_cluster_brokers_are_rewritten(version: int) -> None:
    broker = DescribeClusterResponse.DescribeClusterBroker
    body = bytes(DescribeClusterResponse[version](
        throttle_time_ms=0, error_code=0, error_message=None, cluster_id="c", controller_id=1,
        brokers=[broker(broker_id=1, host="b1.internal", port=9092, rack=None)],
    ).encode())
    rewritten = rewrite_response_body(DESCRIBE_CLUSTER_KEY, version, body, _mapper)
    assert rewritten is not None
    message = decode_body(DESCRIBE_CLUSTER_KEY, version, rewritten, is_request=False)
    assert [(b.broker_id, b.host, b.port) for b in message.brokers] == [(1, "proxy.example", 19001)]


def test_api_versions_drops_unknown_keys_and_caps_versions() -> None:
    entry = ApiVersionsResponse.ApiVersion
    body = bytes(ApiVersionsResponse[3](error_code=0, throttle_time_ms=0, api_keys=[
        entry(api_key=0, min_version=0, max_version=99),   # Produce: broker's min 0 is kept
        entry(api_key=3, min_version=0, max_version=5),    # Metadata: already within range
        entry(api_key=68, min_version=0, max_version=1),   # ConsumerGroupHeartbeat: unknown to us
    ]).encode())
    message = decode_body(API_VERSIONS_KEY, 3, proxy_api_versions_body(3, body), is_request=False)
    assert [(k.api_key, k.min_version, k.max_version) for k in message.api_keys] == [
        (0, 0, API_SPECS[0].max_version), (3, 0, 5)]


def test_api_versions_error_answer_is_read_as_v0() -> None:
    entry = ApiVersionsResponse.ApiVersion
    body = bytes(ApiVersionsResponse[0](error_code=35, api_keys=[
        entry(api_key=18, min_version=0, max_version=4)]).encode())
    message = decode_body(API_VERSIONS_KEY, 0, proxy_api_versions_body(4, body), is_request=False)
    assert message.error_code == 35
    assert [(k.api_key, k.max_version) for k in message.api_keys] == [(18, 4)]


def test_garbage_body_is_a_decode_error() -> None:
    with pytest.raises(ProtocolDecodeError, match="Metadata v12 response"):
        decode_body(METADATA_KEY, 12, b"\xff\xff\xff", is_request=False)
