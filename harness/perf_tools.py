"""Kafka's own load generators (ProducerPerformance, ConsumerPerformance), run and parsed."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.local_kafka import KafkaCluster, KafkaHarnessError

_PRODUCER_SUMMARY = re.compile(
    r"(?P<records>\d+) records sent, (?P<rps>[\d.]+) records/sec \((?P<mbps>[\d.]+) MB/sec\), "
    r"(?P<avg>[\d.]+) ms avg latency, (?P<max>[\d.]+) ms max latency, (?P<p50>\d+) ms 50th, "
    r"(?P<p95>\d+) ms 95th, (?P<p99>\d+) ms 99th, (?P<p999>\d+) ms 99.9th"
)
# With --print-metrics both tools end by listing the client's metrics, among them how many
# requests the client sent in all (every API, every node: what a proxy in its path relayed).
_REQUEST_TOTAL = re.compile(r"^(?:producer|consumer)-metrics:request-total:\{[^}]*\}\s*:\s*(?P<count>[\d.]+)\s*$",
                            re.MULTILINE)


@dataclass(frozen=True)
class ProducerResult:
    records: int
    records_per_s: float
    mb_per_s: float
    avg_latency_ms: float
    max_latency_ms: float
    p50_ms: float
    p99_ms: float
    output: str


@dataclass(frozen=True)
class ConsumerResult:
    records: int
    mb: float
    mb_per_s: float
    records_per_s: float
    output: str


def _props(props: dict[str, str]) -> list[str]:
    return [f"{key}={value}" for key, value in props.items()]


def producer_perf_command(cluster: KafkaCluster, bootstrap: str, topic: str, num_records: int,
                          record_size: int, props: dict[str, str] | None = None, throughput: int = -1,
                          config_file: Path | None = None, payload_file: Path | None = None,
                          payload_monotonic: bool = False, print_metrics: bool = False) -> list[str]:
    """--payload-monotonic sends the values "0" .. str(num_records - 1), which a reader can verify."""
    args = ["--topic", topic, "--num-records", str(num_records), "--throughput", str(throughput)]
    if print_metrics:
        args.append("--print-metrics")
    if payload_monotonic:
        args.append("--payload-monotonic")
    elif payload_file is not None:
        args += ["--payload-file", str(payload_file)]
    else:
        args += ["--record-size", str(record_size)]
    args += ["--producer-props", f"bootstrap.servers={bootstrap}", *_props(props or {})]
    if config_file is not None:
        args += ["--producer.config", str(config_file)]
    return cluster.tool_command("org.apache.kafka.tools.ProducerPerformance", *args)


def parse_producer_output(output: str) -> ProducerResult:
    matches = list(_PRODUCER_SUMMARY.finditer(output))
    if not matches:
        raise KafkaHarnessError(f"no ProducerPerformance summary in output:\n{output[-2000:]}")
    m = matches[-1]
    return ProducerResult(int(m["records"]), float(m["rps"]), float(m["mbps"]), float(m["avg"]),
                          float(m["max"]), float(m["p50"]), float(m["p99"]), output)


def producer_perf(cluster: KafkaCluster, bootstrap: str, topic: str, num_records: int, record_size: int,
                  props: dict[str, str] | None = None, throughput: int = -1, config_file: Path | None = None,
                  timeout: float = 600.0, payload_monotonic: bool = False,
                  print_metrics: bool = False) -> ProducerResult:
    command = producer_perf_command(cluster, bootstrap, topic, num_records, record_size, props, throughput,
                                    config_file, payload_monotonic=payload_monotonic, print_metrics=print_metrics)
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise KafkaHarnessError(f"ProducerPerformance failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return parse_producer_output(result.stdout)


def consumer_perf_command(cluster: KafkaCluster, bootstrap: str, topic: str, num_records: int,
                          group: str | None = None, props_file: Path | None = None,
                          timeout_ms: int = 60000, print_metrics: bool = False) -> list[str]:
    args = ["--bootstrap-server", bootstrap, "--topic", topic, "--num-records", str(num_records),
            "--timeout", str(timeout_ms)]
    if print_metrics:
        args.append("--print-metrics")
    if group is not None:
        args += ["--group", group]
    if props_file is not None:
        args += ["--command-config", str(props_file)]
    return cluster.tool_command("org.apache.kafka.tools.ConsumerPerformance", *args)


def parse_consumer_output(output: str) -> ConsumerResult:
    lines = [line for line in output.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if line.startswith("start.time") and index + 1 < len(lines):
            values = [v.strip() for v in lines[index + 1].split(",")]
            return ConsumerResult(records=int(values[4]), mb=float(values[2]), mb_per_s=float(values[3]),
                                  records_per_s=float(values[5]), output=output)
    raise KafkaHarnessError(f"no ConsumerPerformance result in output:\n{output[-2000:]}")


def consumer_perf(cluster: KafkaCluster, bootstrap: str, topic: str, num_records: int, group: str | None = None,
                  props_file: Path | None = None, timeout: float = 600.0,
                  print_metrics: bool = False) -> ConsumerResult:
    command = consumer_perf_command(cluster, bootstrap, topic, num_records, group, props_file,
                                    print_metrics=print_metrics)
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise KafkaHarnessError(f"ConsumerPerformance failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return parse_consumer_output(result.stdout)


def client_requests(output: str) -> int:
    """Requests the client sent in all, from a tool run with print_metrics=True."""
    match = _REQUEST_TOTAL.search(output)
    if match is None:
        raise KafkaHarnessError(f"no request-total metric in the tool's output:\n{output[-2000:]}")
    return int(float(match["count"]))
