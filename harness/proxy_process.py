"""`kqp serve` as a child process on free loopback ports, for the integration tests and benchmarks.

Readiness is an ApiVersions round trip through the proxy's bootstrap port (it proves the
proxy forwards to the upstream broker) plus an answer from its metrics endpoint, not a
sleep. Stopping sends SIGTERM and reports the exit code, so callers can insist on a clean
shutdown.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from harness.local_kafka import REPO, KafkaHarnessError, api_versions_ok, free_ports

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ProxyProcessT = TypeVar("ProxyProcessT", bound="ProxyProcess")


def free_port_block(count: int, low: int = 20000, high: int = 32000,
                    hosts: Sequence[str] = ("127.0.0.1",)) -> int:
    """A base port B such that B+1 .. B+count are free on every one of `hosts` (the proxy
    serves node N on B+N)."""
    for _ in range(200):
        base = random.randrange(low, high - count)
        sockets: list[socket.socket] = []
        try:
            for host in hosts:
                for port in range(base + 1, base + count + 1):
                    s = socket.socket()
                    sockets.append(s)
                    s.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise KafkaHarnessError(f"no block of {count} free ports between {low} and {high}")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far (0 if it has exited)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    # utime and stime are fields 14 and 15 of stat(5); [0] here is field 3.
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


class ProxyProcess:
    """One `kqp serve` child in front of `upstream` (HOST:PORT, comma-separated allowed), with
    an optional config file on top of the command-line flags and `--workers`.

    By default it listens on free ports of 127.0.0.1 and advertises them. Instances behind a
    load balancer get the same `ports` (bootstrap port, node port base) on a `bind_host` of
    their own and advertise the balancer's address. With `per_broker_ports=False` (a config
    with `proxy.sni_routing`, which refuses them) no per-broker port or address is passed.
    """

    def __init__(self, upstream: str, log_path: Path, max_node_id: int = 8, config: Path | None = None,
                 workers: int = 1, bind_host: str = "127.0.0.1", advertised_host: str | None = None,
                 ports: tuple[int, int] | None = None, per_broker_ports: bool = True) -> None:
        self.per_broker_ports = per_broker_ports
        self.upstream = [address for address in upstream.split(",") if address]
        self.log_path = log_path
        self.config = config
        self.workers = workers
        self.bind_host = bind_host
        self.advertised_host = advertised_host or bind_host
        if ports is None:
            self.bootstrap_port, self.metrics_port = free_ports(2)
            self.node_port_base = free_port_block(max_node_id)
        else:
            self.bootstrap_port, self.node_port_base = ports
            (self.metrics_port,) = free_ports(1)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.bind_host}:{self.bootstrap_port}"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise KafkaHarnessError("proxy not started")
        return self.process.pid

    def node_port(self, node_id: int) -> int:
        return self.node_port_base + node_id

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "kqp", "serve"]
        for address in self.upstream:
            command += ["--upstream", address]
        command += ["--bootstrap-port", str(self.bootstrap_port), "--bind-host", self.bind_host,
                    "--metrics-port", str(self.metrics_port)]
        if self.per_broker_ports:
            command += ["--node-port-base", str(self.node_port_base), "--advertised-host", self.advertised_host]
        if self.config is not None:
            command += ["--config", str(self.config)]
        if self.workers != 1:
            command += ["--workers", str(self.workers)]
        return command

    def start(self, timeout_s: float = 30.0) -> ProxyProcess:
        self.launch()
        return self.wait_ready(timeout_s)

    def launch(self) -> None:
        """Start the process; `wait_ready` then waits until it serves."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=REPO)

    def wait_ready(self, timeout_s: float = 30.0) -> ProxyProcess:
        assert self.process is not None, "launch() first"
        deadline = time.monotonic() + timeout_s
        # The metrics endpoint opens after upstream discovery, so it is the later of the two.
        while not (api_versions_ok(self.bind_host, self.bootstrap_port, timeout=2.0) and self._endpoint_up()):
            if self.process.poll() is not None:
                raise KafkaHarnessError(f"kqp serve exited with {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise KafkaHarnessError(f"kqp serve not answering ApiVersions after {timeout_s:.0f} s:\n"
                                        f"{self.log_tail()}")
            time.sleep(0.05)
        return self

    def _endpoint_up(self) -> bool:
        try:
            self.readyz()
        except OSError:
            return False
        return True

    def readyz(self) -> int:
        """HTTP status of the proxy's /readyz (503 until it knows an upstream broker)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/readyz", timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return str(response.read().decode())

    def cpu_seconds(self) -> float:
        """User + system CPU time the proxy has used so far (its workers' included)."""
        return sum(process_cpu_seconds(pid) for pid in self.pids())

    def pids(self) -> list[int]:
        """The proxy process and, with --workers, the worker processes it forked."""
        pids = [self.pid]
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            with_children = task / "children"
            if with_children.exists():
                pids += [int(pid) for pid in with_children.read_text().split()]
        return pids

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM, wait, and return the exit code (None if it had to be killed)."""
        if self.process is None:
            return None
        if self.process.poll() is not None:
            return self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            return None

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_path.exists():
            return "(no proxy log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_together(proxies: Sequence[ProxyProcessT], timeout_s: float = 30.0) -> list[ProxyProcessT]:
    """Launch every proxy, then wait until each serves: their start-ups (an interpreter's imports,
    the upstream's discovery, a fleet's clients) overlap rather than follow one another (three
    instances of a fleet: 0.97 s together against 1.84 s one after another, busy host). If one
    fails to start, every one launched is stopped."""
    try:
        for proxy in proxies:
            proxy.launch()
        return [proxy.wait_ready(timeout_s) for proxy in proxies]
    except BaseException:
        for proxy in proxies:
            proxy.stop()
        raise
