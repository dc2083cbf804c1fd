"""analyze and whatif on a real capture: clients -> `kqp serve` (quotas on, capture on) -> real Kafka.

The figures are checked against what the clients themselves know (records sent and read),
against the capture read with pandas, and the what-if is calibrated against the throttles the
proxy actually applied while capturing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.dataset as ds
import pytest

from harness.local_kafka import KafkaCluster
from harness.proxy_process import ProxyProcess
from kqp.spark_jobs.analyze import AnalyzeOptions, run_analyze
from kqp.spark_jobs.common import Progress
from kqp.spark_jobs.whatif import WhatIfOptions, run_whatif

pytestmark = pytest.mark.spark

TOPIC = "captured-events"
PARTITIONS = 3
MESSAGES = 1_500
MESSAGE_BYTES = 1_000
# Low enough that the producer and the consumer are both throttled by the proxy; a short
# quota window (2 x 1 s) keeps each throttle, and so the test, short.
QUOTAS_YAML = """\
quotas:
  window_num: 2
  window_size_seconds: 1
  entries:
    - entity: {client-id: "<default>"}
      producer_byte_rate: 250000
      consumer_byte_rate: 600000
"""


class CapturingProxy(ProxyProcess):
    """`kqp serve` with a quota config and capture on."""

    def __init__(self, upstream: str, log_path: Path, config: Path, capture: Path) -> None:
        super().__init__(upstream, log_path)
        self.extra = ["--config", str(config), "--capture-dir", str(capture)]

    def command(self) -> list[str]:
        return [*super().command(), *self.extra]


@pytest.fixture(scope="module")
def real_capture(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from confluent_kafka import Consumer, Producer

    work = tmp_path_factory.mktemp("real-capture")
    config = work / "quotas.yaml"
    config.write_text(QUOTAS_YAML)
    kafka.create_topic(TOPIC, partitions=PARTITIONS, replication=1)
    proxy = CapturingProxy(kafka.bootstrap, work / "proxy.log", config, work / "capture")
    proxy.start()
    try:
        delivered: list[int] = []
        producer = Producer(
            {"bootstrap.servers": proxy.bootstrap, "client.id": "loader", "linger.ms": 5, "batch.size": 32_768}
        )
        for index in range(MESSAGES):
            producer.produce(
                TOPIC,
                value=b"x" * MESSAGE_BYTES,
                partition=index % PARTITIONS,
                on_delivery=lambda error, _m: delivered.append(0 if error is None else 1),
            )
            producer.poll(0)
        assert producer.flush(120) == 0
        consumer = Consumer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "group.id": "capture-readers",
                "client.id": "reader",
                "auto.offset.reset": "earliest",
                "max.partition.fetch.bytes": 32_768,
            }
        )
        consumer.subscribe([TOPIC])
        read = 0
        deadline = time.monotonic() + 120
        while read < MESSAGES and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                read += 1
        consumer.close()
    finally:
        assert proxy.stop() == 0  # a clean stop closes the capture files
    rows = ds.dataset(str(work / "capture"), format="parquet", partitioning="hive").to_table().to_pandas()
    return {"dir": work / "capture", "config": config, "rows": rows, "delivered": delivered, "read": read}


def test_capture_holds_what_the_clients_did(real_capture: dict[str, Any]) -> None:
    rows = real_capture["rows"]
    assert real_capture["delivered"] == [0] * MESSAGES and real_capture["read"] == MESSAGES
    # Every acknowledged record went through the proxy: the captured Produce requests carry at
    # least the payload bytes (uncompressed), and the reader's Fetch responses at least as much.
    loader, reader = rows[rows["client_id"] == "loader"], rows[rows["client_id"] == "reader"]
    assert loader[loader["api_key"] == 0]["request_bytes"].sum() > MESSAGES * MESSAGE_BYTES
    assert reader[reader["api_key"] == 1]["response_bytes"].sum() > MESSAGES * MESSAGE_BYTES
    assert (loader["proxy_throttle_ms"] > 0).any()


def test_analyze_on_the_real_capture(spark: Any, real_capture: dict[str, Any], tmp_path: Path) -> None:
    rows = real_capture["rows"]
    options = AnalyzeOptions(capture=str(real_capture["dir"]), output=str(tmp_path), replication_factor=1)
    result = run_analyze(spark, options, Progress("analyze", 9))
    stats = result.tables["throughput_stats"]
    seconds = rows["ts_request_received_us"] // 1_000_000
    produce = rows["request_bytes"].where(rows["api_key"] == 0, 0).groupby(seconds).sum()
    produce = produce.reindex(range(seconds.min(), seconds.max() + 1), fill_value=0)
    row = stats[
        (stats["resolution"] == "1s")
        & (stats["scenario"] == "observed")
        & (stats["scope"] == "cluster")
        & (stats["metric"] == "produce_bytes")
    ].iloc[0]
    assert row["max"] == produce.max()
    assert row["p50"] == pytest.approx(produce.quantile(0.5))
    assert row["mean"] == pytest.approx(produce.mean())
    assert result.summary["coverage"]["requests"] == len(rows)
    clients = result.tables["shares"].query("dimension == 'client_id'").set_index("entity")
    fetched = rows[rows["api_key"] == 1].groupby("client_id")["response_bytes"].sum()
    assert clients.loc["reader", "fetch_bytes"] == fetched["reader"]
    throttles = result.tables["throttles"].set_index("client_id")
    recorded = rows.groupby("client_id")["proxy_throttle_ms"].sum()
    assert throttles.loc["loader", "proxy_throttle_ms_total"] == recorded["loader"]


def test_whatif_calibrates_against_the_proxy_throttles(
    spark: Any, real_capture: dict[str, Any], tmp_path: Path
) -> None:
    options = WhatIfOptions(
        capture=str(real_capture["dir"]), quotas=str(real_capture["config"]), output=str(tmp_path), calibrate=True
    )
    calibration = run_whatif(spark, options)["summary"]["calibration"]
    rows: pd.DataFrame = real_capture["rows"]
    assert calibration["recorded_throttled_requests"] == (rows["proxy_throttle_ms"] > 0).sum() > 0
    # The capture (schema v2) holds the engine's exact inputs and the order of its calls, and
    # the what-if replays them through the same recording rules and engine: every decision
    # agrees and the throttle totals are equal to the millisecond.
    assert rows["quota_broker"].notna().all()
    assert calibration["agreement"] == 1.0
    assert calibration["simulated_throttle_ms_total"] == calibration["recorded_throttle_ms_total"]
    assert calibration["total_relative_error"] == 0.0
