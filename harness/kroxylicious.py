"""Kroxylicious, the open-source Kafka proxy on Netty, as a child process beside a local cluster,
for bench/proxy_throughput.py's side-by-side comparison (never for the test suite).

Kroxylicious 0.12.0 is the newest release whose jars Maven Central serves here, and only its
runtime library is served, not the `kroxylicious-app` that carries its command line. So:

- `ensure_runtime()` assembles `io.kroxylicious:kroxylicious-runtime` and its runtime
  dependencies into .cache/kroxylicious-0.12.0/libs with Maven (harness/kroxylicious-pom.xml,
  the way harness/pom.xml assembles Kafka), and compiles our own launcher
  (harness/java/KroxyliciousLauncher.java) there with javac. It runs only when a caller asks
  for Kroxylicious: `make setup` and the tests never download it.
- `proxy_config()` writes the runtime's configuration: one virtual cluster in front of the
  cluster, no filters, a `portIdentifiesNode` gateway so every broker address the clients see
  is rewritten to a proxy port (bootstrap on one port, node N on the port for N), and the
  Prometheus endpoint on loopback for the proxy's own request count.
- `KroxyliciousProcess` starts the JVM, waits for an ApiVersions round trip through the proxy
  (which proves it forwards to the broker), and reports its CPU from /proc like kqp's and the
  relay's.

Unlike kqp, the 0.12.0 gateway has no bind-address setting and would listen on every
interface. Every server the harness starts binds to loopback only, so the JVM runs with a
small shim of ours in LD_PRELOAD (harness/c/loopback_bind.c, compiled with the system's C
compiler into the same cache) that turns a bind() to the wildcard address into one to
127.0.0.1. Its management endpoint is put on 127.0.0.1 by its own setting.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from harness.local_kafka import REPO, KafkaHarnessError, api_versions_ok, free_ports, terminate
from harness.proxy_process import free_port_block, process_cpu_seconds

KROXYLICIOUS_VERSION = "0.12.0"
DEFAULT_KROXYLICIOUS_DIR = REPO / ".cache" / f"kroxylicious-{KROXYLICIOUS_VERSION}"
_POM = REPO / "harness" / "kroxylicious-pom.xml"
_LAUNCHER_SOURCE = REPO / "harness" / "java" / "KroxyliciousLauncher.java"
_LAUNCHER_CLASS = "KroxyliciousLauncher"
_LOOPBACK_SHIM_SOURCE = REPO / "harness" / "c" / "loopback_bind.c"
# The proxy's own count of requests read from clients, one sample per API key and node.
REQUESTS_METRIC = "kroxylicious_inbound_downstream_messages_total"


def ensure_runtime(directory: Path = DEFAULT_KROXYLICIOUS_DIR) -> Path:
    """The runtime's jars and the compiled launcher under `directory`, fetched and built once."""
    libs = directory / "libs"
    if not (libs / ".complete").exists():
        result = subprocess.run(["mvn", "-B", "-q", "-f", str(_POM), "dependency:copy-dependencies",
                                 f"-Dkqp.kroxylicious.dir={directory}"],
                                capture_output=True, text=True, timeout=900, check=False)
        if result.returncode != 0:
            raise KafkaHarnessError(f"resolving Kroxylicious {KROXYLICIOUS_VERSION} from Maven failed:\n"
                                    f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        (libs / ".complete").touch()
    classes = directory / "launcher"
    compiled = classes / f"{_LAUNCHER_CLASS}.class"
    if not compiled.exists() or compiled.stat().st_mtime < _LAUNCHER_SOURCE.stat().st_mtime:
        classes.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(["javac", "-d", str(classes), "-cp", str(libs / "*"), str(_LAUNCHER_SOURCE)],
                                capture_output=True, text=True, timeout=300, check=False)
        if result.returncode != 0:
            raise KafkaHarnessError(f"compiling {_LAUNCHER_SOURCE.name} failed:\n{result.stderr[-3000:]}")
    shim = loopback_shim_path(directory)
    if not shim.exists() or shim.stat().st_mtime < _LOOPBACK_SHIM_SOURCE.stat().st_mtime:
        result = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(shim), str(_LOOPBACK_SHIM_SOURCE), "-ldl"],
                                capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            raise KafkaHarnessError(f"compiling {_LOOPBACK_SHIM_SOURCE.name} failed (a C compiler is needed to keep "
                                    f"Kroxylicious on loopback):\n{result.stderr[-3000:]}")
    return directory


