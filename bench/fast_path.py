"""Micro-benchmark of the zero-copy fast path against the full codec (kafka-python).

Prints nanoseconds per operation (best of several rounds) for:
  * summarising a Produce request (partitions, bytes, records, batches, codec) with
    kqp.protocol.fast_path versus decoding it with kqp.protocol.codec and reading the
    same figures from kafka-python's record batch objects;
  * setting ThrottleTimeMs in a response in place with kqp.protocol.throttle_field versus
    decode, set, re-encode.

    .venv/bin/python bench/fast_path.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from typing import Any

from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record import MemoryRecords, MemoryRecordsBuilder

from kqp.protocol.apis import FETCH_KEY, PRODUCE_KEY
from kqp.protocol.codec import decode_body, encode_body
from kqp.protocol.fast_path import parse_produce_request
from kqp.protocol.throttle_field import patch_throttle_time

RECORD = b"x" * 1000


def record_batch(records: int, codec: int) -> bytes:
    builder = MemoryRecordsBuilder(2, codec, batch_size=1 << 22)
    for index in range(records):
        builder.append(1_700_000_000_000 + index, None, RECORD, [])
    builder.close()
    return bytes(builder.buffer())


def produce_request(version: int, topics: int, partitions: int, records: int, codec: int) -> bytes:
    topic_cls = ProduceRequest.TopicProduceData
    batch = record_batch(records, codec)
    return bytes(ProduceRequest[version](transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[
        topic_cls(name=f"topic-{t}", topic_id=uuid.UUID(int=t + 1), partition_data=[
            topic_cls.PartitionProduceData(index=p, records=batch) for p in range(partitions)])
        for t in range(topics)
    ]).encode())


def produce_response(version: int, topics: int, partitions: int) -> bytes:
    topic_cls = ProduceResponse.TopicProduceResponse
    partition_cls = topic_cls.PartitionProduceResponse
    return bytes(ProduceResponse[version](throttle_time_ms=0, responses=[
        topic_cls(name=f"topic-{t}", topic_id=uuid.UUID(int=t + 1), partition_responses=[
            partition_cls(index=p, error_code=0, base_offset=1000 * p, log_append_time_ms=-1, log_start_offset=0,
                          record_errors=[], error_message=None)
            for p in range(partitions)])
        for t in range(topics)
    ], node_endpoints=[]).encode())


def full_codec_summary(body: bytes, version: int) -> list[tuple[Any, int, int, int, int, int]]:
    """The figures the fast path returns, read through the full codec instead."""
    message = decode_body(PRODUCE_KEY, version, body, is_request=True)
    summary = []
    for topic in message.topic_data:
        for partition in topic.partition_data:
            data = partition.records or b""
            batches = list(MemoryRecords(data)) if data else []
            summary.append((
                topic.topic_id if version >= 13 else topic.name, partition.index, len(data),
                sum(batch.records_count for batch in batches), len(batches),
                batches[0].compression_type if batches else -1,
            ))
    return summary


def full_codec_patch(api_key: int, version: int, body: bytes, value: int) -> bytes:
    message = decode_body(api_key, version, body, is_request=False)
    message.throttle_time_ms = value
    return encode_body(message, version)


def best_ns(operation: Callable[[], object], rounds: int) -> float:
    """Best per-call CPU time over `rounds` of >= 0.2 s each. CPU time (not wall time) so that
    other processes on a shared machine do not count; the best round has the least noise."""
    clock = time.process_time_ns
    calls = 1
    while True:
        start = clock()
        for _ in range(calls):
            operation()
        if clock() - start > 200_000_000:
            break
        calls *= 2
    best = float("inf")
    for _ in range(rounds):
        start = clock()
        for _ in range(calls):
            operation()
        best = min(best, (clock() - start) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    print("| operation | fast path (ns) | full codec (ns) | speed-up |")
    print("|---|---:|---:|---:|")
    shapes = [
        ("Produce v9, 1 partition, 1 batch of 16 x 1 KB, lz4", 9, 1, 1, 16, 3),
        ("Produce v9, 1 partition, 1 batch of 64 x 1 KB, none", 9, 1, 1, 64, 0),
        ("Produce v13, 5 topics x 10 partitions, 16 x 1 KB each, zstd", 13, 5, 10, 16, 4),
        ("Produce v7 (classic), 2 topics x 4 partitions, gzip", 7, 2, 4, 16, 1),
    ]
    for label, version, topics, partitions, records, codec in shapes:
        body = produce_request(version, topics, partitions, records, codec)
        view = memoryview(body)
        fast = parse_produce_request(view, version)
        full = full_codec_summary(body, version)
        # Same figures both ways, or the comparison means nothing.
        assert [(p.topic_id if version >= 13 else p.topic, p.partition, p.bytes, p.records, p.batches,
                 p.compression) for p in fast.partitions] == full
        fast_ns = best_ns(lambda body=view, version=version: parse_produce_request(body, version), args.rounds)
        full_ns = best_ns(lambda body=body, version=version: full_codec_summary(body, version), args.rounds)
        print(f"| summarise {label} ({len(body):,} B) | {fast_ns:,.0f} | {full_ns:,.0f} | {full_ns / fast_ns:,.0f}x |")

    fetch_body = bytes(4) + bytes(2) + bytes(4) + b"\x01" + b"\x00"  # Fetch v12: empty responses
    patch_cases = [
        ("throttle patch, Fetch v12 response (field first)", FETCH_KEY, 12, fetch_body),
        ("throttle patch, Produce v9 response, 1 partition (after Responses)", PRODUCE_KEY, 9,
         produce_response(9, 1, 1)),
        ("throttle patch, Produce v11 response, 5 x 10 partitions", PRODUCE_KEY, 11, produce_response(11, 5, 10)),
    ]
    for label, api_key, version, body in patch_cases:
        frame = bytearray(b"\x00\x00\x00\x07\x00" + body)
        fast_ns = best_ns(lambda f=frame, k=api_key, v=version: patch_throttle_time(f, 5, k, v, 1500), args.rounds)
        full_ns = best_ns(lambda b=body, k=api_key, v=version: full_codec_patch(k, v, b, 1500), args.rounds)
        assert bytes(frame[5:]) == full_codec_patch(api_key, version, body, 1500)
        print(f"| {label} | {fast_ns:,.0f} | {full_ns:,.0f} | {full_ns / fast_ns:,.0f}x |")


if __name__ == "__main__":
    main()
