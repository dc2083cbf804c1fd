"""HAProxy in TCP mode in front of several `kqp serve` instances: how a fleet runs in production
(docs/scaling.md), on loopback.

Every instance listens on the same ports on an address of its own (127.0.0.11, .12, ...) and
advertises the balancer's address, so a client stays on the balancer for every broker, and
any connection may land on any instance. HAProxy checks each instance every 200 ms and cuts
the sessions of one that stops answering, so its clients reconnect through the others.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from harness.local_kafka import KafkaHarnessError, terminate

CHECK_INTERVAL_MS = 200
# Failed checks in a row that mark an instance down (and as many good ones bring it back).
CHECK_FALL = 2


def haproxy_config(listen_host: str, ports: Sequence[int], instance_hosts: Sequence[str],
                   server_options: str = "") -> str:
    """`server_options` go on every server line, e.g. `send-proxy-v2 source 127.0.0.20` (the PROXY
    protocol, from a source address of the balancer's own)."""
    lines = [
        "global",
        "    maxconn 4096",
        "defaults",
        "    mode tcp",
        "    timeout connect 2s",
        "    timeout client 5m",
        "    timeout server 5m",
        # A connection refused by a dead instance is retried on another one.
        "    retries 2",
        "    option redispatch",
    ]
    for port in ports:
        lines += [f"listen port-{port}", f"    bind {listen_host}:{port}", "    balance roundrobin"]
        lines += [f"    server instance-{index} {host}:{port} check inter {CHECK_INTERVAL_MS}ms"
                  f" fall {CHECK_FALL} rise {CHECK_FALL} on-marked-down shutdown-sessions {server_options}".rstrip()
                  for index, host in enumerate(instance_hosts)]
    return "\n".join(lines) + "\n"


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


class LoadBalancer:
    """`haproxy` as a child process, listening on `listen_host` at each of `ports`."""

    def __init__(self, listen_host: str, ports: Sequence[int], instance_hosts: Sequence[str], workdir: Path,
                 server_options: str = "") -> None:
        self.listen_host = listen_host
        self.ports = list(ports)
        self.config_path = workdir / "haproxy.cfg"
        self.log_path = workdir / "haproxy.log"
        self.config_path.write_text(haproxy_config(listen_host, ports, instance_hosts, server_options))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 15.0) -> LoadBalancer:
        with self.log_path.open("ab") as log:
            # -db: stay in the foreground, so the process is ours to stop.
            self.process = subprocess.Popen(["haproxy", "-db", "-f", str(self.config_path)],
                                            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while not all(_accepts(self.listen_host, port) for port in self.ports):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise KafkaHarnessError(f"haproxy not listening on {self.listen_host}:{self.ports}:\n"
                                        f"{self.log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        terminate(self.process)
