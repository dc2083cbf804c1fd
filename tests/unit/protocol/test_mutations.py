"""Controller-mutation requests: partition counts, removing rejected topics, merging answers."""

from __future__ import annotations

import uuid

import pytest
from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
)

from kqp.protocol.apis import CREATE_PARTITIONS_KEY, CREATE_TOPICS_KEY, DELETE_TOPICS_KEY
from kqp.protocol.codec import decode_body
from kqp.protocol.mutations import (
    THROTTLING_QUOTA_EXCEEDED,
    merge_rejections,
    read_mutation_request,
    request_without,
    throttled_response,
)

KNOWN = {"existing": 4, "other": 2}


def current(name: str | None, topic_id: uuid.UUID | None) -> int | None:
    return KNOWN.get(name or "")


def create_topics_body(version: int) -> bytes:
    topic = CreateTopicsRequest.CreatableTopic
    assignment = topic.CreatableReplicaAssignment
    return bytes(CreateTopicsRequest[version](topics=[
        topic(name="a", num_partitions=30, replication_factor=1, assignments=[], configs=[]),
        topic(name="b", num_partitions=-1, replication_factor=-1, configs=[],
              assignments=[assignment(partition_index=i, broker_ids=[1]) for i in range(3)]),
        topic(name="c", num_partitions=-1, replication_factor=-1, assignments=[], configs=[]),
    ], timeout_ms=1000, validate_only=False).encode())


@pytest.mark.parametrize("version", range(2, 8))
def test_create_topics_counts_partitions_like_the_controller(version: int) -> None:
    request = read_mutation_request(CREATE_TOPICS_KEY, version, create_topics_body(version), current, 5)
    assert [(t.name, t.partitions) for t in request.topics] == [("a", 30), ("b", 3), ("c", 5)]


@pytest.mark.parametrize("version", range(2, 8))
def test_create_topics_rejections_are_removed_then_merged_back_in_request_order(version: int) -> None:
    request = read_mutation_request(CREATE_TOPICS_KEY, version, create_topics_body(version), current, 1)
    rejected = [request.topics[0], request.topics[2]]
    forwarded = decode_body(CREATE_TOPICS_KEY, version, request_without(request, rejected), is_request=True)
    assert [t.name for t in forwarded.topics] == ["b"]
    result = CreateTopicsResponse.CreatableTopicResult
    broker_answer = bytes(CreateTopicsResponse[version](throttle_time_ms=0, topics=[
        result(name="b", topic_id=uuid.uuid4(), error_code=0, error_message=None, num_partitions=3,
               replication_factor=1, configs=[])]).encode())
    merged = decode_body(CREATE_TOPICS_KEY, version, merge_rejections(request, broker_answer, rejected, 4500),
                         is_request=False)
    assert [(t.name, t.error_code) for t in merged.topics] == [
        ("a", THROTTLING_QUOTA_EXCEEDED), ("b", 0), ("c", THROTTLING_QUOTA_EXCEEDED)]
    assert merged.topics[0].error_message is None
    assert merged.throttle_time_ms == 4500


@pytest.mark.parametrize("version", range(1, 7))
def test_delete_topics_charges_current_partitions_and_answers_when_all_rejected(version: int) -> None:
    if version >= 6:
        state = DeleteTopicsRequest.DeleteTopicState
        body = DeleteTopicsRequest[version](topics=[state(name="existing", topic_id=uuid.UUID(int=0)),
                                                   state(name="unknown", topic_id=uuid.UUID(int=0))], timeout_ms=1)
    else:
        body = DeleteTopicsRequest[version](topic_names=["existing", "unknown"], timeout_ms=1)
    request = read_mutation_request(DELETE_TOPICS_KEY, version, bytes(body.encode()), current, 1)
    assert [(t.name, t.partitions) for t in request.topics] == [("existing", 4), ("unknown", 1)]
    answer = decode_body(DELETE_TOPICS_KEY, version, throttled_response(request, request.topics, 1200),
                         is_request=False)
    assert answer.throttle_time_ms == 1200
    assert [(r.name, r.error_code) for r in answer.responses] == [
        ("existing", THROTTLING_QUOTA_EXCEEDED), ("unknown", THROTTLING_QUOTA_EXCEEDED)]


@pytest.mark.parametrize("version", range(0, 4))
def test_create_partitions_charges_the_partitions_added(version: int) -> None:
    topic = CreatePartitionsRequest.CreatePartitionsTopic
    body = bytes(CreatePartitionsRequest[version](topics=[
        topic(name="existing", count=10, assignments=None), topic(name="unseen", count=7, assignments=None),
    ], timeout_ms=1, validate_only=True).encode())
    request = read_mutation_request(CREATE_PARTITIONS_KEY, version, body, current, 1)
    assert [(t.name, t.partitions) for t in request.topics] == [("existing", 6), ("unseen", 1)]
    assert request.validate_only
    broker_answer = bytes(CreatePartitionsResponse[version](throttle_time_ms=7, results=[
        CreatePartitionsResponse.CreatePartitionsTopicResult(name="existing", error_code=0, error_message=None)
    ]).encode())
    merged = decode_body(CREATE_PARTITIONS_KEY, version,
                         merge_rejections(request, broker_answer, [request.topics[1]], 3),
                         is_request=False)
    assert [(r.name, r.error_code) for r in merged.results] == [("existing", 0), ("unseen", THROTTLING_QUOTA_EXCEEDED)]
    assert merged.throttle_time_ms == 7  # the larger of the broker's and the proxy's
