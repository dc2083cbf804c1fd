"""Prometheus for real: Debian's `prometheus` scrapes a proxy that throttles a client, and every
query of the Grafana dashboard returns a series. promtool checks the shipped Prometheus config
and alerting rules, and runs the rules' unit tests.

`make system-deps` installs the `prometheus` package (it ships `promtool` too).
"""

from __future__ import annotations

import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from harness.local_kafka import KafkaCluster
from tests.integration.helpers.prometheus import (
    PROMETHEUS_YML,
    REPO,
    SCRAPE_INTERVAL_S,
    Prometheus,
    dashboard_queries,
    scraping,
)
from tests.integration.helpers.quota_proxy import ConfiguredProxy

pytestmark = pytest.mark.integration

RULES_DIR = REPO / "config" / "prometheus"
THROTTLED = "prom-throttled"
ADMIN = "prom-admin"
PRODUCE_QUOTA = 64 * 1024  # bytes/s: a 1 MiB burst is over it at once


def promtool(*args: str, cwd: Path = REPO) -> str:
    result = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False)
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def test_promtool_accepts_the_shipped_config_and_its_rules() -> None:
    output = promtool("check", "config", str(PROMETHEUS_YML))
    assert "SUCCESS: 4 rules found" in output


def test_promtool_runs_the_alerting_rules_unit_tests() -> None:
    assert "SUCCESS" in promtool("test", "rules", "kqp-alerts.test.yml", cwd=RULES_DIR)


@pytest.fixture
def throttling_proxy(kafka_1node: KafkaCluster, tmp_path: Path) -> Iterator[ConfiguredProxy]:
    config = tmp_path / "kqp.yaml"
    config.write_text(
        f"capture:\n  enabled: true\n  directory: {tmp_path / 'capture'}\n"
        "quotas:\n  entries:\n"
        f"    - entity: {{client-id: {THROTTLED}}}\n      producer_byte_rate: {PRODUCE_QUOTA}\n"
        f"    - entity: {{client-id: {ADMIN}}}\n      controller_mutation_rate: 100\n"
    )
    proxy = ConfiguredProxy(kafka_1node.bootstrap, tmp_path / "proxy.log", config)
    proxy.start()
    try:
        yield proxy
    finally:
        code = proxy.stop()
        assert code == 0, f"proxy exit code {code}:\n{proxy.log_tail()}"


@pytest.fixture
def prometheus(throttling_proxy: ConfiguredProxy, tmp_path: Path) -> Iterator[Prometheus]:
    """The shipped config, pointed at the test's proxy, scraping every second."""
    with scraping(throttling_proxy.metrics_port, tmp_path) as server:
        yield server


def drive_traffic(proxy: ConfiguredProxy, topic: str) -> None:
    """A throttled producer, topic creations under a mutation quota (one refused: an error code in
    a response), and a frame the proxy rejects."""
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap, "client.id": ADMIN})
    for expect_error in (False, True):
        [future] = admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)]).values()
        if expect_error:
            with pytest.raises(Exception, match="already exists"):
                future.result(timeout=30)
        else:
            future.result(timeout=30)
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "client.id": THROTTLED, "linger.ms": 5})
    for _ in range(1024):
        producer.produce(topic, b"x" * 1024)
        producer.poll(0)
    assert producer.flush(60) == 0
    del producer, admin  # closes their connections now, not when the proxy is already gone
    # A frame announcing 2 GiB: the proxy refuses it and closes the connection.
    with socket.create_connection(("127.0.0.1", proxy.bootstrap_port), timeout=10) as raw:
        raw.sendall(struct.pack(">i", 2**31 - 1) + b"\0" * 16)
        assert raw.recv(1) == b""


def test_prometheus_answers_every_dashboard_query(
    throttling_proxy: ConfiguredProxy, prometheus: Prometheus, topic_name: str
) -> None:
    drive_traffic(throttling_proxy, topic_name)
    # The cluster guard's row charts series that exist only while the opt-in guard runs (and its
    # per-entity ones only while it limits someone): tests/integration/test_guard.py queries them
    # from a proxy running the guard. Every other panel must be answered here.
    queries = [expr for expr in dashboard_queries() if "kqp_guard_" not in expr]
    assert len(queries) >= 20
    unanswered = queries
    deadline = time.monotonic() + 60
    while unanswered and time.monotonic() < deadline:
        unanswered = [expr for expr in queries if not prometheus.get("/api/v1/query", query=expr)["data"]["result"]]
        if unanswered:
            time.sleep(SCRAPE_INTERVAL_S)
    assert unanswered == [], f"queries without a series: {unanswered}"
    # The scrape target is up, and the throttled client shows as throttled.
    [up] = prometheus.get("/api/v1/query", query='up{job="kqp"}')["data"]["result"]
    assert up["value"][1] == "1"
    throttled = prometheus.get("/api/v1/query", query=f'kqp_throttles_total{{client_id="{THROTTLED}"}}')
    assert sum(float(series["value"][1]) for series in throttled["data"]["result"]) >= 1
    # The alerting rules are loaded and evaluated.
    groups = prometheus.get("/api/v1/rules")["data"]["groups"]
    assert {rule["name"] for group in groups for rule in group["rules"]} == {
        "KqpClientMostlyThrottled", "KqpCaptureDroppingRecords", "KqpUpstreamUnreachable", "KqpConfigReloadFailed"}
