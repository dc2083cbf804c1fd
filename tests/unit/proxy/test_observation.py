"""The capture record the observation hook builds for Produce and Fetch: per-partition figures,
acks, Fetch settings, error codes, and topic ids resolved to names."""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kafka.protocol.consumer import FetchRequest, FetchResponse

from kqp.capture.writer import CaptureWriter, Record
from kqp.config.models import CaptureSection
from kqp.protocol.apis import FETCH_KEY, PRODUCE_KEY, SASL_HANDSHAKE_KEY
from kqp.protocol.headers import (
    encode_request_header,
    encode_response_header,
    response_body_offset,
)
from kqp.proxy.observation import ObservationHooks
from kqp.proxy.topics import TopicDirectory
from tests.unit.helpers.exchanges import CLIENT, batch, exchange_for, produce_pair, request_frame

ORDERS_ID = uuid.uuid4()


class RecordingWriter(CaptureWriter):
    """Keeps submitted records in a list instead of writing Parquet."""

    def __init__(self, directory: Path) -> None:
        super().__init__(CaptureSection(directory=str(directory)))
        self.records: list[Record] = []

    def submit(self, record: Record) -> bool:
        self.records.append(record)
        return True




def observer(writer: CaptureWriter, topics: TopicDirectory | None = None) -> ObservationHooks:
    return ObservationHooks(None, writer, clock=lambda: 100.0, topics=topics or TopicDirectory())


def learn_orders(topics: TopicDirectory) -> None:
    """A Metadata response naming topic `orders` passes through the proxy."""
    partitions = [SimpleNamespace(partition_index=i) for i in range(3)]
    topic = SimpleNamespace(name="orders", topic_id=ORDERS_ID, error_code=0, partitions=partitions)
    topics.learn_metadata(SimpleNamespace(topics=[topic]))








def run_pair(api_key: int, version: int, request: Any, response: Any,
             topics: TopicDirectory | None = None) -> list[Record]:
    writer = RecordingWriter(Path("unused"))
    hooks = observer(writer, topics)
    frame = request_frame(api_key, version, request)
    exchange = exchange_for(frame)
    hooks.request(CLIENT, exchange, frame)
    answer = encode_response_header(api_key, version, 7) + bytes(response.encode())
    hooks.response(CLIENT, exchange, answer, response_body_offset(answer, api_key, version))
    return writer.records




def test_produce_record_carries_acks_and_partition_figures_and_errors() -> None:
    request, response = produce_pair(9, {"name": "orders"}, (0, 87))
    (record,) = run_pair(PRODUCE_KEY, 9, request, response)
    assert record["acks"] == -1
    assert record["principal"] == "alice" and record["client_id"] == "client-1"
    first, second = record["partitions"]
    assert (first["topic"], first["partition"], first["records"], first["batches"], first["compression"],
            first["error_code"]) == ("orders", 0, 5, 1, 0, 0)
    assert first["bytes"] == len(batch(5, 100))
    assert (second["partition"], second["records"], second["batches"], second["error_code"]) == (1, 5, 2, 87)
    assert record["error_code"] == 87


def test_produce_v13_topic_id_is_resolved_to_the_name_learned_from_metadata() -> None:
    topics = TopicDirectory()
    learn_orders(topics)
    request, response = produce_pair(13, {"topic_id": ORDERS_ID}, (0, 0))
    (record,) = run_pair(PRODUCE_KEY, 13, request, response, topics)
    assert [p["topic"] for p in record["partitions"]] == ["orders", "orders"]


def fetch_pair(version: int, topic: dict[str, Any], records: bytes) -> tuple[Any, Any]:
    partition_cls = FetchRequest.FetchTopic.FetchPartition
    request = FetchRequest[version](
        cluster_id=None, replica_id=-1, replica_state=FetchRequest.ReplicaState(replica_id=-1, replica_epoch=-1),
        max_wait_ms=500, min_bytes=1, max_bytes=52_428_800, isolation_level=0, session_id=0, session_epoch=-1,
        topics=[FetchRequest.FetchTopic(**topic, partitions=[partition_cls(
            partition=2, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
            partition_max_bytes=1_048_576, replica_directory_id=None, high_watermark=-1)])],
        forgotten_topics_data=[], rack_id="")
    data_cls = FetchResponse.FetchableTopicResponse.PartitionData
    response = FetchResponse[version](throttle_time_ms=0, error_code=0, session_id=0, node_endpoints=[], responses=[
        FetchResponse.FetchableTopicResponse(**topic, partitions=[data_cls(
            partition_index=2, error_code=0, high_watermark=10, last_stable_offset=10, log_start_offset=0,
            diverging_epoch=None, current_leader=None, snapshot_id=None, aborted_transactions=[],
            preferred_read_replica=-1, records=records)])])
    return request, response


