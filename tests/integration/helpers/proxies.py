"""The type of the `start_proxy` fixture (tests/integration/conftest.py), and a `kqp serve`
started from a TLS config file."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from harness.local_kafka import KafkaHarnessError
from harness.proxy_process import ProxyProcess

ProxyFactory = Callable[..., ProxyProcess]


class TlsProxyProcess(ProxyProcess):
    """`kqp serve` with a config file; ready once /readyz says it discovered the broker over TLS."""

    def __init__(self, upstream: str, log_path: Path, config: Path, per_broker_ports: bool = True,
                 bind_host: str = "127.0.0.1", ports: tuple[int, int] | None = None) -> None:
        super().__init__(upstream, log_path, config=config, per_broker_ports=per_broker_ports, bind_host=bind_host,
                         ports=ports)

    def wait_ready(self, timeout_s: float = 30.0) -> TlsProxyProcess:
        assert self.process is not None, "launch() first"
        deadline = time.monotonic() + timeout_s
        while not (self._endpoint_up() and self.readyz() == 200):
            if self.process.poll() is not None:
                raise KafkaHarnessError(f"kqp serve exited with {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise KafkaHarnessError(f"kqp serve not ready after {timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(0.05)
        return self
