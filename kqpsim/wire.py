"""The Kafka frames the simulator's clients and broker exchange, built once per shape and
reused with the correlation id (and ThrottleTimeMs) patched in: encoding each request anew
would cost more than the proxy's handling of it, and the proxy reads only headers, sizes and
the fields it patches."""

from __future__ import annotations

import functools
import struct
import uuid

from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.metadata import MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record import MemoryRecordsBuilder

from kqp.protocol.apis import API_SPECS, CREATE_TOPICS_KEY, FETCH_KEY, PRODUCE_KEY
from kqp.protocol.codec import decode_body, encode_body
from kqp.protocol.framing import frame
from kqp.protocol.headers import (
    RequestHeader,
    encode_request_header,
    encode_response_header,
    response_body_offset,
)
from kqp.protocol.throttle_field import patch_throttle_time, read_throttle_time

PRODUCE_VERSION = 9
CREATE_TOPICS_VERSION = 7  # strict (KIP-599): topics over the quota are refused one by one
FETCH_VERSION = 12
TOPIC = "sim"
TOPIC_ID = uuid.UUID(int=7)
_CORRELATION = struct.Struct(">i")
# The correlation id's place in a framed request: size prefix, api key, api version.
_REQUEST_CORRELATION_AT = 8
# ... and in a framed response: size prefix only.
_RESPONSE_CORRELATION_AT = 4


@functools.lru_cache(maxsize=256)
def _records(total_bytes: int) -> bytes:
    """One uncompressed record batch of about `total_bytes` (one record)."""
    builder = MemoryRecordsBuilder(2, 0, batch_size=total_bytes * 2 + 1024, offset=0)
    builder.append(1_700_000_000_000, None, b"r" * max(1, total_bytes - 80), [])
    builder.close()
    return bytes(builder.buffer())


@functools.lru_cache(maxsize=256)
def produce_request(client_id: str, size: int, acks: int = -1) -> bytes:
    """A framed Produce request of `size` bytes in all (Kafka's request size: with its prefix)."""
    topic_cls = ProduceRequest.TopicProduceData

    def build(records_bytes: int) -> bytes:
        body = ProduceRequest[PRODUCE_VERSION](transactional_id=None, acks=acks, timeout_ms=30_000, topic_data=[
            topic_cls(name=TOPIC, partition_data=[
                topic_cls.PartitionProduceData(index=0, records=_records(records_bytes))])]).encode()
        return frame(encode_request_header(PRODUCE_KEY, PRODUCE_VERSION, 0, client_id) + bytes(body))

    first = build(size)
    return build(max(100, size - (len(first) - size)))


@functools.lru_cache(maxsize=16)
def produce_response_template() -> bytes:
    reply_cls = ProduceResponse.TopicProduceResponse
    partition = reply_cls.PartitionProduceResponse(
        index=0, error_code=0, base_offset=0, log_append_time_ms=-1, log_start_offset=0, record_errors=[],
        error_message=None, current_leader=None)
    body = ProduceResponse[PRODUCE_VERSION](
        throttle_time_ms=0, responses=[reply_cls(name=TOPIC, partition_responses=[partition])],
        node_endpoints=[]).encode()
    return frame(encode_response_header(PRODUCE_KEY, PRODUCE_VERSION, 0) + bytes(body))


@functools.lru_cache(maxsize=64)
def fetch_request(client_id: str, max_bytes: int, max_wait_ms: int = 500) -> bytes:
    partition = FetchRequest.FetchTopic.FetchPartition(
        partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
        partition_max_bytes=max_bytes)
    body = FetchRequest[FETCH_VERSION](
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes, isolation_level=0,
        session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(topic=TOPIC, partitions=[partition])],
        forgotten_topics_data=[], rack_id="").encode()
    return frame(encode_request_header(FETCH_KEY, FETCH_VERSION, 0, client_id) + bytes(body))


def fetch_max_bytes(request: bytes | memoryview, body_offset: int) -> int:
    """A Fetch v12 request's MaxBytes (after replica id, max wait, min bytes)."""
    value: int = struct.unpack_from(">i", request, body_offset + 12)[0]
    return value


@functools.lru_cache(maxsize=256)
def fetch_response_template(data_bytes: int) -> bytes:
    """A framed Fetch response whose records are about `data_bytes` (none for 0)."""
    data_cls = FetchResponse.FetchableTopicResponse.PartitionData
    partition = data_cls(
        partition_index=0, error_code=0, high_watermark=10, last_stable_offset=10, log_start_offset=0,
        diverging_epoch=None, current_leader=None, snapshot_id=None, aborted_transactions=[],
        preferred_read_replica=-1, records=_records(data_bytes) if data_bytes > 0 else b"")
    body = FetchResponse[FETCH_VERSION](
        throttle_time_ms=0, error_code=0, session_id=0,
        responses=[FetchResponse.FetchableTopicResponse(topic=TOPIC, partitions=[partition])]).encode()
    return frame(encode_response_header(FETCH_KEY, FETCH_VERSION, 0) + bytes(body))


