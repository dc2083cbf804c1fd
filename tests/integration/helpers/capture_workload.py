"""A proxy with capture switched on, and a real capture made through it for the Spark tests.

`make_real_capture(tmp_dir)` runs Kafka's own load generators through `kqp serve` with a
producer quota on one client-id, stops the proxy (SIGTERM closes and renames the files) and
returns the capture directory. The capture therefore holds proxy throttles on the throttled
client, unthrottled traffic of another, consumer Fetches (v13+, topics named by id on the
wire), consumer group requests and the CreateTopics of its topic.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds

from harness import perf_tools
from harness.local_kafka import KafkaCluster, KafkaHarnessError
from tests.integration.helpers.quota_proxy import ConfiguredProxy

# The workload of make_real_capture, for tests that check figures against it.
REAL_CAPTURE_TOPIC = "captured-orders"
REAL_CAPTURE_PARTITIONS = 2
THROTTLED_CLIENT = "limited-producer"
FREE_CLIENT = "free-producer"
CONSUMER_GROUP = "captured-readers"
RECORD_SIZE = 1024
THROTTLED_RECORDS = 4000  # 4 MB at a 256 KB/s quota: ~2.5 MB burst, then several seconds throttled
FREE_RECORDS = 1000
PRODUCER_QUOTA = 256 * 1024


@dataclass(frozen=True)
class CaptureProxyConfig:
    capture_dir: Path
    quota_entries: str = ""
    proxy_id: str = "kqp"

    def yaml(self) -> str:
        text = f"capture:\n  enabled: true\n  directory: {self.capture_dir}\n  proxy_id: {self.proxy_id}\n"
        if self.quota_entries:
            text += f"quotas:\n  entries:\n{self.quota_entries}"
        return text


def start_capture_proxy(upstream: str, work_dir: Path, config: CaptureProxyConfig) -> ConfiguredProxy:
    """`kqp serve` with capture into `config.capture_dir`; stop it (SIGTERM) to close the files."""
    work_dir.mkdir(parents=True, exist_ok=True)
    config_path = work_dir / f"{config.proxy_id}.yaml"
    config_path.write_text(config.yaml())
    proxy = ConfiguredProxy(upstream, work_dir / f"{config.proxy_id}.log", config_path)
    proxy.start()
    return proxy


def stop_cleanly(proxy: ConfiguredProxy) -> None:
    code = proxy.stop()
    if code != 0:
        raise KafkaHarnessError(f"kqp serve exited with {code} on SIGTERM:\n{proxy.log_tail()}")


def read_capture(directory: Path) -> pa.Table:
    """Every closed file of a capture, with the Hive partition columns (date, hour)."""
    return ds.dataset(directory, format="parquet", partitioning="hive").to_table()


def make_real_capture(tmp_dir: Path) -> Path:
    """Capture a throttled and an unthrottled producer and a consumer group through a proxy in
    front of a fresh 1-node Kafka; returns the capture directory (tmp_dir / "capture")."""
    with KafkaCluster(nodes=1, workdir=tmp_dir / "kafka") as cluster:
        return capture_workload(cluster, tmp_dir)


def capture_workload(cluster: KafkaCluster, tmp_dir: Path) -> Path:
    """The workload of `make_real_capture` against a running cluster (e.g. the kafka_1node fixture)."""
    capture_dir = tmp_dir / "capture"
    quota = f"    - entity: {{client-id: {THROTTLED_CLIENT}}}\n      producer_byte_rate: {PRODUCER_QUOTA}\n"
    proxy = start_capture_proxy(cluster.bootstrap, tmp_dir / "proxy",
                                CaptureProxyConfig(capture_dir, quota_entries=quota))
    try:
        cluster.create_topic(REAL_CAPTURE_TOPIC, partitions=REAL_CAPTURE_PARTITIONS, replication=1,
                             bootstrap=proxy.bootstrap)
        props = {"acks": "all", "linger.ms": "5", "batch.size": "65536"}
        for client_id, records in ((THROTTLED_CLIENT, THROTTLED_RECORDS), (FREE_CLIENT, FREE_RECORDS)):
            perf_tools.producer_perf(cluster, proxy.bootstrap, REAL_CAPTURE_TOPIC, records, RECORD_SIZE,
                                     props={**props, "client.id": client_id}, timeout=180)
        consumer_props = tmp_dir / "consumer.properties"
        consumer_props.write_text("client.id=captured-consumer\n")
        perf_tools.consumer_perf(cluster, proxy.bootstrap, REAL_CAPTURE_TOPIC, THROTTLED_RECORDS + FREE_RECORDS,
                                 group=CONSUMER_GROUP, props_file=consumer_props, timeout=180)
    except (KafkaHarnessError, subprocess.TimeoutExpired):
        proxy.stop()
        raise
    stop_cleanly(proxy)
    return capture_dir
