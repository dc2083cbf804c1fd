"""The docker-compose stack, checked without Docker: structure, pinned images, loopback ports,
files it mounts, and a dashboard whose queries use metrics the proxy really exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from harness.local_kafka import KAFKA_VERSION
from kqp.proxy.metrics import ProxyMetrics
from tests.unit.helpers.metrics import registered_metric_names

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "config/grafana/dashboards/kqp-overview.json"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_yaml(REPO / "docker-compose.yml")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def proxy_config() -> dict[str, Any]:
    return load_yaml(REPO / "config/compose/kqp.yaml")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())  # type: ignore[no-any-return]


def bind_mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> host path (relative to the repo) for the service's bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith("./"):
            mounts[target] = source
    return mounts


def published(service: dict[str, Any]) -> dict[int, str]:
    """Container port -> host address of each published port."""
    ports = {}
    for spec in service.get("ports", []):
        host_ip, host_port, container_port = str(spec).split(":")
        assert host_port == container_port
        ports[int(container_port)] = host_ip
    return ports


def test_the_four_services(services: dict[str, Any]) -> None:
    assert set(services) == {"kafka", "kqp", "prometheus", "grafana"}


def test_images_are_pinned_and_kafka_is_the_official_image_the_tests_run(services: dict[str, Any]) -> None:
    for name, service in services.items():
        if "build" in service:
            continue
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and tag and tag != "latest", f"{name}: image {image} is not pinned"
    repository, _, tag = services["kafka"]["image"].rpartition(":")
    assert repository == "apache/kafka"
    # The stack users try is the Kafka the integration tests run against.
    assert tag == KAFKA_VERSION


def test_kafka_runs_kraft_combined_without_zookeeper(services: dict[str, Any]) -> None:
    environment = services["kafka"]["environment"]
    assert set(environment["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert environment["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{environment['KAFKA_NODE_ID']}@kafka:9093"
    assert not any("ZOOKEEPER" in key for key in environment)
    assert "healthcheck" in services["kafka"]


def test_every_published_port_is_bound_to_loopback(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for port, host_ip in published(service).items():
            assert host_ip == "127.0.0.1", f"{name}: port {port} published on {host_ip}"


def test_bind_mounts_point_at_files_in_the_repository(services: dict[str, Any]) -> None:
    mounted = 0
    for name, service in services.items():
        for target, source in bind_mounts(service).items():
            assert (REPO / source).exists(), f"{name}: {source} (mounted at {target}) is missing"
            mounted += 1
    assert mounted >= 5


def test_proxy_is_built_here_and_reads_the_compose_config(services: dict[str, Any]) -> None:
    proxy = services["kqp"]
    assert proxy["build"]["context"] == "."
    dockerfile = (REPO / proxy["build"]["dockerfile"]).read_text()
    assert dockerfile.startswith("# ") and "\nFROM python:3.11-slim\n" in dockerfile
    # A build stage with the compiler makes the compiled wheel; the slim run stage installs it
    # and refuses to be built with the pure one.
    assert "\nFROM python:3.11-slim AS build\n" in dockerfile and "gcc" in dockerfile
    assert "pip wheel --no-cache-dir --no-deps --wheel-dir /wheels ." in dockerfile
    run_stage = dockerfile.split("\nFROM python:3.11-slim\n", 1)[1]
    assert "COPY --from=build /wheels /wheels" in run_stage and "kqp.BUILD != 'compiled'" in run_stage
    config_path = proxy["command"][proxy["command"].index("--config") + 1]
    assert bind_mounts(proxy)[config_path] == "./config/compose/kqp.yaml"
    assert proxy["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_proxy_ports_match_its_config(services: dict[str, Any], proxy_config: dict[str, Any]) -> None:
    ports = published(services["kqp"])
    proxy = proxy_config["proxy"]
    assert proxy["bootstrap_port"] in ports
    node_id = int(services["kafka"]["environment"]["KAFKA_NODE_ID"])
    assert proxy["node_port_base"] + node_id in ports
    assert proxy_config["metrics"]["port"] in ports
    assert proxy_config["upstream"]["bootstrap_servers"] == ["kafka:9092"]
    # Inside its container the proxy must listen beyond loopback for the published ports to work.
    assert proxy["bind_host"] == "0.0.0.0"
    assert proxy_config["metrics"]["host"] == "0.0.0.0"


def test_prometheus_scrapes_the_proxy_metrics_port(services: dict[str, Any], proxy_config: dict[str, Any]) -> None:
    mounts = bind_mounts(services["prometheus"])
    prometheus = load_yaml(REPO / mounts["/etc/prometheus/prometheus.yml"])
    [job] = prometheus["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [f"kqp:{proxy_config['metrics']['port']}"]


def test_prometheus_finds_its_alerting_rules_in_the_container(services: dict[str, Any]) -> None:
    mounts = bind_mounts(services["prometheus"])
    prometheus = load_yaml(REPO / mounts["/etc/prometheus/prometheus.yml"])
    assert prometheus["rule_files"]
    for rule_file in prometheus["rule_files"]:
        in_container = f"/etc/prometheus/{rule_file}"  # relative to the config file's directory
        directory, name = in_container.rsplit("/", 1)
        assert (REPO / mounts[directory] / name).exists(), in_container


def test_grafana_provisions_the_datasource_and_dashboard(services: dict[str, Any], dashboard: dict[str, Any]) -> None:
    mounts = bind_mounts(services["grafana"])
    datasources = load_yaml(REPO / mounts["/etc/grafana/provisioning/datasources"] / "prometheus.yaml")
    [datasource] = datasources["datasources"]
    assert datasource["url"] == "http://prometheus:9090"
    providers = load_yaml(REPO / mounts["/etc/grafana/provisioning/dashboards"] / "kqp.yaml")
    [provider] = providers["providers"]
    dashboards_dir = provider["options"]["path"]
    assert (REPO / mounts[dashboards_dir] / DASHBOARD.name).exists()
    uids = {panel["datasource"]["uid"] for panel in dashboard["panels"] if "datasource" in panel}
    assert uids == {datasource["uid"]}


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    queries += [variable["definition"] for variable in dashboard["templating"]["list"]]
    return queries


def test_dashboard_queries_use_metrics_the_proxy_registers(dashboard: dict[str, Any]) -> None:
    known = registered_metric_names(ProxyMetrics(CollectorRegistry()))
    queries = dashboard_queries(dashboard)
    used = {name for query in queries for name in re.findall(r"\bkqp_[a-z0-9_]+", query)}
    assert used, "the dashboard queries no kqp metric"
    assert used <= known, f"unknown metrics in the dashboard: {sorted(used - known)}"


def test_dashboard_and_alerts_take_each_counters_rate_before_summing(dashboard: dict[str, Any]) -> None:
    """A per-client series pauses while its pair is out of the top N (docs/metrics.md, "Label
    cardinality"), so only rates summed after the fact stay right across re-ranks: every counter
    (and histogram bucket) a query names must be the argument of rate() or increase() itself."""
    rules = load_yaml(REPO / "config/prometheus/kqp-alerts.yml")
    queries = dashboard_queries(dashboard) + [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    counters = 0
    for query in queries:
        for match in re.finditer(r"\bkqp_[a-z0-9_]+_(?:total|bucket)\b", query):
            counters += 1
            # label_values() (the client_id variable) only lists label values.
            assert re.search(r"\b(?:rate|increase|label_values)\(\s*$", query[: match.start()]), (match.group(), query)
    assert counters > 0


def test_dashboard_covers_what_operators_need(dashboard: dict[str, Any]) -> None:
    queries = "\n".join(dashboard_queries(dashboard))
    for needed in (
        "kqp_client_request_bytes_total",  # throughput per client
        "kqp_throttle_time_seconds_total",  # throttle time per client
        'kqp_quota_usage{client_id=~"$client_id"} / kqp_quota_limit',  # quota usage % of limit
        "kqp_request_proxy_latency_seconds_bucket",  # latency added by the proxy
        "kqp_connections_open",
        "kqp_request_errors_total",
    ):
        assert needed in queries
    panel_ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(panel_ids) == len(set(panel_ids))


def test_the_dashboard_has_a_guard_row_charting_every_guard_metric_the_proxy_exports(
        dashboard: dict[str, Any]) -> None:
    """Issue 41: the cluster guard's row names the guard's metrics as the proxy registers them, all of
    them (tests/integration/test_guard.py queries the row through Prometheus while the guard limits)."""
    panels = dashboard["panels"]
    [row] = [index for index, panel in enumerate(panels)
             if panel["type"] == "row" and panel["title"].startswith("Cluster guard")]
    following = [index for index, panel in enumerate(panels) if panel["type"] == "row" and index > row]
    in_row = panels[row + 1:following[0] if following else len(panels)]
    queries = [target["expr"] for panel in in_row for target in panel.get("targets", [])]
    charted = {name for query in queries for name in re.findall(r"\bkqp_guard_[a-z0-9_]+", query)}
    exported = {name for name in registered_metric_names(ProxyMetrics(CollectorRegistry()))
                if name.startswith("kqp_guard_")}
    assert charted == exported
    assert {"kqp_guard_active", "kqp_guard_load_bytes_per_second"} <= charted
