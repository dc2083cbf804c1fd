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
from kqp.protocol.throttle_field import read_throttle_time, throttle_field_offset, write_throttle_time

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
    def build(records_bytes: int) -> bytes:
        return _produce_frame(client_id, _records(records_bytes), acks)

    first = build(size)
    return build(max(100, size - (len(first) - size)))


def _produce_frame(client_id: str, records: bytes, acks: int = -1) -> bytes:
    topic_cls = ProduceRequest.TopicProduceData
    body = ProduceRequest[PRODUCE_VERSION](transactional_id=None, acks=acks, timeout_ms=30_000, topic_data=[
        topic_cls(name=TOPIC, partition_data=[topic_cls.PartitionProduceData(index=0, records=records)])]).encode()
    return frame(encode_request_header(PRODUCE_KEY, PRODUCE_VERSION, 0, client_id) + bytes(body))


@functools.lru_cache(maxsize=16)
def produce_overhead(client_id: str, batch_bytes: int = 1 << 20) -> int:
    """A framed one-partition Produce request's bytes besides its record batch of about
    `batch_bytes` (size prefix, header, topic and partition fields, the batch's length)."""
    return len(_produce_frame(client_id, bytes(batch_bytes))) - batch_bytes


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


def fetch_charge(response: bytes | memoryview, *, prefixed: bool = True) -> int:
    """What a Fetch response charges its consumer quota: size prefix and body, not the header
    (kqp.quotas.recording.response_charges, as KafkaApis records the response size)."""
    unprefixed = memoryview(response)[4:] if prefixed else memoryview(response)
    return 4 + len(unprefixed) - response_body_offset(unprefixed, FETCH_KEY, FETCH_VERSION)


def metadata_response_body(version: int, node_id: int, host: str, port: int) -> bytes:
    broker = MetadataResponse.MetadataResponseBroker(node_id=node_id, host=host, port=port, rack=None)
    return bytes(MetadataResponse[version](throttle_time_ms=0, brokers=[broker], cluster_id="sim",
                                           controller_id=node_id, topics=[]).encode())


def with_correlation(template: bytes, correlation_id: int, *, request: bool) -> bytes:
    """The template with this correlation id, in one copy (a Produce's or a Fetch's payload is
    most of the bytes the simulator moves)."""
    at = _REQUEST_CORRELATION_AT if request else _RESPONSE_CORRELATION_AT
    view = memoryview(template)
    return b"".join((view[:at], _CORRELATION.pack(correlation_id), view[at + 4:]))


@functools.lru_cache(maxsize=256)
def _framed_throttle_at(template: bytes, api_key: int, version: int) -> int | None:
    """Where a response template's ThrottleTimeMs is, counted in the framed template; None for
    a version without one. The same for every copy of the template (its fields before the
    throttle do not change), so found once."""
    unprefixed = memoryview(template)[4:]
    offset = throttle_field_offset(unprefixed, response_body_offset(unprefixed, api_key, version), api_key, version)
    return None if offset is None else offset + 4


def response_with(template: bytes, api_key: int, version: int, correlation_id: int, throttle_ms: int) -> bytes:
    """A response from its template: this correlation id and ThrottleTimeMs (Kafka's clamp to
    int32), in one copy."""
    at = _framed_throttle_at(template, api_key, version) if throttle_ms else None
    if at is None:
        return with_correlation(template, correlation_id, request=False)
    throttle = bytearray(4)
    write_throttle_time(throttle, 0, throttle_ms)
    view = memoryview(template)
    return b"".join((view[:4], _CORRELATION.pack(correlation_id), view[8:at], throttle, view[at + 4:]))


class FrameReader:
    """Frames out of one direction of an in-memory connection, for the modelled clients and
    broker. The network delivers each write as one chunk, and a write of a client or of the
    broker is usually exactly one frame: that frame is handed on as a view of the chunk, with
    no copy. Anything else (several frames in a chunk, a frame over several) is assembled."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = bytearray()

    def feed(self, data: bytes) -> list[memoryview]:
        if not self._pending and len(data) >= 4 and _CORRELATION.unpack_from(data, 0)[0] == len(data) - 4:
            return [memoryview(data)[4:]]
        pending = self._pending
        pending += data
        frames: list[memoryview] = []
        start = 0
        while len(pending) - start >= 4:
            size = _CORRELATION.unpack_from(pending, start)[0]
            if len(pending) - start - 4 < size:
                break
            frames.append(memoryview(bytes(pending[start + 4:start + 4 + size])))
            start += 4 + size
        del pending[:start]
        return frames


def response_throttle(response_frame: bytes | memoryview, api_key: int, version: int) -> int:
    """ThrottleTimeMs of a response frame (without its size prefix)."""
    offset = response_body_offset(response_frame, api_key, version)
    return read_throttle_time(response_frame, offset, api_key, version) or 0


def response_correlation(response_frame: bytes | memoryview) -> int:
    value: int = _CORRELATION.unpack_from(response_frame, 0)[0]
    return value


def create_topics_request(client_id: str, correlation_id: int, names: list[str], partitions: int) -> bytes:
    request_class = API_SPECS[CREATE_TOPICS_KEY].request_class[CREATE_TOPICS_VERSION]
    topics = [request_class.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1,
                                           assignments=[], configs=[]) for name in names]
    body = encode_body(request_class(topics=topics, timeout_ms=30000, validate_only=False), CREATE_TOPICS_VERSION)
    return frame(encode_request_header(CREATE_TOPICS_KEY, CREATE_TOPICS_VERSION, correlation_id, client_id) + body)


def create_topics_asked(header: RequestHeader, request: bytes | memoryview) -> list[tuple[str, int]]:
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


def partitions_created(response_frame: bytes | memoryview) -> int:
    """The partitions a CreateTopics response (no size prefix) says were created."""
    offset = response_body_offset(response_frame, CREATE_TOPICS_KEY, CREATE_TOPICS_VERSION)
    message = decode_body(CREATE_TOPICS_KEY, CREATE_TOPICS_VERSION, memoryview(response_frame)[offset:],
                          is_request=False)
    return sum(t.num_partitions for t in message.topics if t.error_code == 0)
