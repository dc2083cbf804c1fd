"""Helpers shared by the Spark tests (see docs/testing.md): the synthetic capture's spec, its
partitions exploded with pandas, and a quota config for the what-if jobs."""

from __future__ import annotations

import pandas as pd

from harness.local_kafka import SHORT_RUN_JVM_OPTIONS
from kqp.spark_jobs.synthetic import SyntheticSpec

# The options of every JVM the Spark tests start: the local session's driver (conftest.py) and the
# standalone cluster's master, worker, drivers and executors. C1 alone, no C2, and the serial
# collector (harness.local_kafka.SHORT_RUN_JVM_OPTIONS, as Kafka's short-lived tools run): on the tests' small
# captures a fresh JVM spends more CPU compiling with C2 and in G1's concurrent threads than it
# gets back (the 40 local-session tests beside: 171 s of CPU before, 106 s after), and the Spark
# tests beside the real-time ones get only the CPU those leave (docs/testing.md, "What that took
# off the suite's length"). No figure a test checks depends on the JIT or the collector.
TEST_JVM_OPTIONS = " ".join(SHORT_RUN_JVM_OPTIONS)

SPEC = SyntheticSpec(requests=12_000, seconds=90, brokers=3, clients=10, principals=4, topics=5, seed=11)


def exploded(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (request, partition) entry, with the request's columns."""
    with_parts = rows[rows["partitions"].notna()][
        ["api_key", "client_id", "upstream_node_id", "ts_request_received_us", "partitions"]
    ]
    flat = with_parts.explode("partitions").dropna(subset=["partitions"])
    details = pd.DataFrame(list(flat["partitions"]), index=flat.index)
    return pd.concat([flat.drop(columns="partitions"), details], axis=1)


QUOTAS_YAML = """\
quotas:
  entries:
    - entity: {client-id: "<default>"}
      producer_byte_rate: 40000
      consumer_byte_rate: 60000
    - entity: {user: "tenant-1"}
      producer_byte_rate: 15000
"""
