"""Capture records as the proxy builds them, for the capture tests."""

from __future__ import annotations

from typing import Any

# 2024-05-01T10:00:00Z in microseconds.
TEN_O_CLOCK_US = 1_714_557_600_000_000
HOUR_US = 3_600_000_000


def produce_record(
    correlation_id: int,
    ts_us: int = TEN_O_CLOCK_US,
    client_id: str = "producer-1",
    principal: str = "User:alice",
    records: int = 10,
    batch_bytes: int = 1000,
) -> dict[str, Any]:
    return {
        "ts_request_received_us": ts_us,
        "ts_request_sent_us": ts_us + 50,
        "ts_response_received_us": ts_us + 2_000,
        "ts_response_sent_us": ts_us + 2_040,
        "connection_id": 7,
        "listener": "bootstrap",
        "upstream_node_id": 1,
        "client_address": "127.0.0.1:50000",
        "principal": principal,
        "client_id": client_id,
        "api_key": 0,
        "api_version": 9,
        "correlation_id": correlation_id,
        "request_bytes": batch_bytes + 120,
        "response_bytes": 60,
        "acks": -1,
        "partitions": [
            {
                "topic": "orders",
                "partition": 0,
                "bytes": batch_bytes,
                "records": records,
                "batches": 1,
                "compression": 4,
                "error_code": 0,
            }
        ],
        "error_code": 0,
        "broker_throttle_ms": 0,
        "proxy_throttle_ms": 0,
    }


def fetch_record(correlation_id: int, ts_us: int = TEN_O_CLOCK_US, client_id: str = "consumer-1") -> dict[str, Any]:
    return {
        "ts_request_received_us": ts_us,
        "connection_id": 8,
        "principal": "User:bob",
        "client_id": client_id,
        "api_key": 1,
        "api_version": 13,
        "correlation_id": correlation_id,
        "request_bytes": 90,
        "response_bytes": 5_000,
        "fetch_max_wait_ms": 500,
        "fetch_min_bytes": 1,
        "fetch_max_bytes": 52_428_800,
        "group_id": "readers",
        "partitions": [
            {"topic": "orders", "partition": 0, "bytes": 4_900, "records": 49, "batches": 5, "compression": 0}
        ],
    }
