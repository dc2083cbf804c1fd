"""Control-plane codec (kafka-python's schema-driven one) and broker-address rewriting."""

from __future__ import annotations

import pytest
from kafka.protocol.admin import DescribeClusterResponse
from kafka.protocol.metadata import FindCoordinatorResponse, MetadataResponse

from kqp.protocol.address_rewrite import decode_api_versions, proxy_api_versions_body, rewrite_response_body
from kqp.protocol.apis import (
    API_SPECS,
    API_VERSIONS_KEY,
    DESCRIBE_CLUSTER_KEY,
    DESCRIBE_QUORUM_KEY,
    FIND_COORDINATOR_KEY,
    METADATA_KEY,
    SHARE_ACKNOWLEDGE_KEY,
    SHARE_FETCH_KEY,
)
from kqp.protocol.codec import decode_body, encode_body
from kqp.protocol.errors import ProtocolDecodeError
from kqp.protocol.node_endpoints import may_carry_node_endpoints


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


def _api_versions(version: int, error_code: int, entries: list[tuple[int, int, int]]) -> bytes:
    cls = API_SPECS[API_VERSIONS_KEY].response_class
    fields = {"error_code": error_code, "api_keys": [
        cls.ApiVersion(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in entries]}
    if version >= 1:
        fields["throttle_time_ms"] = 0
    return bytes(cls[version](**fields).encode())


def test_api_versions_advertises_every_broker_api_and_caps_only_what_the_proxy_decodes() -> None:
    body = _api_versions(3, 0, [
        (0, 0, 99),    # Produce: decoded by the proxy, capped; the broker's min 0 is kept
        (3, 0, 5),     # Metadata: already within range
        (68, 0, 1),    # ConsumerGroupHeartbeat: forwarded as bytes, advertised as it is
        (76, 1, 1),    # ShareGroupHeartbeat
        (7, 0, 3),     # an API the definitions have no versions of: still forwarded
        (500, 0, 9),   # an API key from a future Kafka: forwarded
        (88, 0, 7),    # StreamsGroupHeartbeat in versions newer than the definitions
    ])
    rewritten = proxy_api_versions_body(3, body)
    assert rewritten is not None
    message = decode_body(API_VERSIONS_KEY, 3, rewritten, is_request=False)
    assert [(k.api_key, k.min_version, k.max_version) for k in message.api_keys] == [
        (0, 0, API_SPECS[0].max_version), (3, 0, 5), (68, 0, 1), (76, 1, 1), (7, 0, 3), (500, 0, 9), (88, 0, 7)]


def test_api_versions_within_the_proxys_range_go_out_as_the_brokers_bytes() -> None:
    body = _api_versions(4, 0, [(0, 0, 13), (68, 0, 1), (78, 1, 2)])
    assert proxy_api_versions_body(4, body) is None


def test_a_decoded_api_the_proxy_cannot_read_in_any_broker_version_is_not_advertised() -> None:
    body = _api_versions(3, 0, [(3, 40, 41), (68, 0, 1)])
    rewritten = proxy_api_versions_body(3, body)
    assert rewritten is not None
    message = decode_body(API_VERSIONS_KEY, 3, rewritten, is_request=False)
    assert [k.api_key for k in message.api_keys] == [68]


def test_api_versions_unsupported_version_answer_is_read_as_v0() -> None:
    body = _api_versions(0, 35, [(18, 0, 4)])
    message, version = decode_api_versions(4, body)
    assert (version, message.error_code) == (0, 35)
    assert [(k.api_key, k.max_version) for k in message.api_keys] == [(18, 4)]


def test_api_versions_other_errors_are_read_in_the_request_version() -> None:
    # INVALID_REQUEST (42) for a bad client software name comes back in the request's version.
    body = _api_versions(3, 42, [])
    message, version = decode_api_versions(3, body)
    assert (version, message.error_code) == (3, 42)
    assert proxy_api_versions_body(3, body) is None


def test_unknown_tagged_fields_survive_a_rewrite_byte_for_byte() -> None:
    cls = API_SPECS[METADATA_KEY].response_class
    broker = cls.MetadataResponseBroker(node_id=1, host="b1.internal", port=9092, rack=None)
    body = bytes(cls[12](throttle_time_ms=0, brokers=[broker], cluster_id="c", controller_id=1,
                         topics=[]).encode())
    # Tag 40 (unknown to Kafka 4.3) on the broker entry and tags 7 and 90 at the top level.
    host_end = body.index(b"b1.internal") + len(b"b1.internal")
    entry_tags_at = host_end + 4 + 1  # port, then the null rack (compact string 0)
    assert body[entry_tags_at] == 0
    with_tags = (body[:entry_tags_at] + b"\x01\x28\x02hi" + body[entry_tags_at + 1 : -1]
                 + b"\x02\x07\x01x\x5a\x03abc")
    rewritten = rewrite_response_body(METADATA_KEY, 12, with_tags, _mapper)
    assert rewritten is not None
    expected = with_tags.replace(b"\x0cb1.internal\x00\x00\x23\x84", b"\x0eproxy.example\x00\x00\x4a\x39")
    assert expected != with_tags
    assert rewritten == expected


@pytest.mark.parametrize("version", range(API_SPECS[SHARE_FETCH_KEY].min_version,
                                          API_SPECS[SHARE_FETCH_KEY].max_version + 1))
@pytest.mark.parametrize("api_key", [SHARE_FETCH_KEY, SHARE_ACKNOWLEDGE_KEY])
def test_share_node_endpoints_are_rewritten(api_key: int, version: int) -> None:
    cls = API_SPECS[api_key].response_class
    body = bytes(cls[version](throttle_time_ms=0, error_code=0, error_message=None, responses=[], node_endpoints=[
        cls.NodeEndpoint(node_id=2, host="b2.internal", port=9092, rack=None)]).encode())
    frame = b"\x00\x00\x00\x07\x00" + body
    assert may_carry_node_endpoints(api_key, version, frame, 5)
    rewritten = rewrite_response_body(api_key, version, body, _mapper)
    assert rewritten is not None
    message = decode_body(api_key, version, rewritten, is_request=False)
    assert [(n.node_id, n.host, n.port) for n in message.node_endpoints] == [(2, "proxy.example", 19002)]
    empty = bytes(cls[version](throttle_time_ms=0, error_code=0, error_message=None, responses=[],
                               node_endpoints=[]).encode())
    assert not may_carry_node_endpoints(api_key, version, b"\x00\x00\x00\x07\x00" + empty, 5)


def test_describe_quorum_listeners_are_left_out() -> None:
    cls = API_SPECS[DESCRIBE_QUORUM_KEY].response_class
    listener = cls.Node.Listener(name="CONTROLLER", host="controller-1.internal", port=9093)
    body = bytes(cls[2](error_code=0, error_message=None, topics=[], nodes=[
        cls.Node(node_id=1, listeners=[listener])]).encode())
    rewritten = rewrite_response_body(DESCRIBE_QUORUM_KEY, 2, body, _mapper)
    assert rewritten is not None
    assert b"controller-1.internal" not in rewritten
    message = decode_body(DESCRIBE_QUORUM_KEY, 2, rewritten, is_request=False)
    assert [(n.node_id, list(n.listeners)) for n in message.nodes] == [(1, [])]


def test_describe_cluster_controllers_are_left_out() -> None:
    cls = API_SPECS[DESCRIBE_CLUSTER_KEY].response_class
    body = bytes(cls[1](throttle_time_ms=0, error_code=0, error_message=None, endpoint_type=2, cluster_id="c",
                        controller_id=1, brokers=[cls.DescribeClusterBroker(
                            broker_id=1, host="controller-1.internal", port=9093, rack=None)]).encode())
    rewritten = rewrite_response_body(DESCRIBE_CLUSTER_KEY, 1, body, _mapper)
    assert rewritten is not None
    assert b"controller-1.internal" not in rewritten


def test_garbage_body_is_a_decode_error() -> None:
    with pytest.raises(ProtocolDecodeError, match="Metadata v12 response"):
        decode_body(METADATA_KEY, 12, b"\xff\xff\xff", is_request=False)
