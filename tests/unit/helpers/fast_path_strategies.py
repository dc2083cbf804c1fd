"""Hypothesis strategies: Produce requests, Fetch requests and responses of every version (kafka-python encodes)."""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from kafka.codec import has_gzip, has_lz4, has_snappy, has_zstd
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.producer import ProduceRequest
from kafka.record import MemoryRecordsBuilder

# Kafka's codec ids; the libraries for snappy, lz4 and zstd are optional in kafka-python.
CODECS = [codec for codec, available in
          ((0, True), (1, has_gzip()), (2, has_snappy()), (3, has_lz4()), (4, has_zstd())) if available]


PROPERTY_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)


records_strategy = st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=8)), st.binary(max_size=64)),
                            min_size=1, max_size=6)


def build_batch(magic: int, codec: int, base_offset: int, records: list[tuple[bytes | None, bytes]]) -> bytes:
    builder = MemoryRecordsBuilder(magic, codec, batch_size=1 << 20, offset=base_offset)
    for index, (key, value) in enumerate(records):
        builder.append(1_700_000_000_000 + index, key, value, [] if magic >= 2 else None)
    builder.close()
    return bytes(builder.buffer())


@st.composite
def v2_batches(draw: st.DrawFn) -> bytes:
    """The records field of one partition: a few RecordBatch v2, possibly of mixed codecs."""
    count = draw(st.integers(0, 3))
    return b"".join(
        build_batch(2, draw(st.sampled_from(CODECS)), 0, draw(records_strategy))
        for _ in range(count)
    )


@st.composite
def produce_requests(draw: st.DrawFn, version: int) -> tuple[bytes, Any]:
    topic_cls = ProduceRequest.TopicProduceData
    partition_cls = topic_cls.PartitionProduceData
    topics = []
    for index in range(draw(st.integers(0, 3))):
        partitions = [partition_cls(index=draw(INT32), records=draw(st.one_of(v2_batches(), st.none())))
                      for _ in range(draw(st.integers(0, 3)))]
        topics.append(topic_cls(name=f"topic-{index}-{draw(st.text(max_size=4))}", topic_id=uuid.uuid4(),
                                partition_data=partitions))
    message = ProduceRequest[version](
        transactional_id=draw(st.one_of(st.none(), st.text(max_size=10))),
        acks=draw(st.sampled_from([-1, 0, 1])), timeout_ms=draw(INT32), topic_data=topics,
    )
    return bytes(message.encode()), message


@st.composite
def fetch_responses(draw: st.DrawFn, version: int) -> tuple[bytes, list[bytes]]:
    """A Fetch response whose partitions may end in a batch cut short, as brokers send them."""
    topic_cls = FetchResponse.FetchableTopicResponse
    partition_cls = topic_cls.PartitionData
    full_records: list[bytes] = []
    topics = []
    for index in range(draw(st.integers(0, 3))):
        partitions = []
        for _ in range(draw(st.integers(0, 3))):
            records = draw(st.one_of(v2_batches(), st.none()))
            if records and draw(st.booleans()):
                # A trailing partial batch (the broker's size limit cut it): not counted.
                tail = build_batch(2, draw(st.sampled_from(CODECS)), 0, draw(records_strategy))
                records += tail[: draw(st.integers(1, len(tail) - 1))]
            full_records.append(records or b"")
            aborted = draw(st.one_of(st.none(), st.lists(
                st.builds(partition_cls.AbortedTransaction, producer_id=INT64, first_offset=INT64), max_size=2)))
            leader = draw(st.one_of(st.none(), st.builds(partition_cls.LeaderIdAndEpoch, leader_id=INT32,
                                                         leader_epoch=INT32)))
            partitions.append(partition_cls(
                partition_index=draw(INT32), error_code=draw(st.integers(-1, 120)), high_watermark=draw(INT64),
                last_stable_offset=draw(INT64), log_start_offset=draw(INT64), diverging_epoch=None,
                current_leader=leader, snapshot_id=None, aborted_transactions=aborted,
                preferred_read_replica=draw(INT32), records=records,
            ))
        topics.append(topic_cls(topic=f"t{index}", topic_id=uuid.uuid4(), partitions=partitions))
    endpoints = [FetchResponse.NodeEndpoint(node_id=1, host="broker-1", port=9092, rack=None)]
    message = FetchResponse[version](
        throttle_time_ms=draw(st.integers(0, 2**31 - 1)), error_code=draw(st.integers(0, 120)),
        session_id=draw(INT32), responses=topics, node_endpoints=draw(st.sampled_from([[], endpoints])),
    )
    return bytes(message.encode()), full_records


@st.composite
def fetch_requests(draw: st.DrawFn, version: int) -> bytes:
    request = FetchRequest
    partition_cls = request.FetchTopic.FetchPartition
    topics = [
        request.FetchTopic(topic=f"t{index}", topic_id=uuid.uuid4(), partitions=[
            partition_cls(partition=draw(INT32), current_leader_epoch=draw(INT32), fetch_offset=draw(INT64),
                          last_fetched_epoch=draw(INT32), log_start_offset=draw(INT64),
                          partition_max_bytes=draw(INT32), replica_directory_id=None, high_watermark=draw(INT64))
            for _ in range(draw(st.integers(0, 3)))])
        for index in range(draw(st.integers(0, 3)))
    ]
    forgotten = [request.ForgottenTopic(topic="gone", topic_id=uuid.uuid4(), partitions=[1, 2])]
    message = request[version](
        cluster_id=draw(st.one_of(st.none(), st.text(max_size=5))), replica_id=draw(INT32),
        replica_state=request.ReplicaState(replica_id=draw(INT32), replica_epoch=draw(INT64)),
        max_wait_ms=draw(INT32), min_bytes=draw(INT32), max_bytes=draw(INT32),
        isolation_level=draw(st.sampled_from([0, 1])),
        session_id=draw(INT32), session_epoch=draw(INT32), topics=topics,
        forgotten_topics_data=draw(st.sampled_from([[], forgotten])), rack_id=draw(st.text(max_size=5)),
    )
    return bytes(message.encode())