def loopback_shim_path(directory: Path) -> Path:
    return directory / "launcher" / "libloopback_bind.so"


def proxy_config(upstream_bootstrap: str, bootstrap_port: int, node_ids: list[int],
                 management_port: int) -> dict[str, object]:
    """Kroxylicious' configuration for one virtual cluster in front of `upstream_bootstrap`, no
    filters. Clients bootstrap on 127.0.0.1:`bootstrap_port`; the broker with the lowest id
    gets the next port, and so on up to the highest id (a gap in the ids leaves a port unused),
    so every node address in a Metadata, FindCoordinator or DescribeCluster response is one of
    the proxy's."""
    if not node_ids:
        raise ValueError("a cluster has at least one node")
    return {
        "management": {"bindAddress": "127.0.0.1", "port": management_port, "endpoints": {"prometheus": {}}},
        "virtualClusters": [{
            "name": "bench",
            "targetCluster": {"bootstrapServers": upstream_bootstrap},
            "gateways": [{
                "name": "plain",
                "portIdentifiesNode": {
                    "bootstrapAddress": f"127.0.0.1:{bootstrap_port}",
                    "advertisedBrokerAddressPattern": "127.0.0.1",
                    "nodeStartPort": bootstrap_port + 1,
                    "nodeIdRanges": [{"name": "brokers", "start": min(node_ids), "end": max(node_ids)}],
                },
            }],
            "logNetwork": False,
            "logFrames": False,
        }],
    }


def config_yaml(config: dict[str, object]) -> str:
    # JSON is YAML: the runtime's YAML parser reads it, and no YAML writer is needed here.
    return json.dumps(config, indent=2) + "\n"


def requests_total(metrics_text: str) -> int:
    """The sum of REQUESTS_METRIC over its labels, from Prometheus text exposition."""
    total = 0.0
    for line in metrics_text.splitlines():
        # The name exactly: not a longer one that starts with it (such as its _created sample).
        if line.startswith(REQUESTS_METRIC) and line[len(REQUESTS_METRIC):][:1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


class KroxyliciousStartError(KafkaHarnessError):
    pass


class KroxyliciousProcess:
    """Kroxylicious in front of `upstream_bootstrap` (the cluster's plaintext listeners), on free
    ports; a context manager that stops the JVM on exit."""

    def __init__(self, upstream_bootstrap: str, node_ids: list[int], workdir: Path,
                 directory: Path = DEFAULT_KROXYLICIOUS_DIR, heap: str = "1g") -> None:
        self.directory = ensure_runtime(directory)
        # The bootstrap port, then one per node id from the lowest to the highest, all free on
        # loopback, where the shim puts the gateway's wildcard binds.
        base = free_port_block(1 + max(node_ids) - min(node_ids) + 1)
        self.bootstrap_port = base + 1
        self.bootstrap = f"127.0.0.1:{self.bootstrap_port}"
        self.management_port = free_ports(1)[0]
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "kroxylicious.yaml"
        self.config_path.write_text(config_yaml(
            proxy_config(upstream_bootstrap, self.bootstrap_port, node_ids, self.management_port)))
        self.log_path = workdir / "kroxylicious.log"
        # The JVM's defaults apart from a fixed heap (G1, the full tiered JIT): no tuning of ours.
        self.command = ["java", f"-Xms{heap}", f"-Xmx{heap}", "-Djava.awt.headless=true",
                        "-cp", f"{self.directory / 'libs' / '*'}:{self.directory / 'launcher'}",
                        _LAUNCHER_CLASS, str(self.config_path)]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout_s: float = 120.0) -> KroxyliciousProcess:
        with self.log_path.open("ab") as log:
            environment = dict(os.environ, LD_PRELOAD=str(loopback_shim_path(self.directory)))
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, env=environment)
        deadline = time.monotonic() + timeout_s
        while not api_versions_ok("127.0.0.1", self.bootstrap_port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise KroxyliciousStartError(f"Kroxylicious did not start:\n{self.log_tail()}")
            time.sleep(0.3)
        return self

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.pid)

    def metrics_text(self) -> str:
        url = f"http://127.0.0.1:{self.management_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return str(response.read().decode())
        except urllib.error.URLError as error:
            raise KafkaHarnessError(f"Kroxylicious metrics at {url}: {error}") from error

    def requests(self) -> int:
        return requests_total(self.metrics_text())

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        terminate(self.process, timeout_s=30)

    def __enter__(self) -> KroxyliciousProcess:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
