"""Error codes for the metrics: every nested code, top level first, read by a walk compiled
from the schemas that must give exactly what the full decode gives (`decoded_error_codes`),
and repeated small responses answered from the memo."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.api_message import ApiMessageData
from kafka.protocol.metadata import ApiVersionsResponse

from kqp.protocol import error_codes
from kqp.protocol.address_rewrite import _capped_api_versions, proxy_api_versions_body
from kqp.protocol.api_keys import ApiKey
from kqp.protocol.apis import API_SPECS
from kqp.protocol.codec import build_response, encode_body
from kqp.protocol.error_codes import (
    MEMO_MAX_BODY_BYTES,
    collect_error_codes,
    decoded_error_codes,
    error_code_walker,
    response_error_codes,
    scan_error_codes,
)
from kqp.protocol.errors import ProtocolError
from kqp.protocol.schema_walk import struct_step
from tests.unit.helpers.definitions import DEFINITIONS_PACKAGE
from tests.unit.helpers.kafka_python_codec import KafkaMessage, keep_unknown_tags
from tests.unit.helpers.schema_messages import body_strategy, struct_body

ALL_VERSIONS = [(key, version) for key, spec in sorted(API_SPECS.items())
                for version in range(spec.min_version, spec.max_version + 1)]
OFFSET_FETCH_KEY = 9
DESCRIBE_CONFIGS_KEY = 32


def _id(pair: tuple[int, int]) -> str:
    return f"{API_SPECS[pair[0]].name}-v{pair[1]}"


def create_topics_response(codes: list[int], top_names: int = 1) -> bytes:
    version = 7
    cls: Any = build_response(ApiKey.CREATE_TOPICS, version, throttle_time_ms=0, topics=[]).__class__
    topic = cls.CreatableTopicResult
    topics = [topic(name=f"t{i}-" + "x" * top_names, topic_id=None, error_code=code, error_message=None,
                    topic_config_error_code=0, num_partitions=1, replication_factor=1, configs=[])
              for i, code in enumerate(codes)]
    return encode_body(build_response(ApiKey.CREATE_TOPICS, version, throttle_time_ms=0, topics=topics), version)


def test_every_nested_error_code_is_found_in_order() -> None:
    body = create_topics_response([0, 36, 0, 89])
    assert response_error_codes(ApiKey.CREATE_TOPICS, 7, body) == (36, 89)


def test_a_repeated_small_response_is_not_decoded_again() -> None:
    body = create_topics_response([41])
    assert len(body) <= MEMO_MAX_BODY_BYTES
    before = error_codes._memoized_error_codes.cache_info()
    first = response_error_codes(ApiKey.CREATE_TOPICS, 7, body)
    second = response_error_codes(ApiKey.CREATE_TOPICS, 7, memoryview(bytearray(body)))
    after = error_codes._memoized_error_codes.cache_info()
    assert first == second == (41,)
    assert after.hits - before.hits >= 1


def test_a_large_response_is_scanned_and_not_kept() -> None:
    body = create_topics_response([7, 0], top_names=MEMO_MAX_BODY_BYTES)
    assert len(body) > MEMO_MAX_BODY_BYTES
    before = error_codes._memoized_error_codes.cache_info()
    assert response_error_codes(ApiKey.CREATE_TOPICS, 7, body) == (7,)
    assert error_codes._memoized_error_codes.cache_info().currsize == before.currsize


def test_a_malformed_response_raises_and_is_not_memoized() -> None:
    with pytest.raises(ProtocolError):
        response_error_codes(ApiKey.CREATE_TOPICS, 7, b"\x00\x00")
    with pytest.raises(ProtocolError):
        response_error_codes(ApiKey.CREATE_TOPICS, 7, b"\x00\x00")


def test_a_clusters_repeated_api_versions_answer_is_checked_once() -> None:
    version = 3
    cls: Any = build_response(ApiKey.API_VERSIONS, version, error_code=0, api_keys=[]).__class__
    entries = [cls.ApiVersion(api_key=k, min_version=0, max_version=3) for k in (0, 1, 3, 18)]
    body = encode_body(build_response(ApiKey.API_VERSIONS, version, error_code=0, api_keys=entries,
                                      throttle_time_ms=0, supported_features=[], finalized_features_epoch=-1,
                                      finalized_features=[], zk_migration_ready=False), version)
    first = proxy_api_versions_body(version, body)
    before = _capped_api_versions.cache_info()
    assert proxy_api_versions_body(version, memoryview(body)) == first
    assert _capped_api_versions.cache_info().hits == before.hits + 1


@pytest.mark.parametrize("pair", ALL_VERSIONS, ids=_id)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_the_scan_gives_what_the_full_decode_gives(pair: tuple[int, int], data: st.DataObject) -> None:
    # Random bodies of every response version: int16 codes are mostly non-zero, so the order
    # (own code first even when it follows nested arrays on the wire) is checked too.
    body = data.draw(body_strategy(*pair, is_request=False))
    expected = decoded_error_codes(*pair, body)
    assert scan_error_codes(*pair, memoryview(body)) == expected
    assert response_error_codes(*pair, body) == expected
    walker = error_code_walker(*pair)
    assert (walker if isinstance(walker, int) else walker(body, 0, [])) == len(body)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), pair=st.sampled_from(ALL_VERSIONS))
def test_truncated_bodies_raise_protocol_errors(data: st.DataObject, pair: tuple[int, int]) -> None:
    body = data.draw(body_strategy(*pair, is_request=False))
    cut = data.draw(st.integers(0, len(body) - 1))
    with pytest.raises(ProtocolError):
        scan_error_codes(*pair, body[:cut])


def test_every_cut_of_a_large_response_raises() -> None:
    body = metadata_response(12, topics=30, partitions=4)
    for cut in range(0, len(body), 7):
        with pytest.raises(ProtocolError):
            response_error_codes(ApiKey.METADATA, 12, body[:cut])


def test_unknown_apis_and_versions_raise() -> None:
    with pytest.raises(ProtocolError):
        response_error_codes(9999, 0, b"\x00\x00")
    with pytest.raises(ProtocolError):
        response_error_codes(ApiKey.METADATA, API_SPECS[ApiKey.METADATA].max_version + 1, bytes(MEMO_MAX_BODY_BYTES))


def metadata_response(version: int, topics: int, partitions: int, top_error: int = 0) -> bytes:
    """Topic t has error 3 when t % 7 == 0; partition p of topic t has error 5 when (t + p) % 5 == 4."""
    cls: Any = build_response(ApiKey.METADATA, version).__class__
    topic_cls = cls.MetadataResponseTopic
    partition_cls = topic_cls.MetadataResponsePartition
    message = build_response(ApiKey.METADATA, version, throttle_time_ms=0, brokers=[
        cls.MetadataResponseBroker(node_id=n, host=f"broker-{n}.example", port=9092, rack=None) for n in range(3)
    ], cluster_id="cluster", controller_id=1, error_code=top_error, topics=[
        topic_cls(error_code=3 if t % 7 == 0 else 0, name=f"topic-{t}", topic_id=uuid.UUID(int=t + 1),
                  is_internal=False, topic_authorized_operations=-2147483648, partitions=[
                      partition_cls(error_code=5 if (t + p) % 5 == 4 else 0, partition_index=p, leader_id=p % 3,
                                    leader_epoch=1, replica_nodes=[0, 1, 2], isr_nodes=[0, 1], offline_replicas=[])
                      for p in range(partitions)])
        for t in range(topics)
    ])
    return encode_body(message, version)


def _metadata_codes(topics: int, partitions: int) -> list[int]:
    codes = []
    for t in range(topics):
        codes += [3] if t % 7 == 0 else []
        codes += [5 for p in range(partitions) if (t + p) % 5 == 4]
    return codes


@pytest.mark.parametrize("version", [1, 9, 12, 13])
def test_a_large_metadata_response(version: int) -> None:
    top_error = 31 if version >= 13 else 0  # CLUSTER_AUTHORIZATION_FAILED, written after Topics
    body = metadata_response(version, topics=40, partitions=6, top_error=top_error)
    assert len(body) > MEMO_MAX_BODY_BYTES
    expected = ((top_error,) if top_error else ()) + tuple(_metadata_codes(40, 6))
    assert response_error_codes(ApiKey.METADATA, version, body) == expected
    assert decoded_error_codes(ApiKey.METADATA, version, body) == expected


def offset_fetch_response(version: int, topics: int, partitions: int, top_error: int) -> bytes:
    """Partition p of topic t has error 88 when (t + p) % 9 == 0."""
    cls: Any = build_response(OFFSET_FETCH_KEY, version).__class__

    def code(t: int, p: int) -> int:
        return 88 if (t + p) % 9 == 0 else 0

    if version < 8:
        topic_cls = cls.OffsetFetchResponseTopic
        partition_cls = topic_cls.OffsetFetchResponsePartition
        message = build_response(OFFSET_FETCH_KEY, version, throttle_time_ms=0, error_code=top_error, topics=[
            topic_cls(name=f"topic-{t}", partitions=[
                partition_cls(partition_index=p, committed_offset=1000 + p, committed_leader_epoch=2, metadata="",
                              error_code=code(t, p)) for p in range(partitions)])
            for t in range(topics)])
    else:
        group_cls = cls.OffsetFetchResponseGroup
        topic_cls = group_cls.OffsetFetchResponseTopics
        partition_cls = topic_cls.OffsetFetchResponsePartitions
        message = build_response(OFFSET_FETCH_KEY, version, throttle_time_ms=0, groups=[
            group_cls(group_id=f"group-{g}", error_code=top_error, topics=[
                topic_cls(name=f"topic-{t}", topic_id=uuid.UUID(int=t + 1), partitions=[
                    partition_cls(partition_index=p, committed_offset=1000 + p, committed_leader_epoch=2,
                                  metadata="", error_code=code(t, p)) for p in range(partitions)])
                for t in range(topics)])
            for g in range(2)])
    return encode_body(message, version)


@pytest.mark.parametrize("version", [1, 7, 9, 10])
def test_a_large_offset_fetch_response(version: int) -> None:
    top_error = 15 if version >= 2 else 0  # COORDINATOR_NOT_AVAILABLE, after Topics on the wire
    body = offset_fetch_response(version, topics=12, partitions=20, top_error=top_error)
    assert len(body) > MEMO_MAX_BODY_BYTES
    partition_codes = tuple(88 for t in range(12) for p in range(20) if (t + p) % 9 == 0)
    groups = 2 if version >= 8 else 1
    expected = ((top_error,) if top_error else ()) + partition_codes
    assert response_error_codes(OFFSET_FETCH_KEY, version, body) == expected * groups
    assert decoded_error_codes(OFFSET_FETCH_KEY, version, body) == expected * groups


@pytest.mark.parametrize("version", [1, 4])
def test_a_large_describe_configs_response(version: int) -> None:
    cls: Any = build_response(DESCRIBE_CONFIGS_KEY, version).__class__
    result_cls = cls.DescribeConfigsResult
    config_cls = result_cls.DescribeConfigsResourceResult
    results = [
        result_cls(error_code=29 if r % 3 == 1 else 0, error_message=None, resource_type=2, resource_name=f"topic-{r}",
                   configs=[config_cls(name=f"config.name.{c}", value="x" * 20, read_only=False, config_source=5,
                                       is_sensitive=False, synonyms=[], config_type=2, documentation=None)
                            for c in range(30)])
        for r in range(6)
    ]
    body = encode_body(build_response(DESCRIBE_CONFIGS_KEY, version, throttle_time_ms=0, results=results), version)
    assert len(body) > MEMO_MAX_BODY_BYTES
    assert response_error_codes(DESCRIBE_CONFIGS_KEY, version, body) == (29, 29)
    assert decoded_error_codes(DESCRIBE_CONFIGS_KEY, version, body) == (29, 29)


def test_an_unsupported_version_answer_is_read_as_v0() -> None:
    # A broker answers a too-new ApiVersions request with UNSUPPORTED_VERSION in a v0 body, as
    # throttle_field reads it; the full decode could not read it and counted nothing.
    body = bytes(ApiVersionsResponse[0](error_code=35, api_keys=[
        ApiVersionsResponse.ApiVersion(api_key=18, min_version=0, max_version=3)]).encode())
    assert response_error_codes(ApiKey.API_VERSIONS, 4, body) == (35,)
    assert scan_error_codes(ApiKey.API_VERSIONS, 3, body) == (35,)


# No response of the bundled definitions has an ErrorCode inside a tagged field, or more than
# one code-bearing field after its own ErrorCode; this made-up one has both, declared in an
# order unlike the wire's, to hold the reordering to the codec's dict order.
_SYNTHETIC: dict[str, Any] = {
    "apiKey": 12, "type": "response", "name": "HeartbeatResponse", "validVersions": "0-1", "flexibleVersions": "1+",
    "fields": [
        {"name": "Early", "type": "EarlyStruct", "versions": "1+", "taggedVersions": "1+", "tag": 1,
         "fields": [{"name": "ErrorCode", "type": "int16", "versions": "1+"}]},
        {"name": "Items", "type": "[]Item", "versions": "0+", "fields": [
            {"name": "ErrorCode", "type": "int16", "versions": "0+"},
            {"name": "Name", "type": "string", "versions": "0+"}]},
        {"name": "ErrorCode", "type": "int16", "versions": "0+"},
        {"name": "Late", "type": "[]LateItem", "versions": "1+", "taggedVersions": "1+", "tag": 0,
         "fields": [{"name": "ErrorCode", "type": "int16", "versions": "1+"}]},
        {"name": "Other", "type": "[]OtherItem", "versions": "0+", "fields": [
            {"name": "ErrorCode", "type": "int16", "versions": "0+"}]},
    ],
}


def _synthetic_class() -> Any:
    def patch(_metacls: Any, _json: Any) -> Any:
        return _SYNTHETIC

    # Named after a bundled definition only so that kafka-python's loader finds a file to patch.
    attrs = {"__module__": __name__, "json_patch": classmethod(patch)}
    cls = ApiMessageData("HeartbeatResponse", (KafkaMessage,), attrs, load_json=DEFINITIONS_PACKAGE)
    keep_unknown_tags(cls._struct)
    return cls


SYNTHETIC = _synthetic_class()


@settings(max_examples=100, deadline=None)
@given(data=st.data(), version=st.sampled_from([0, 1]))
def test_codes_in_tagged_fields_come_in_declaration_order(data: st.DataObject, version: int) -> None:
    fields = _SYNTHETIC["fields"]
    flexible = version >= 1
    body = data.draw(struct_body(fields, version, flexible))
    decode = SYNTHETIC._struct.compiled_decode_from(version, compact=flexible, tagged=flexible, data_class=SYNTHETIC)
    message, used = decode(memoryview(body), 0)
    message._version = version
    expected: list[int] = []
    collect_error_codes(message.to_dict(), expected)
    walker = struct_step(fields, version, flexible, collect=True)
    found: list[int] = []
    assert not isinstance(walker, int)
    assert walker(body, 0, found) == used == len(body)
    assert found == expected
