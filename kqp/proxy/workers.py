"""`kqp serve --workers N`: N proxy processes on one host, one set of ports, one budget.

Every worker binds every listener with SO_REUSEPORT, so the kernel spreads new connections
over them, and shares its quota usage with the others through the supervisor
(kqp.proxy.host_exchange: a Unix socket pair per worker, relayed within a loop turn), so a
client whose connections land on different workers still gets one quota, as from one
process. With `fleet.enabled`, each worker is also an instance of the fleet's topic exchange
(kqp.proxy.fleet) for the instances on other hosts. The
supervisor (the process started) forks the workers, restarts one that dies, passes SIGHUP
and SIGTERM on, and serves the operator endpoint: /metrics is every worker's, each series
labelled `worker`, so Prometheus scrapes one proxy.

Theory of operation (the `workers` section of the config sets the figures):
- The supervisor's event loop never waits on a worker. /metrics and /readyz ask every worker
  at once, asynchronously, each with a deadline (`scrape_timeout_seconds`); a worker slower
  than that is logged, counted in `kqp_worker_scrape_timeouts_total` and left out of that
  answer, so one stuck worker cannot stall the endpoint that reports it.
- Sockets: each worker's own endpoint socket and the supervisor's endpoint socket are bound
  before the first fork (a port in use fails `kqp serve` before any worker runs). A worker,
  first thing after the fork, closes every one of them but its own, so no worker ever holds
  a listening socket of the supervisor's, however late it is (re)started.
- Restarts: a worker that dies is restarted after an exponential backoff with jitter
  (kqp.proxy.backoff, shared with the fleet exchange's reconnects). Deaths in a row, each
  within `stable_after_seconds` of the worker's start, count towards `max_restarts`; past it
  the worker is crash-looping (a bad file, a port taken, a broken host), and restarting it
  forever would only hide that: the supervisor logs why, stops the others and exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
import signal
import socket
import time
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from kqp.config.models import WorkersSection
from kqp.proxy.app import ServeSetup, run_app
from kqp.proxy.backoff import Backoff
from kqp.proxy.fleet import default_instance_id
from kqp.proxy.host_exchange import HostLink, HostRelay
from kqp.proxy.http_endpoint import ObservabilityEndpoint
from kqp.quotas.fleet import worker_instance_id

log = logging.getLogger(__name__)

# How often the supervisor polls (WNOHANG) for dead workers and due restarts. It polls rather
# than blocking in waitpid because the same loop serves the endpoint; the interval bounds how
# late a restart starts after its backoff has passed.
_REAP_INTERVAL_S = 0.2
# The code a supervisor that gave up on a crash-looping worker exits with.
CRASH_LOOP_EXIT = 1
# A (re)started worker gets the mutation claims of the last quota window and this much more: a
# bucket emptied by a large mutation takes longer than one window to fill again (as the topic).
_CLAIM_HISTORY_MARGIN_S = 30.0


class WorkerUnanswered(Exception):
    """A worker's endpoint did not answer in time, or not with HTTP."""


async def http_get(port: int, path: str, timeout_s: float) -> tuple[int, str]:
    """(status, body) of GET `path` on a worker's loopback endpoint, within `timeout_s` in all.

    The endpoint answers one request per connection and closes it (kqp.proxy.http_endpoint),
    so the body is whatever arrives until the close.
    """

    # A hand-written HTTP/1.1 GET over asyncio streams rather than urllib: urllib blocks the calling
    # thread, and the supervisor has one event loop serving every worker and its own endpoint.
    async def exchange() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            return await reader.read()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    try:
        # One deadline over connect, send and read together: a worker that accepts and then stalls
        # mid-body costs no more than one that never accepts.
        data = await asyncio.wait_for(exchange(), timeout_s)
    except TimeoutError:
        raise WorkerUnanswered(f"no answer within {timeout_s:g} s") from None
    except OSError as exc:
        raise WorkerUnanswered(str(exc)) from None
    head, _, body = data.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split(b" ", 2)
    if len(status_line) < 2 or not status_line[1].isdigit():
        raise WorkerUnanswered(f"not an HTTP answer: {head[:80]!r}")
    return int(status_line[1]), body.decode(errors="replace")


