"""A large Fetch response (several hundred KB) for the cut-through tests, and its request."""

from __future__ import annotations

import uuid

from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.record import MemoryRecordsBuilder

from kqp.protocol.apis import FETCH_KEY
from kqp.protocol.headers import encode_request_header, encode_response_header, response_body_offset

FETCH_VERSION = 17
TOPIC_ID = uuid.uuid4()


def records(total_bytes: int) -> bytes:
    builder = MemoryRecordsBuilder(2, 0, batch_size=total_bytes * 2, offset=0)
    for index in range(total_bytes // 1_000):
        builder.append(1_700_000_000_000 + index, None, bytes([index % 251]) * 1_000, [])
    builder.close()
    return bytes(builder.buffer())


DATA = records(600_000)


def fetch_request(correlation_id: int, session_id: int = 0, session_epoch: int = -1) -> bytes:
    """A Fetch of one partition; sessionless unless a session and its epoch are given (KIP-227)."""
    partition = FetchRequest.FetchTopic.FetchPartition(
        partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
        partition_max_bytes=1 << 20, replica_directory_id=None, high_watermark=-1)
    body = FetchRequest[FETCH_VERSION](
        cluster_id=None, replica_id=-1, replica_state=FetchRequest.ReplicaState(replica_id=-1, replica_epoch=-1),
        max_wait_ms=500, min_bytes=1, max_bytes=52_428_800, isolation_level=0, session_id=session_id,
        session_epoch=session_epoch,
        topics=[FetchRequest.FetchTopic(topic="t", topic_id=TOPIC_ID, partitions=[partition])],
        forgotten_topics_data=[], rack_id="").encode()
    return encode_request_header(FETCH_KEY, FETCH_VERSION, correlation_id, "consumer") + bytes(body)


def answer_fetch(header: object, body: bytes) -> bytes:
    data_cls = FetchResponse.FetchableTopicResponse.PartitionData
    leader = data_cls.LeaderIdAndEpoch(leader_id=1, leader_epoch=3)
    partition = data_cls(
        partition_index=0, error_code=0, high_watermark=10, last_stable_offset=10, log_start_offset=0,
        diverging_epoch=None, current_leader=leader, snapshot_id=None, aborted_transactions=[],
        preferred_read_replica=-1, records=DATA)
    endpoint = FetchResponse.NodeEndpoint(node_id=1, host="kafka-1.broker.internal", port=9092, rack=None)
    return bytes(FetchResponse[FETCH_VERSION](
        throttle_time_ms=0, error_code=0, session_id=0, node_endpoints=[endpoint],
        responses=[FetchResponse.FetchableTopicResponse(topic_id=TOPIC_ID, partitions=[partition])]).encode())


def decode(response: bytes) -> FetchResponse:
    return FetchResponse.decode(response[response_body_offset(response, FETCH_KEY, FETCH_VERSION):],
                                version=FETCH_VERSION)


def fetch_response_frame(version: int, correlation_id: int, session_id: int, error_code: int = 0) -> bytes:
    """A Fetch response frame (no size prefix) of any version, with one partition of 5 kB (not
    a real batch: what reads it never looks inside), as a broker sends it."""
    data_cls = FetchResponse[version].FetchableTopicResponse.PartitionData
    fields = {
        "partition_index": 0, "error_code": 0, "high_watermark": 100, "last_stable_offset": 100,
        "log_start_offset": 0, "aborted_transactions": [], "preferred_read_replica": -1, "records": b"\x07" * 5_000,
        "diverging_epoch": None, "current_leader": data_cls.LeaderIdAndEpoch(leader_id=1, leader_epoch=3),
        "snapshot_id": None,
    }
    partition = data_cls(**{name: value for name, value in fields.items() if name in data_cls.fields})
    topic_cls = FetchResponse[version].FetchableTopicResponse
    topic = topic_cls(**{name: value for name, value in
                         {"topic": "t", "topic_id": uuid.uuid4(), "partitions": [partition]}.items()
                         if name in topic_cls.fields})
    body_fields = {"throttle_time_ms": 0, "error_code": error_code, "session_id": session_id,
                   "responses": [topic], "node_endpoints": []}
    response_cls = FetchResponse[version]
    body = response_cls(**{name: value for name, value in body_fields.items() if name in response_cls.fields})
    return encode_response_header(FETCH_KEY, version, correlation_id) + bytes(body.encode())
