"""The zero-copy fast path against kafka-python's full codec, on generated messages of every version.

Messages are built with kafka-python's message classes and real record batches
(MemoryRecordsBuilder with every compression codec installed), encoded, then summarised by
the fast path and decoded by the codec; the per-partition figures must agree.
"""

from __future__ import annotations

import contextlib
import random
import struct
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.producer import ProduceRequest
from kafka.record import MemoryRecords

from kqp.protocol.apis import API_SPECS, FETCH_KEY, PRODUCE_KEY
from kqp.protocol.errors import ProtocolDecodeError
from kqp.protocol.fast_path import (
    PartitionSummary,
    fetch_response_tag_count,
    parse_fetch_request,
    parse_fetch_response,
    parse_produce_request,
    parse_share_fetch_request,
    patch_fetch_max_bytes,
)
from tests.unit.helpers.fast_path_strategies import (
    CODECS,
    INT32,
    PROPERTY_SETTINGS,
    build_batch,
    fetch_requests,
    fetch_responses,
    produce_requests,
)
from tests.unit.protocol.test_fuzz import mutate

PRODUCE_VERSIONS = range(API_SPECS[PRODUCE_KEY].min_version, API_SPECS[PRODUCE_KEY].max_version + 1)
FETCH_VERSIONS = range(API_SPECS[FETCH_KEY].min_version, API_SPECS[FETCH_KEY].max_version + 1)







@dataclass
class Expected:
    bytes: int
    records: int
    batches: int
    compression: int
    magic: int


def decoded_figures(records: bytes | None) -> Expected:
    """What kafka-python finds in a records field, decompressing every batch."""
    data = records or b""
    batches = list(MemoryRecords(data)) if data else []
    return Expected(
        bytes=len(data),
        records=sum(len(list(batch)) for batch in batches),
        batches=len(batches),
        compression=batches[0].compression_type if batches else -1,
        magic=batches[0].magic if batches else -1,
    )


def figures(partition: PartitionSummary) -> Expected:
    return Expected(partition.bytes, partition.records, partition.batches, partition.compression, partition.magic)


def topic_key(version: int, first_id_version: int, topic: Any) -> str | uuid.UUID:
    return topic.topic_id if version >= first_id_version else topic.name if hasattr(topic, "name") else topic.topic




@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
@PROPERTY_SETTINGS
@given(data=st.data())
def test_produce_request_summary_matches_the_codec(version: int, data: st.DataObject) -> None:
    body, _ = data.draw(produce_requests(version))
    summary = parse_produce_request(memoryview(body), version)
    decoded = ProduceRequest.decode(body, version=version)
    assert (summary.acks, summary.timeout_ms) == (decoded.acks, decoded.timeout_ms)
    assert summary.transactional is (decoded.transactional_id is not None)
    expected = [
        (topic_key(version, 13, topic), partition.index, decoded_figures(partition.records))
        for topic in decoded.topic_data for partition in topic.partition_data
    ]
    found = [(p.topic_id if version >= 13 else p.topic, p.partition, figures(p)) for p in summary.partitions]
    assert found == expected
    assert summary.records == sum(e.records for _, _, e in expected)




@pytest.mark.parametrize("version", FETCH_VERSIONS)
@PROPERTY_SETTINGS
@given(data=st.data())
def test_fetch_response_summary_matches_the_codec(version: int, data: st.DataObject) -> None:
    body, _ = data.draw(fetch_responses(version))
    summary = parse_fetch_response(body, version)
    decoded = FetchResponse.decode(body, version=version)
    assert summary.throttle_time_ms == decoded.throttle_time_ms
    assert summary.error_code == (decoded.error_code if version >= 7 else 0)
    expected = [
        (topic_key(version, 13, topic), p.partition_index, p.error_code, p.high_watermark, decoded_figures(p.records))
        for topic in decoded.responses for p in topic.partitions
    ]
    found = [(p.topic_id if version >= 13 else p.topic, p.partition, p.error_code, p.high_watermark, figures(p))
             for p in summary.partitions]
    assert found == expected




