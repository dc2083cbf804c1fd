"""Micro-benchmark of reading a response's error codes for the metrics.

Prints microseconds per call (best of several rounds, CPU time) for:
  * the scan compiled from the schemas (kqp.protocol.error_codes.scan_error_codes) versus
    the full decode it replaced (decoded_error_codes: kafka-python decode, to_dict, walk),
    on a ~10 KB Metadata response and a ~20 KB OffsetFetch response;
  * small bodies: the memo (a repeated body) versus scanning it every time, which is what
    decides whether bodies up to MEMO_MAX_BODY_BYTES stay memoized.

    .venv/bin/python bench/error_codes.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

from fast_path import best_ns

from kqp.protocol.api_keys import ApiKey
from kqp.protocol.codec import build_response, encode_body
from kqp.protocol.error_codes import (
    _memoized_error_codes,
    decoded_error_codes,
    response_error_codes,
    scan_error_codes,
)

# Not among kqp.protocol.api_keys' names (the proxy itself never reads them).
OFFSET_FETCH_KEY = 9
HEARTBEAT_KEY = 12


def metadata_response(version: int, topics: int, partitions: int) -> bytes:
    """Every seventh topic has UNKNOWN_TOPIC_OR_PARTITION, every fifth partition LEADER_NOT_AVAILABLE."""
    cls: Any = build_response(ApiKey.METADATA, version).__class__
    topic_cls = cls.MetadataResponseTopic
    partition_cls = topic_cls.MetadataResponsePartition
    body = build_response(ApiKey.METADATA, version, throttle_time_ms=0, brokers=[
        cls.MetadataResponseBroker(node_id=n, host=f"broker-{n}.kafka.internal", port=9092, rack=None)
        for n in range(3)
    ], cluster_id="kqp-bench-cluster", controller_id=1, error_code=0, topics=[
        topic_cls(error_code=3 if t % 7 == 0 else 0, name=f"orders.events-{t}", topic_id=uuid.UUID(int=t + 1),
                  is_internal=False, topic_authorized_operations=-2147483648, partitions=[
                      partition_cls(error_code=5 if p % 5 == 4 else 0, partition_index=p, leader_id=p % 3,
                                    leader_epoch=7, replica_nodes=[0, 1, 2], isr_nodes=[0, 1, 2],
                                    offline_replicas=[])
                      for p in range(partitions)])
        for t in range(topics)
    ])
    return encode_body(body, version)


def offset_fetch_response(version: int, topics: int, partitions: int) -> bytes:
    """One group; every eleventh partition has UNSTABLE_OFFSET_COMMIT."""
    cls: Any = build_response(OFFSET_FETCH_KEY, version).__class__
    group_cls = cls.OffsetFetchResponseGroup
    topic_cls = group_cls.OffsetFetchResponseTopics
    partition_cls = topic_cls.OffsetFetchResponsePartitions
    body = build_response(OFFSET_FETCH_KEY, version, throttle_time_ms=0, groups=[
        group_cls(group_id="payments-consumer", error_code=0, topics=[
            topic_cls(name=f"payments.ledger-{t}", topic_id=uuid.UUID(int=t + 1), partitions=[
                partition_cls(partition_index=p, committed_offset=1_000_000 + p, committed_leader_epoch=4,
                              metadata="", error_code=88 if (t * partitions + p) % 11 == 0 else 0)
                for p in range(partitions)])
            for t in range(topics)])
    ])
    return encode_body(body, version)


def heartbeat_response() -> bytes:
    return encode_body(build_response(HEARTBEAT_KEY, 4, throttle_time_ms=0, error_code=0), 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    print("| response | body (B) | codes | scan (µs) | full decode (µs) | speed-up |")
    print("|---|---:|---:|---:|---:|---:|")
    large = [
        ("Metadata v12, 20 topics x 10 partitions", ApiKey.METADATA, 12, metadata_response(12, 20, 10)),
        ("OffsetFetch v9, 1 group, 20 topics x 50 partitions", OFFSET_FETCH_KEY, 9,
         offset_fetch_response(9, 20, 50)),
    ]
    for label, api_key, version, body in large:
        view = memoryview(body)
        codes = scan_error_codes(api_key, version, view)
        # Same codes both ways, or the comparison means nothing.
        assert codes == decoded_error_codes(api_key, version, body)
        scan = best_ns(lambda k=api_key, v=version, b=view: scan_error_codes(k, v, b), args.rounds) / 1000
        full = best_ns(lambda k=api_key, v=version, b=body: decoded_error_codes(k, v, b), args.rounds) / 1000
        print(f"| {label} | {len(body):,} | {len(codes)} | {scan:,.1f} | {full:,.0f} | {full / scan:,.0f}x |")

    print()
    print("| small response | body (B) | memo hit (µs) | scan (µs) |")
    print("|---|---:|---:|---:|")
    small = [
        ("Heartbeat v4", HEARTBEAT_KEY, 4, heartbeat_response()),
        ("Metadata v12, 2 topics x 3 partitions", ApiKey.METADATA, 12, metadata_response(12, 2, 3)),
        ("Metadata v12, 5 topics x 6 partitions", ApiKey.METADATA, 12, metadata_response(12, 5, 6)),
    ]
    for label, api_key, version, body in small:
        view = memoryview(body)
        response_error_codes(api_key, version, view)
        hits = _memoized_error_codes.cache_info().hits
        memo = best_ns(lambda k=api_key, v=version, b=view: response_error_codes(k, v, b), args.rounds) / 1000
        assert _memoized_error_codes.cache_info().hits > hits
        scan = best_ns(lambda k=api_key, v=version, b=view: scan_error_codes(k, v, b), args.rounds) / 1000
        print(f"| {label} | {len(body):,} | {memo:,.2f} | {scan:,.2f} |")


if __name__ == "__main__":
    main()