def fetch_charge(response: bytes, *, prefixed: bool = True) -> int:
    """What a Fetch response charges its consumer quota: size prefix and body, not the header
    (kqp.quotas.recording.response_charges, as KafkaApis records the response size)."""
    unprefixed = memoryview(response)[4:] if prefixed else memoryview(response)
    return 4 + len(unprefixed) - response_body_offset(unprefixed, FETCH_KEY, FETCH_VERSION)


def metadata_response_body(version: int, node_id: int, host: str, port: int) -> bytes:
    broker = MetadataResponse.MetadataResponseBroker(node_id=node_id, host=host, port=port, rack=None)
    return bytes(MetadataResponse[version](throttle_time_ms=0, brokers=[broker], cluster_id="sim",
                                           controller_id=node_id, topics=[]).encode())


def with_correlation(template: bytes, correlation_id: int, *, request: bool) -> bytearray:
    out = bytearray(template)
    _CORRELATION.pack_into(out, _REQUEST_CORRELATION_AT if request else _RESPONSE_CORRELATION_AT, correlation_id)
    return out


def response_with(template: bytes, api_key: int, version: int, correlation_id: int, throttle_ms: int) -> bytearray:
    out = with_correlation(template, correlation_id, request=False)
    if throttle_ms:
        body_offset = response_body_offset(memoryview(out)[4:], api_key, version)
        view = bytearray(out[4:])
        patch_throttle_time(view, body_offset, api_key, version, throttle_ms)
        out[4:] = view
    return out


def response_throttle(response_frame: bytes, api_key: int, version: int) -> int:
    """ThrottleTimeMs of a response frame (without its size prefix)."""
    offset = response_body_offset(response_frame, api_key, version)
    return read_throttle_time(response_frame, offset, api_key, version) or 0


def response_correlation(response_frame: bytes) -> int:
    value: int = _CORRELATION.unpack_from(response_frame, 0)[0]
    return value


def create_topics_request(client_id: str, correlation_id: int, names: list[str], partitions: int) -> bytes:
    request_class = API_SPECS[CREATE_TOPICS_KEY].request_class[CREATE_TOPICS_VERSION]
    topics = [request_class.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1,
                                           assignments=[], configs=[]) for name in names]
    body = encode_body(request_class(topics=topics, timeout_ms=30000, validate_only=False), CREATE_TOPICS_VERSION)
    return frame(encode_request_header(CREATE_TOPICS_KEY, CREATE_TOPICS_VERSION, correlation_id, client_id) + body)


def create_topics_asked(header: RequestHeader, request: bytes) -> list[tuple[str, int]]:
    """The (topic, partitions) a CreateTopics request (no size prefix) asks for, in order."""
    message = decode_body(CREATE_TOPICS_KEY, header.api_version, memoryview(request)[header.body_offset:],
                          is_request=True)
    return [(t.name, t.num_partitions) for t in message.topics]


def create_topics_response(header: RequestHeader, asked: list[tuple[str, int]], errors: list[int],
                           throttle_ms: int) -> bytes:
    response_class = API_SPECS[CREATE_TOPICS_KEY].response_class[header.api_version]
    result = response_class.CreatableTopicResult
    topics = [result(name=name, topic_id=uuid.UUID(int=index + 1), error_code=error, error_message=None,
                     num_partitions=partitions if error == 0 else -1, replication_factor=1 if error == 0 else -1,
                     configs=None)
              for index, ((name, partitions), error) in enumerate(zip(asked, errors, strict=True))]
    body = encode_body(response_class(throttle_time_ms=throttle_ms, topics=topics), header.api_version)
    return frame(encode_response_header(CREATE_TOPICS_KEY, header.api_version, header.correlation_id) + body)


def partitions_created(response_frame: bytes) -> int:
    """The partitions a CreateTopics response (no size prefix) says were created."""
    offset = response_body_offset(response_frame, CREATE_TOPICS_KEY, CREATE_TOPICS_VERSION)
    message = decode_body(CREATE_TOPICS_KEY, CREATE_TOPICS_VERSION, memoryview(response_frame)[offset:],
                          is_request=False)
    return sum(t.num_partitions for t in message.topics if t.error_code == 0)
