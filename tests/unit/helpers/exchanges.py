"""Request frames, exchanges and Produce request/response pairs as the observation hooks see them."""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record import MemoryRecordsBuilder

from kqp.protocol.headers import (
    encode_request_header,
    parse_request_header,
)
from kqp.proxy.hooks import Exchange
from tests.unit.helpers.client_views import client_view

CLIENT = client_view(connection_id=3, principal="alice", listener="node-1")


def batch(count: int, value_size: int, codec: int = 0) -> bytes:
    builder = MemoryRecordsBuilder(2, codec, batch_size=1 << 20, offset=0)
    for index in range(count):
        builder.append(1_700_000_000_000 + index, None, b"v" * value_size, [])
    builder.close()
    return bytes(builder.buffer())


def request_frame(api_key: int, version: int, message: Any, correlation_id: int = 7) -> bytes:
    return encode_request_header(api_key, version, correlation_id, "client-1") + bytes(message.encode())


def exchange_for(frame: bytes) -> Exchange:
    return Exchange(header=parse_request_header(frame), request_bytes=len(frame) + 4, received_at=99.0,
                    sent_at=99.001, response_received_at=99.01)


def produce_pair(version: int, topic: dict[str, Any], partition_errors: tuple[int, int]) -> tuple[Any, Any]:
    topic_cls = ProduceRequest.TopicProduceData
    request = ProduceRequest[version](transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[
        topic_cls(**topic, partition_data=[
            topic_cls.PartitionProduceData(index=0, records=batch(5, 100)),
            topic_cls.PartitionProduceData(index=1, records=batch(3, 10) + batch(2, 10, codec=1)),
        ])])
    reply_cls = ProduceResponse.TopicProduceResponse
    partition_cls = reply_cls.PartitionProduceResponse
    response = ProduceResponse[version](throttle_time_ms=0, responses=[reply_cls(**topic, partition_responses=[
        partition_cls(index=index, error_code=code, base_offset=0, log_append_time_ms=-1, log_start_offset=0,
                      record_errors=[], error_message=None, current_leader=None)
        for index, code in enumerate(partition_errors)])], node_endpoints=[])
    return request, response
