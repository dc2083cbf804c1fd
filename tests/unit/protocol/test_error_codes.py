"""Error codes for the metrics: every nested code, top level first, and repeated small
responses answered from the memo instead of a decode."""

from __future__ import annotations

from typing import Any

import pytest

from kqp.protocol import error_codes
from kqp.protocol.address_rewrite import _capped_api_versions, proxy_api_versions_body
from kqp.protocol.api_keys import ApiKey
from kqp.protocol.codec import build_response, encode_body
from kqp.protocol.error_codes import MEMO_MAX_BODY_BYTES, response_error_codes
from kqp.protocol.errors import ProtocolError


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


def test_a_large_response_is_decoded_and_not_kept() -> None:
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