@pytest.mark.parametrize("version", FETCH_VERSIONS)
@PROPERTY_SETTINGS
@given(data=st.data(), new_max=st.integers(0, 2**31 - 1))
def test_fetch_request_summary_and_max_bytes_patch(version: int, data: st.DataObject, new_max: int) -> None:
    body = data.draw(fetch_requests(version))
    summary = parse_fetch_request(body, version)
    decoded = FetchRequest.decode(body, version=version)
    assert (summary.max_wait_ms, summary.min_bytes, summary.max_bytes, summary.isolation_level) == (
        decoded.max_wait_ms, decoded.min_bytes, decoded.max_bytes, decoded.isolation_level)
    assert [(p.topic_id if version >= 13 else p.topic, p.partition, p.fetch_offset, p.partition_max_bytes)
            for p in summary.partitions] == [
        (topic_key(version, 13, t), p.partition, p.fetch_offset, p.partition_max_bytes)
        for t in decoded.topics for p in t.partitions]
    assert summary.max_bytes_offset is not None
    # The patch changes MaxBytes and nothing else, also when the body sits inside a frame.
    frame = bytearray(b"HEADER" + body)
    patch_fetch_max_bytes(frame, 6 + summary.max_bytes_offset, new_max)
    patched = FetchRequest.decode(bytes(frame[6:]), version=version)
    assert patched.max_bytes == new_max
    decoded.max_bytes = new_max
    assert patched.to_dict() == decoded.to_dict()


def test_patch_outside_the_buffer_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolDecodeError):
        patch_fetch_max_bytes(bytearray(10), 8, 1)


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_message_sets_are_counted_per_message(magic: int) -> None:
    plain = build_batch(magic, 0, 0, [(b"k", b"a"), (None, b"bb"), (b"c", b"")])
    wrapped = build_batch(magic, 1, 10, [(b"k", b"x" * 100)] * 4)  # one gzip wrapper message
    records = plain + wrapped
    body = bytes(FetchResponse[4](throttle_time_ms=0, responses=[FetchResponse.FetchableTopicResponse(
        topic="old", partitions=[FetchResponse.FetchableTopicResponse.PartitionData(
            partition_index=0, error_code=0, high_watermark=14, last_stable_offset=14,
            aborted_transactions=None, records=records)])]).encode())
    (partition,) = parse_fetch_response(body, 4).partitions
    # Uncompressed messages count one each; a compressed wrapper counts as one, since the
    # number inside it is only known after decompression.
    assert (partition.records, partition.batches, partition.magic, partition.compression) == (4, 4, magic, 0)
    assert partition.bytes == len(records)


def test_produce_request_with_topic_ids_reports_the_id() -> None:
    topic_id = uuid.uuid4()
    batch = build_batch(2, CODECS[-1], 0, [(None, b"v" * 10)] * 7)
    topic_cls = ProduceRequest.TopicProduceData
    body = bytes(ProduceRequest[13](transactional_id="tx", acks=-1, timeout_ms=30_000, topic_data=[
        topic_cls(topic_id=topic_id, partition_data=[topic_cls.PartitionProduceData(index=5, records=batch)])
    ]).encode())
    summary = parse_produce_request(body, 13)
    (partition,) = summary.partitions
    assert (partition.topic, partition.topic_id, partition.topic_label) == (None, topic_id, str(topic_id))
    assert (partition.partition, partition.records, partition.batches, partition.compression) == (5, 7, 1, CODECS[-1])
    assert summary.transactional and summary.acks == -1


def test_record_batch_with_an_impossible_length_is_rejected() -> None:
    batch = bytearray(build_batch(2, 0, 0, [(None, b"v")]))
    struct.pack_into(">i", batch, 8, 20)  # shorter than a RecordBatch header
    body = bytes(ProduceRequest[3](transactional_id=None, acks=1, timeout_ms=1, topic_data=[
        ProduceRequest.TopicProduceData(name="t", partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=bytes(batch))])]).encode())
    with pytest.raises(ProtocolDecodeError, match="shorter than its header"):
        parse_produce_request(body, 3)


