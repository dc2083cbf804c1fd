"""The cheap NodeEndpoints check agrees with the full decode on generated responses."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kqp.protocol.address_rewrite import NODE_ENDPOINT_VERSIONS, client_response
from kqp.protocol.apis import API_SPECS, FETCH_KEY, METADATA_KEY, PRODUCE_KEY
from kqp.protocol.codec import decode_body
from kqp.protocol.node_endpoints import may_carry_node_endpoints
from kqp.protocol.throttle_field import throttle_field_offset
from tests.unit.helpers.schema_messages import body_strategy

CASES = [
    (api_key, version)
    for api_key in (PRODUCE_KEY, FETCH_KEY)
    for version in range(NODE_ENDPOINT_VERSIONS[api_key], API_SPECS[api_key].max_version + 1)
]


@pytest.mark.parametrize(("api_key", "version"), CASES)
@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data())
def test_check_is_true_exactly_when_the_decoded_response_has_node_endpoints(
    api_key: int, version: int, data: st.DataObject
) -> None:
    body = data.draw(body_strategy(api_key, version, is_request=False))
    frame = b"\x00\x00\x00\x07\x00" + body  # correlation id + empty header tagged fields
    decoded = decode_body(api_key, version, body, is_request=False)
    has_endpoints = bool(decoded.node_endpoints)
    carried = may_carry_node_endpoints(api_key, version, frame, 5)
    # It may only say "maybe" for other tagged fields; it must never miss endpoints.
    assert carried or not has_endpoints
    if not decoded.unknown_tags:
        assert carried == has_endpoints


@pytest.mark.parametrize(("api_key", "version"), CASES)
def test_a_response_with_node_endpoints_is_always_caught(api_key: int, version: int) -> None:
    response_class = API_SPECS[api_key].response_class[version]
    endpoint = response_class.NodeEndpoint(node_id=2, host="broker-2.internal", port=9092, rack=None)
    fields = {"responses": [], "throttle_time_ms": 0, "node_endpoints": [endpoint]}
    if api_key == FETCH_KEY:
        fields.update(error_code=0, session_id=0)
    with_endpoints = bytes(response_class(**fields).encode(version=version))
    fields["node_endpoints"] = []
    without = bytes(response_class(**fields).encode(version=version))
    header = b"\x00\x00\x00\x07\x00"
    assert may_carry_node_endpoints(api_key, version, header + with_endpoints, 5)
    assert not may_carry_node_endpoints(api_key, version, header + without, 5)


def _mapper(node_id: int, host: str, port: int) -> tuple[str, int]:
    return "proxy.local", 30000 + node_id


@pytest.mark.parametrize(("api_key", "version"), CASES)
def test_the_client_gets_the_proxys_endpoints_and_the_rewrite_is_reported(api_key: int, version: int) -> None:
    response_class = API_SPECS[api_key].response_class[version]
    endpoint = response_class.NodeEndpoint(node_id=2, host="broker-2.internal", port=9092, rack=None)
    fields = {"responses": [], "throttle_time_ms": 0, "node_endpoints": [endpoint]}
    if api_key == FETCH_KEY:
        fields.update(error_code=0, session_id=0)
    frame = b"\x00\x00\x00\x07\x00" + bytes(response_class(**fields).encode(version=version))
    out, rewritten = client_response(api_key, version, frame, 5, _mapper)
    decoded = decode_body(api_key, version, memoryview(out)[5:], is_request=False)
    assert rewritten and out[:5] == frame[:5]
    assert [(e.node_id, e.host, e.port) for e in decoded.node_endpoints] == [(2, "proxy.local", 30002)]
    fields["node_endpoints"] = []
    plain = b"\x00\x00\x00\x07\x00" + bytes(response_class(**fields).encode(version=version))
    assert client_response(api_key, version, plain, 5, _mapper) == (plain, False)


def test_a_metadata_response_is_learned_and_rewritten() -> None:
    from tests.unit.helpers.fake_broker import FakeBroker

    frame = b"\x00\x00\x00\x07\x00" + FakeBroker(node_id=4, port=9092).metadata_body(12)
    learned: list[object] = []
    out, endpoints = client_response(METADATA_KEY, 12, frame, 5, _mapper, learned.append)
    decoded = decode_body(METADATA_KEY, 12, memoryview(out)[5:], is_request=False)
    assert [(b.node_id, b.host, b.port) for b in decoded.brokers] == [(4, "proxy.local", 30004)]
    assert len(learned) == 1 and not endpoints


@pytest.mark.parametrize("version", range(API_SPECS[PRODUCE_KEY].min_version, API_SPECS[PRODUCE_KEY].max_version + 1))
@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data())
def test_a_produce_response_with_its_throttle_offset_known_is_answered_alike(version: int, data: st.DataObject) -> None:
    # The session passes the offset it found; the shortcut that reads the tag count after it
    # must give what the full path gives without it, NodeEndpoints or not.
    body = data.draw(body_strategy(PRODUCE_KEY, version, is_request=False))
    frame = b"\x00\x00\x00\x07\x00" + body
    offset = throttle_field_offset(frame, 5, PRODUCE_KEY, version)

    def mapper(_node_id: int, _host: str, _port: int) -> tuple[str, int]:
        return "proxy.local", 30000  # node ids are drawn from the whole int32 range

    assert client_response(PRODUCE_KEY, version, frame, 5, mapper, produce_throttle_offset=offset) == \
        client_response(PRODUCE_KEY, version, frame, 5, mapper)
