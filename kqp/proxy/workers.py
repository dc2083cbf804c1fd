"""`kqp serve --workers N`: N proxy processes on one host, one set of ports, one budget.

Every worker binds every listener with SO_REUSEPORT, so the kernel spreads new connections
over them, and takes part in the fleet exchange (kqp.proxy.fleet) as an instance of its own,
so a client whose connections land on different workers still gets one quota. The
supervisor (the process started) forks the workers, restarts one that dies, passes SIGHUP
and SIGTERM on, and serves the operator endpoint: /metrics is every worker's, each series
labelled `worker`, so Prometheus scrapes one proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from kqp.proxy.app import ServeSetup, fleet_options, run_app
from kqp.proxy.http_endpoint import ObservabilityEndpoint

log = logging.getLogger(__name__)

_SCRAPE_TIMEOUT_S = 2.0
_RESTART_BACKOFF_S = 1.0
_REAP_INTERVAL_S = 0.2


class WorkersCollector(Collector):
    """Every worker's metrics at scrape time, each sample labelled with its worker."""

    def __init__(self, worker_ports: list[int]) -> None:
        self.worker_ports = worker_ports

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for index, port in enumerate(self.worker_ports):
            try:
                text = _get(f"http://127.0.0.1:{port}/metrics")
            except OSError as exc:
                log.warning("worker %d did not answer a scrape: %s", index, exc)
                continue
            for family in text_string_to_metric_families(text):
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(family.name, family.documentation, family.type,
                                                            family.unit)
                merged.samples.extend(
                    Sample(s.name, {**s.labels, "worker": str(index)}, s.value, s.timestamp, s.exemplar)
                    for s in family.samples
                )
        yield from families.values()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=_SCRAPE_TIMEOUT_S) as response:
        return str(response.read().decode())


class Supervisor:
    def __init__(self, setup: ServeSetup, workers: int) -> None:
        self.setup = setup
        self.workers = workers
        # One loopback socket per worker for its own endpoint, bound before any fork so that
        # the supervisor knows every port without asking.
        self.metrics_sockets = []
        for _ in range(workers):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sock.listen(64)
            self.metrics_sockets.append(sock)
        self.metrics_ports = [sock.getsockname()[1] for sock in self.metrics_sockets]
        self.pids: dict[int, int] = {}  # pid -> worker index
        self.stopping = False
        self.exit_codes: dict[int, int] = {}

    def worker_setup(self, index: int) -> ServeSetup:
        settings = self.setup.settings
        proxy = settings.proxy.updated(reuse_port=True)
        fleet = settings.fleet
        assert fleet is not None  # serve_workers enables it
        fleet = fleet.updated(instance_id=f"{fleet.instance_id}:w{index}")
        # Capture files are named after the proxy id: one series per worker.
        capture = settings.capture.updated(proxy_id=f"{settings.capture.proxy_id}-w{index}")
        worker_settings = dataclasses.replace(settings, proxy=proxy, fleet=fleet, capture=capture,
                                              metrics_socket=self.metrics_sockets[index])
        return dataclasses.replace(self.setup, settings=worker_settings)

    def spawn(self, index: int) -> None:
        pid = os.fork()
        if pid == 0:  # the worker
            code = 0
            try:
                for other, sock in enumerate(self.metrics_sockets):
                    if other != index:
                        sock.close()
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    signal.signal(sig, signal.SIG_DFL)
                run_app(self.worker_setup(index))
            except BaseException:
                log.exception("worker %d failed", index)
                code = 1
            finally:
                logging.shutdown()
                os._exit(code)
        self.pids[pid] = index
        log.info("worker %d started (pid %d)", index, pid)

    def signal_workers(self, sig: signal.Signals) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def reap(self) -> list[int]:
        """Workers that exited since the last call, by index."""
        exited = []
        while self.pids:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            index = self.pids.pop(pid, None)
            if index is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            self.exit_codes[index] = code
            if not self.stopping:
                log.error("worker %d (pid %d) exited with %d; restarting it", index, pid, code)
            exited.append(index)
        return exited

    def ready(self) -> tuple[bool, str]:
        """Ready when every worker is; a worker's degraded state (a fleet fallback) is passed on."""
        running = set(self.pids.values())
        not_ready: list[str] = []
        notes: list[str] = []
        for index, port in enumerate(self.metrics_ports):
            if index not in running:
                not_ready.append(f"worker {index} is not running")
                continue
            try:
                body = _get(f"http://127.0.0.1:{port}/readyz").strip()
            except urllib.error.HTTPError as exc:
                not_ready.append(f"worker {index}: {exc.read().decode().strip()}")
            except OSError as exc:
                not_ready.append(f"worker {index}: {exc}")
            else:
                if body != "ready":
                    notes.append(f"worker {index}: {body.removeprefix('ready: ')}")
        if not_ready:
            return False, "; ".join(not_ready)
        return True, "; ".join(notes) or "ok"

    async def run(self) -> int:
        for index in range(self.workers):
            self.spawn(index)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def request_stop() -> None:
            self.stopping = True
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, request_stop)
        loop.add_signal_handler(signal.SIGHUP, self.signal_workers, signal.SIGHUP)
        endpoint = None
        metrics = self.setup.settings.metrics
        if metrics.enabled:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(WorkersCollector(self.metrics_ports))
            endpoint = ObservabilityEndpoint(registry, metrics.host, metrics.port, ready=self.ready)
            await endpoint.start()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _REAP_INTERVAL_S)
            for index in self.reap():
                if not self.stopping:
                    await asyncio.sleep(_RESTART_BACKOFF_S)
                    self.spawn(index)
        self.signal_workers(signal.SIGTERM)
        deadline = time.monotonic() + self.setup.settings.proxy.shutdown_grace_seconds + 20.0
        while self.pids and time.monotonic() < deadline:
            self.reap()
            await asyncio.sleep(_REAP_INTERVAL_S)
        if self.pids:
            log.error("workers %s did not stop in time; killing them", sorted(self.pids.values()))
            self.signal_workers(signal.SIGKILL)
            while self.pids:
                self.reap()
                await asyncio.sleep(_REAP_INTERVAL_S)
        if endpoint is not None:
            await endpoint.stop()
        failed = {index: code for index, code in self.exit_codes.items() if code != 0}
        if failed:
            log.error("workers exited with errors: %s", failed)
        return 1 if failed else 0


def serve_workers(setup: ServeSetup, workers: int) -> int:
    """Run `workers` proxy processes sharing every port and one budget; returns the exit code."""
    import uvloop

    settings = setup.settings
    if settings.fleet is None:
        # Workers without the exchange would each enforce a whole quota.
        # settings.proxy holds the upstream from the files or --upstream.
        fleet = fleet_options(setup.config, settings.proxy, enable=True)
        assert fleet is not None
        log.info("--workers %d: the fleet exchange is on (topic %s), so the workers share one budget",
                 workers, fleet.topic)
        setup = dataclasses.replace(setup, settings=dataclasses.replace(settings, fleet=fleet))
    supervisor = Supervisor(setup, workers)
    return uvloop.run(supervisor.run())