def test_trailing_bytes_after_a_produce_request_are_rejected() -> None:
    body = bytes(ProduceRequest[9](transactional_id=None, acks=1, timeout_ms=1, topic_data=[]).encode())
    parse_produce_request(body, 9)
    with pytest.raises(ProtocolDecodeError, match="unread bytes"):
        parse_produce_request(body + b"\x00", 9)


SHARE_FETCH_SPEC = API_SPECS[78]
SHARE_FETCH_VERSIONS = range(SHARE_FETCH_SPEC.min_version, SHARE_FETCH_SPEC.max_version + 1)


@st.composite
def share_fetch_requests(draw: st.DrawFn, version: int) -> bytes:
    request = SHARE_FETCH_SPEC.request_class
    topic = request.FetchTopic
    topics = [topic(topic_id=uuid.UUID(int=draw(st.integers(0, 2**128 - 1))), partitions=[
        topic.FetchPartition(partition_index=draw(INT32), partition_max_bytes=0, acknowledgement_batches=[])
        for _ in range(draw(st.integers(0, 2)))]) for _ in range(draw(st.integers(0, 2)))]
    message = request[version](
        group_id=draw(st.one_of(st.none(), st.text(max_size=40))),
        member_id=draw(st.one_of(st.none(), st.text(max_size=30))),
        share_session_epoch=draw(INT32), max_wait_ms=draw(INT32), min_bytes=draw(INT32), max_bytes=draw(INT32),
        max_records=draw(INT32), batch_size=draw(INT32), share_acquire_mode=draw(st.sampled_from([0, 1])),
        is_renew_ack=draw(st.booleans()), topics=topics, forgotten_topics_data=[],
    )
    return bytes(message.encode())


@pytest.mark.parametrize("version", SHARE_FETCH_VERSIONS)
@PROPERTY_SETTINGS
@given(data=st.data(), new_max=st.integers(0, 2**31 - 1))
def test_share_fetch_request_limits_and_max_bytes_patch(version: int, data: st.DataObject, new_max: int) -> None:
    body = data.draw(share_fetch_requests(version))
    summary = parse_share_fetch_request(body, version)
    decoded = SHARE_FETCH_SPEC.request_class[version].decode(body, version=version)
    assert (summary.max_wait_ms, summary.min_bytes, summary.max_bytes) == (
        decoded.max_wait_ms, decoded.min_bytes, decoded.max_bytes)
    assert summary.max_bytes_offset is not None
    # MinBytes is the int32 right before MaxBytes, as in Fetch: the cap patches both in place.
    frame = bytearray(b"HEADER" + body)
    patch_fetch_max_bytes(frame, 6 + summary.max_bytes_offset, new_max)
    patch_fetch_max_bytes(frame, 6 + summary.max_bytes_offset - 4, 7)
    patched = SHARE_FETCH_SPEC.request_class[version].decode(bytes(frame[6:]), version=version)
    decoded.max_bytes, decoded.min_bytes = new_max, 7
    assert patched.to_dict() == decoded.to_dict()


def test_a_truncated_share_fetch_request_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolDecodeError):
        parse_share_fetch_request(b"\x06group\x03me\x00\x00", 1)


@pytest.mark.parametrize("version", range(4, 19))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_the_tag_count_walk_agrees_with_the_full_parse(version: int, data: st.DataObject, seed: int) -> None:
    # Skipping records by length must count the same tags, and refuse every layout the full
    # parse refuses; only bad batches inside a well-formed records field may pass it.
    base, _ = data.draw(fetch_responses(version))
    rng = random.Random(seed)
    for body in [base] + [mutate(base, rng) for _ in range(60)]:
        try:
            count = fetch_response_tag_count(body, version)
        except ProtocolDecodeError:
            with pytest.raises(ProtocolDecodeError):
                parse_fetch_response(body, version)
            continue
        with contextlib.suppress(ProtocolDecodeError):
            assert parse_fetch_response(body, version).tagged_fields == count