async def ask_workers(ports: Mapping[int, int], path: str,
                      timeout_s: float) -> dict[int, tuple[int, str] | WorkerUnanswered]:
    """Every worker's answer to GET `path` (worker index -> endpoint port), asked all at once,
    so the whole takes at most about `timeout_s` however many workers are stuck."""

    async def ask(port: int) -> tuple[int, str] | WorkerUnanswered:
        try:
            return await http_get(port, path, timeout_s)
        except WorkerUnanswered as exc:
            return exc

    # `ask` turns failures into values, so gather never raises and one worker's failure cannot
    # cancel the questions to the others.
    answers = await asyncio.gather(*(ask(port) for port in ports.values()))
    return dict(zip(ports, answers, strict=True))


class WorkersCollector(Collector):
    """The worker metrics fetched by the last scrape, each sample labelled with its worker.

    Prometheus' registry collects synchronously, so the supervisor fetches first
    (`Supervisor.scrape_workers`, async) and this only relabels what arrived.
    """

    def __init__(self) -> None:
        self.texts: dict[int, str] = {}

    def collect(self) -> Iterator[Metric]:
        """Merge the workers' families by name: each worker exposes the same metric names, and the
        exposition format allows one HELP/TYPE per family, so their samples become one family told
        apart by the `worker` label.
        """
        families: dict[str, Metric] = {}
        for index, text in sorted(self.texts.items()):
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


@dataclasses.dataclass(slots=True)
class WorkerRestarts:
    """One worker slot's restart history: when it last started and how often it died young."""

    started_at: float = 0.0
    deaths_in_a_row: int = 0
    restart_at: float | None = None  # monotonic time of a pending restart


