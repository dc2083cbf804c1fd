"""Debian's `prometheus` for the integration tests: the shipped config pointed at one proxy.

`make system-deps` installs the `prometheus` package (it ships `promtool` too). Used by the
dashboard's test (tests/integration/test_prometheus.py) and the guard's (test_guard.py), so that
both read the proxy's metrics as an operator's Prometheus and Grafana read them.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from harness.local_kafka import free_ports

REPO = Path(__file__).resolve().parents[3]
PROMETHEUS_YML = REPO / "config" / "prometheus.yml"
DASHBOARD = REPO / "config" / "grafana" / "dashboards" / "kqp-overview.json"
SCRAPE_INTERVAL_S = 1
# Grafana's $__rate_interval is at least four scrape intervals.
RATE_INTERVAL = "15s"


class Prometheus:
    """Debian's prometheus on 127.0.0.1 at a free port, its data in a temp dir."""

    def __init__(self, config: Path, data: Path, log: Path) -> None:
        [self.port] = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=out, stderr=subprocess.STDOUT)

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=5) as response:
            return json.loads(response.read())

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant query's series (each with `metric` and `value`)."""
        return self.get("/api/v1/query", query=expr)["data"]["result"]  # type: ignore[no-any-return]

    def series(self, expr: str, start: float, end: float, step_s: float = SCRAPE_INTERVAL_S) -> list[
            tuple[float, float]]:
        """(time, value) of the one series `expr` names over [start, end] (wall clock seconds)."""
        result = self.get("/api/v1/query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}",
                          step=f"{step_s:g}")["data"]["result"]
        assert len(result) == 1, f"{expr}: expected one series, got {result}"
        return [(float(at), float(value)) for at, value in result[0]["values"]]

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.process.poll() is None, f"prometheus exited:\n{self.log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            assert time.monotonic() < deadline, f"prometheus not ready:\n{self.log.read_text()[-3000:]}"
            time.sleep(0.2)

    def stop(self) -> int:
        self.process.terminate()
        return self.process.wait(timeout=30)


@contextmanager
def scraping(metrics_port: int, workdir: Path) -> Iterator[Prometheus]:
    """The shipped config, pointed at the proxy's metrics port, scraping every second."""
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    config["global"]["scrape_interval"] = config["global"]["evaluation_interval"] = f"{SCRAPE_INTERVAL_S}s"
    config["rule_files"] = [str(PROMETHEUS_YML.parent / name) for name in config["rule_files"]]
    [job] = config["scrape_configs"]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{metrics_port}"]}]
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    server = Prometheus(path, workdir / "prometheus-data", workdir / "prometheus.log")
    try:
        server.wait_ready()
        yield server
    finally:
        assert server.stop() == 0, server.log.read_text()[-3000:]


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel in the dashboard's order, a collapsed row's own panels after it."""
    pending = list(board["panels"])
    panels = []
    while pending:
        panel = pending.pop(0)
        panels.append(panel)
        pending[:0] = panel.get("panels", [])
    return panels


def dashboard_queries(row_title: str | None = None) -> list[str]:
    """The dashboard's panel targets (only those of the row whose title starts with `row_title`,
    when given) and, for the whole dashboard, its templating queries, with Grafana's variables
    filled in."""
    board = json.loads(DASHBOARD.read_text())
    exprs: list[str] = []
    in_row = row_title is None
    for panel in _panels(board):
        if panel.get("type") == "row" and row_title is not None:
            in_row = str(panel.get("title", "")).startswith(row_title)
        if in_row:
            exprs.extend(target["expr"] for target in panel.get("targets", []) if target.get("expr"))
    if row_title is None:
        for variable in board.get("templating", {}).get("list", []):
            match = re.fullmatch(r"label_values\((\w+), *(\w+)\)", variable["definition"])
            if match:  # Grafana asks for the label's values among the metric's series
                exprs.append(f"count by ({match[2]}) ({match[1]})")
    return [expr.replace("$client_id", ".*").replace("$__rate_interval", RATE_INTERVAL) for expr in exprs]