def test_fetch_record_carries_settings_and_response_partitions_by_name() -> None:
    topics = TopicDirectory()
    learn_orders(topics)
    records = batch(4, 50)
    request, response = fetch_pair(13, {"topic_id": ORDERS_ID}, records)
    (record,) = run_pair(FETCH_KEY, 13, request, response, topics)
    assert (record["fetch_max_wait_ms"], record["fetch_min_bytes"], record["fetch_max_bytes"]) == (500, 1, 52_428_800)
    assert "acks" not in record
    (partition,) = record["partitions"]
    assert (partition["topic"], partition["partition"], partition["records"], partition["bytes"]) == (
        "orders", 2, 4, len(records))


def test_fetch_topic_id_never_seen_in_metadata_stays_visible_as_the_uuid() -> None:
    request, response = fetch_pair(13, {"topic_id": ORDERS_ID}, batch(1, 1))
    (record,) = run_pair(FETCH_KEY, 13, request, response)
    assert record["partitions"][0]["topic"] == str(ORDERS_ID)


def test_sasl_frames_are_not_captured() -> None:
    writer = RecordingWriter(Path("unused"))
    hooks = observer(writer)
    frame = encode_request_header(SASL_HANDSHAKE_KEY, 1, 1, "c") + b"\x00\x05PLAIN"
    exchange = exchange_for(frame)
    hooks.request(CLIENT, exchange, frame)
    answer = encode_response_header(SASL_HANDSHAKE_KEY, 1, 1) + b"\x00\x00\x00\x00\x00\x01\x00\x05PLAIN"
    hooks.response(CLIENT, exchange, answer, 4)
    assert writer.records == []


def test_a_record_carries_the_exact_inputs_the_quota_engine_got() -> None:
    from kqp.config.models import EnforcementSection
    from kqp.proxy.hook_chain import HookChain
    from kqp.proxy.policies.chain import EnforcementPolicies
    from kqp.quotas import DEFAULT_ENTITY, QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings

    settings = QuotaSettings(entries=(QuotaEntry(QuotaEntity(None, DEFAULT_ENTITY), {"producer_byte_rate": 10}),))
    engine_clock = [5_000.125]
    writer = RecordingWriter(Path("unused"))
    chain = HookChain([EnforcementPolicies(QuotaEngine(settings), EnforcementSection(), lambda: engine_clock[0],
                                        TopicDirectory()),
                       observer(writer)])
    request, response = produce_pair(9, {"name": "orders"}, (0, 0))
    frame = request_frame(PRODUCE_KEY, 9, request)
    exchange = exchange_for(frame)
    chain.request(CLIENT, exchange, frame)
    answer = encode_response_header(PRODUCE_KEY, 9, 7) + bytes(response.encode())
    engine_clock[0] = 5_010.5
    chain.response(CLIENT, exchange, answer, response_body_offset(answer, PRODUCE_KEY, 9))

    (record,) = writer.records
    assert record["quota_broker"] == "1"
    assert (record["quota_response_seq"], record["quota_response_now_ms"]) == (1, 5_010.5)
    assert record["quota_request_seq"] is None and record["quota_request_now_ms"] is None
    assert record["quota_produce_bytes"] == len(frame) == record["request_bytes"] - 4
    assert record["quota_fetch_bytes"] is None
    assert abs(record["quota_request_time_ms"] - (99.01 - 99.001) * 1000) < 1e-9
    # 10 B/s is far below the request's size: the recorded inputs give the recorded throttle.
    replayed = QuotaEngine(settings).record_produce("1", "alice", "client-1", record["quota_produce_bytes"], 5_010.5)
    assert record["proxy_throttle_ms"] == replayed > 0


def test_capture_stamps_differ_by_exactly_the_loop_times_difference(tmp_path: Path) -> None:
    """A mute of T ms that starts at one loop instant and ends at another is T * 1000 us apart in
    the capture, to the microsecond: the event loop's times are whole milliseconds (uvloop), and
    the wall offset must not turn them into a stamp a microsecond early (the OAUTHBEARER test's
    mute check read such a stamp as a request forwarded inside its throttle)."""
    short = []
    for clock_s in (0.001 * k * 7_919 for k in range(1, 41)):  # forty loop clocks: forty wall offsets
        hooks = ObservationHooks(None, RecordingWriter(tmp_path), clock=lambda at=clock_s: at,
                                 topics=TopicDirectory())
        for start_ms in range(10_000_000, 10_001_000):
            for throttle_ms in (1, 35, 1_234):
                began = hooks._wall_us(start_ms / 1000)
                ended = hooks._wall_us((start_ms + throttle_ms) / 1000)
                if ended - began != throttle_ms * 1000:
                    short.append((clock_s, start_ms, throttle_ms, ended - began))
    assert not short, short[:5]