def _listening_socket(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket. SO_REUSEADDR lets a restarted supervisor bind its endpoint port
    while old connections are in TIME_WAIT; it does not let two live processes share the port.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(64)
    return sock


class Supervisor:
    """Forks and watches the `--workers` processes and serves their merged endpoint (module docstring)."""
    def __init__(self, setup: ServeSetup, workers: int) -> None:
        self.setup = setup
        self.workers = workers
        self.limits: WorkersSection = setup.config.workers
        self.backoff = Backoff(initial_s=self.limits.restart_backoff_seconds,
                               max_s=self.limits.restart_backoff_max_seconds)
        # One loopback socket per worker for its own endpoint, bound before any fork so that
        # the supervisor knows every port without asking.
        self.metrics_sockets = [_listening_socket("127.0.0.1", 0) for _ in range(workers)]
        self.metrics_ports = [sock.getsockname()[1] for sock in self.metrics_sockets]
        # The supervisor's own endpoint, bound now too: a worker closes it after its fork.
        metrics = setup.settings.metrics
        self.endpoint_socket = _listening_socket(metrics.host, metrics.port) if metrics.enabled else None
        # What the running endpoint listens on: the loop may listen on a duplicate of the socket.
        self.endpoint_fds: list[int] = []
        # `stopping` is set by SIGTERM/SIGINT or by a crash loop; from then on exits are expected, not
        # restarted, and `gave_up` tells the two apart for the exit code.
        self.pids: dict[int, int] = {}  # pid -> worker index
        self.restarts = [WorkerRestarts() for _ in range(workers)]
        self.stopping = False
        self.gave_up = False
        self.exit_codes: dict[int, int] = {}
        self._relay_tasks: set[asyncio.Task[None]] = set()
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = WorkersCollector()
        self.registry.register(self.collector)
        # The workers' one budget: every worker's usage relayed to the others (kqp.proxy.host_exchange).
        quotas = setup.config.quota_settings()
        self.relay = HostRelay(quotas.window_num * quotas.window_size_s + _CLAIM_HISTORY_MARGIN_S)
        # Every worker's instance name starts with this: the fleet's, or this host's and process's.
        fleet = setup.settings.fleet
        base = fleet.instance_id if fleet is not None else default_instance_id(setup.settings.proxy.bootstrap_port)
        self.base_instance_id = base
        self.siblings_prefix = worker_instance_id(base, 0)[:-1]
        self.scrape_timeouts = Counter(
            "kqp_worker_scrape_timeouts", "Scrapes of the supervisor a worker did not answer in time "
            "(workers.scrape_timeout_seconds); its figures were left out of that scrape.",
            ["worker"], registry=self.registry,
        )

    def worker_setup(self, index: int, relay_socket: socket.socket) -> ServeSetup:
        """The worker's own settings: SO_REUSEPORT on every listener so the kernel balances connections
        over the workers, its end of the supervisor's relay and an instance name of its own (the
        same on the fleet's topic, if there is one), and its pre-bound endpoint socket.
        """
        settings = self.setup.settings
        proxy = settings.proxy.updated(reuse_port=True)
        instance_id = worker_instance_id(self.base_instance_id, index)
        fleet = settings.fleet.updated(instance_id=instance_id) if settings.fleet is not None else None
        # Capture files are named after the proxy id: one series per worker.
        capture = settings.capture.updated(proxy_id=f"{settings.capture.proxy_id}-w{index}")
        worker_settings = dataclasses.replace(settings, proxy=proxy, fleet=fleet, capture=capture,
                                              metrics_socket=self.metrics_sockets[index],
                                              host_link=HostLink(relay_socket, instance_id, self.siblings_prefix))
        return dataclasses.replace(self.setup, settings=worker_settings)

    def spawn(self, index: int) -> None:
        relay_socket = self.relay.socket_for(index)
        relay_fds = self.relay.supervisor_fds()
        pid = os.fork()
        if pid == 0:  # the worker
            # Everything in the child ends in os._exit: returning or raising would run the supervisor's
            # code (its loop, its atexit handlers) in the worker.
            code = 0
            try:
                # Before anything else: no listening socket of the supervisor's (or another
                # worker's) may live on in this process.
                if self.endpoint_socket is not None:
                    self.endpoint_socket.close()
                for fd in self.endpoint_fds:
                    with contextlib.suppress(OSError):  # already closed if the loop used the socket as is
                        os.close(fd)
                for other, sock in enumerate(self.metrics_sockets):
                    if other != index:
                        sock.close()
                # Nor the supervisor's ends of the relay: a worker's end must see the supervisor's close.
                for fd in relay_fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    # The supervisor's handlers came across the fork; the worker's app installs its own.
                    signal.signal(sig, signal.SIG_DFL)
                run_app(self.worker_setup(index, relay_socket))
            except BaseException:
                log.exception("worker %d failed", index)
                code = 1
            finally:
                logging.shutdown()
                os._exit(code)
        relay_socket.close()  # the worker's end is the worker's
        attach = asyncio.get_running_loop().create_task(self.relay.attach(index), name=f"kqp-relay-w{index}")
        self._relay_tasks.add(attach)
        attach.add_done_callback(self._relay_tasks.discard)
        self.pids[pid] = index
        self.restarts[index].started_at = time.monotonic()
        self.restarts[index].restart_at = None
        log.info("worker %d started (pid %d)", index, pid)

    def signal_workers(self, sig: signal.Signals) -> None:
        """Send `sig` to every running worker (a worker that just exited is skipped)."""
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
            self.relay.detach(index)  # its usage stays in the others' windows until it ages out
            code = os.waitstatus_to_exitcode(status)
            if self.stopping and code == -signal.SIGTERM:
                code = 0  # stopped by the SIGTERM it was sent, before it could handle it: a clean stop
            self.exit_codes[index] = code
            if not self.stopping:
                log.error("worker %d (pid %d) exited with %d", index, pid, code)
            exited.append(index)
        return exited

    def schedule_restart(self, index: int, now: float) -> bool:
        """Plan the restart of a worker that died; False if it is crash-looping (give up)."""
        history = self.restarts[index]
        # Only deaths in a row, each soon after a start, count towards max_restarts: a worker that ran
        # for a while and then died is a new incident, not a crash loop.
        if now - history.started_at >= self.limits.stable_after_seconds:
            history.deaths_in_a_row = 0  # it had settled: a new series of restarts
        history.deaths_in_a_row += 1
        if history.deaths_in_a_row > self.limits.max_restarts:
            log.error(
                "worker %d is crash-looping: it died %d times in a row, each time within %g s of starting "
                "(workers.max_restarts is %d); stopping every worker and exiting with %d",
                index, history.deaths_in_a_row, self.limits.stable_after_seconds, self.limits.max_restarts,
                CRASH_LOOP_EXIT,
            )
            return False
        # Jitter keeps workers that died together (e.g. the cluster went away) from restarting in lock step.
        delay = self.backoff.delay_s(history.deaths_in_a_row - 1, random.random())
        history.restart_at = now + delay
        log.warning("worker %d: restart %d of at most %d in a row, in %.3f s", index, history.deaths_in_a_row,
                    self.limits.max_restarts, delay)
        return True

    def due_restarts(self, now: float) -> list[int]:
        """The worker slots whose backoff delay has passed (monotonic `now`)."""
        return [index for index, history in enumerate(self.restarts)
                if history.restart_at is not None and history.restart_at <= now]

    async def _ask_workers(self, path: str) -> dict[int, tuple[int, str] | WorkerUnanswered]:
        """Ask only the running workers: a slot waiting for its restart has nobody listening on its port."""
        running = {index: self.metrics_ports[index] for index in sorted(set(self.pids.values()))}
        return await ask_workers(running, path, self.limits.scrape_timeout_seconds)

    async def scrape_workers(self) -> None:
        """Fetch every worker's /metrics for the collector; a slow worker is reported and left out."""
        texts: dict[int, str] = {}
        for index, answer in (await self._ask_workers("/metrics")).items():
            if isinstance(answer, WorkerUnanswered) or answer[0] != 200:
                why = answer if isinstance(answer, WorkerUnanswered) else f"HTTP {answer[0]}"
                log.warning("worker %d did not answer a scrape (%s); its figures are left out", index, why)
                self.scrape_timeouts.labels(str(index)).inc()
                continue
            texts[index] = answer[1]
        self.collector.texts = texts

    async def ready(self) -> tuple[bool, str]:
        """Ready when every worker is; a worker's degraded state (a fleet fallback) is passed on."""
        answers = await self._ask_workers("/readyz")
        not_ready: list[str] = []
        notes: list[str] = []
        for index in range(self.workers):
            answer = answers.get(index)
            if answer is None:
                not_ready.append(f"worker {index} is not running")
            elif isinstance(answer, WorkerUnanswered):
                not_ready.append(f"worker {index}: {answer}")
            elif answer[0] != 200:
                not_ready.append(f"worker {index}: {answer[1].strip()}")
            elif answer[1].strip() != "ready":
                notes.append(f"worker {index}: {answer[1].strip().removeprefix('ready: ')}")
        if not_ready:
            return False, "; ".join(not_ready)
        return True, "; ".join(notes) or "ok"

    async def run(self) -> int:
        """Fork the workers, serve the endpoint and restart dead workers until stopped; the exit code.

        The workers are forked before the endpoint starts, and every later fork closes the endpoint's
        sockets in the child first (spawn), so no worker ever accepts on the supervisor's port.
        """
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
        if self.endpoint_socket is not None:
            endpoint = ObservabilityEndpoint(self.registry, self.setup.settings.metrics.host, ready=self.ready,
                                             sock=self.endpoint_socket,
                                             before_metrics=self.scrape_workers)
            await endpoint.start()
            self.endpoint_fds = endpoint.listening_fds()
        # Waiting on `stop` with a timeout, rather than sleeping, lets a signal end the loop at once.
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _REAP_INTERVAL_S)
            if self.stopping:
                break
            now = time.monotonic()
            for index in self.reap():
                if not self.schedule_restart(index, now):
                    self.gave_up = self.stopping = True
                    break
            if self.stopping:
                break
            for index in self.due_restarts(time.monotonic()):
                self.spawn(index)
        await self._stop_workers()
        self.relay.close()
        if endpoint is not None:
            await endpoint.stop()
        if self.gave_up:
            return CRASH_LOOP_EXIT
        failed = {index: code for index, code in self.exit_codes.items() if code != 0}
        if failed:
            log.error("workers exited with errors: %s", failed)
        return 1 if failed else 0

    async def _stop_workers(self) -> None:
        """SIGTERM every worker, wait out their graceful shutdown, SIGKILL what is left.

        The deadline is the proxy's shutdown grace plus 20 s of slack for the rest of a worker's
        shutdown; a worker still alive after it would keep the ports and block a restart.
        """
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


def serve_workers(setup: ServeSetup, workers: int) -> int:
    """Run `workers` proxy processes sharing every port and one budget; returns the exit code."""
    import uvloop

    if setup.settings.fleet is None:
        log.info("--workers %d: the workers share one budget through the supervisor (no fleet topic)", workers)
    else:
        log.info("--workers %d: the workers share one budget through the supervisor, and the fleet's through "
                 "topic %s", workers, setup.settings.fleet.topic)
    try:
        supervisor = Supervisor(setup, workers)
    except OSError as exc:
        log.error("kqp serve --workers: cannot listen for the metrics endpoint: %s", exc)
        return 2
    return uvloop.run(supervisor.run())
