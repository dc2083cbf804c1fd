"""The `kqp serve --workers` supervisor (issue 28): it never waits on a worker beyond the
scrape deadline, no worker holds its listening socket, and a worker that keeps dying is
restarted with growing delays until the supervisor gives up with a non-zero exit.

Real `kqp serve --workers 2` processes; no Kafka is needed, as a worker serves its endpoint
while its upstream (a closed port here) is unreachable.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

from harness.local_kafka import REPO, free_ports
from harness.proxy_process import ProxyProcess

pytestmark = pytest.mark.integration

SCRAPE_TIMEOUT_S = 0.2


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.1)


def launch(proxy: ProxyProcess) -> None:
    """Start the process without ProxyProcess.start's wait for an upstream broker."""
    with proxy.log_path.open("ab") as log:
        proxy.process = subprocess.Popen(proxy.command(), stdout=log, stderr=subprocess.STDOUT, cwd=REPO)


def get(port: int, path: str) -> tuple[int, str, float]:
    """(status, body, seconds taken) of one GET on the supervisor's endpoint."""
    start = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
            status, body = int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read().decode()
    return status, body, time.monotonic() - start


def endpoint_up(proxy: ProxyProcess) -> bool:
    try:
        get(proxy.metrics_port, "/healthz")
    except OSError:
        return False
    return True


def worker_pids(proxy: ProxyProcess) -> dict[int, int]:
    """Worker index -> pid of its latest start, from the supervisor's log."""
    started = re.findall(r"worker (\d+) started \(pid (\d+)\)", proxy.log_path.read_text())
    return {int(index): int(pid) for index, pid in started}


def worker_samples(text: str, worker: str) -> list[str]:
    return [line for line in text.splitlines() if f'worker="{worker}"' in line and not line.startswith("#")]


def listening_inode(port: int) -> str:
    """The inode of the loopback socket listening on `port` (/proc/net/tcp, state 0A)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == f"0100007F:{port:04X}" and fields[3] == "0A":
            return fields[9]
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


def holds_socket(pid: int, inode: str) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    return any(os.readlink(fd) == f"socket:[{inode}]" for fd in fds.iterdir())


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[ProxyProcess]:
    config = tmp_path / "workers.yaml"
    config.write_text(f"workers:\n  scrape_timeout_seconds: {SCRAPE_TIMEOUT_S}\n")
    (closed_port,) = free_ports(1)
    proxy = ProxyProcess(f"127.0.0.1:{closed_port}", tmp_path / "supervisor.log", config=config, workers=2)
    launch(proxy)
    try:
        wait_for(lambda: endpoint_up(proxy) and all(
            worker_samples(get(proxy.metrics_port, "/metrics")[1], w) for w in "01"),
            60, "both workers' metrics through the supervisor")
        yield proxy
    finally:
        for pid in worker_pids(proxy).values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # a test that stopped one and failed
        code = proxy.stop()
        assert code == 0, f"kqp serve --workers 2 exit code {code}:\n{proxy.log_tail()}"


def test_a_worker_that_hangs_its_metrics_does_not_delay_the_supervisors_answer(supervisor: ProxyProcess) -> None:
    stuck = worker_pids(supervisor)[0]
    os.kill(stuck, signal.SIGSTOP)  # its endpoint still accepts connections, and never answers
    try:
        status, text, seconds = get(supervisor.metrics_port, "/metrics")
        # The deadline plus a generous allowance for a loaded machine; the old blocking
        # scrape waited 2 s for each stuck worker.
        assert status == 200 and seconds < SCRAPE_TIMEOUT_S + 1.2, f"/metrics took {seconds:.2f} s"
        assert worker_samples(text, "1"), "the answering worker's figures are there"
        assert [line for line in worker_samples(text, "0") if "kqp_worker_scrape_timeouts" not in line] == []
        assert re.search(r'^kqp_worker_scrape_timeouts_total\{worker="0"\} [1-9]', text, re.MULTILINE)
        status, body, seconds = get(supervisor.metrics_port, "/readyz")
        assert status == 503 and seconds < SCRAPE_TIMEOUT_S + 1.2, (status, body, seconds)
        assert f"worker 0: no answer within {SCRAPE_TIMEOUT_S:g} s" in body
    finally:
        os.kill(stuck, signal.SIGCONT)
    assert "worker 0 did not answer a scrape (no answer within" in supervisor.log_path.read_text()
    wait_for(lambda: bool(worker_samples(get(supervisor.metrics_port, "/metrics")[1], "0")), 30,
             "worker 0's figures back once it answers again")


def test_no_worker_holds_the_supervisors_listening_socket(supervisor: ProxyProcess) -> None:
    inode = listening_inode(supervisor.metrics_port)
    assert holds_socket(supervisor.pid, inode)
    first = worker_pids(supervisor)
    assert not any(holds_socket(pid, inode) for pid in first.values())
    # A worker restarted while the supervisor's endpoint is up does not inherit it either.
    os.kill(first[1], signal.SIGKILL)
    wait_for(lambda: worker_pids(supervisor)[1] != first[1], 30, "worker 1 restarted")
    restarted = worker_pids(supervisor)[1]
    # The child closes the inherited socket as its first step, so look once it serves.
    wait_for(lambda: bool(worker_samples(get(supervisor.metrics_port, "/metrics")[1], "1")), 30,
             "the restarted worker's figures through the supervisor")
    assert not holds_socket(restarted, inode)
    assert "worker 1: restart 1 of at most 5 in a row" in supervisor.log_path.read_text()


def _log_time(line: str) -> float:
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_a_crash_looping_worker_is_restarted_with_growing_delays_then_given_up(tmp_path: Path) -> None:
    config = tmp_path / "workers.yaml"
    config.write_text("workers:\n  restart_backoff_seconds: 0.1\n  restart_backoff_max_seconds: 5\n"
                      "  max_restarts: 3\n")
    (closed_port,) = free_ports(1)
    proxy = ProxyProcess(f"127.0.0.1:{closed_port}", tmp_path / "crash.log", config=config, workers=2)
    # The bootstrap port taken by a socket without SO_REUSEPORT: every worker dies at start.
    taken = socket.socket()
    taken.bind(("127.0.0.1", proxy.bootstrap_port))
    taken.listen(1)
    try:
        launch(proxy)
        assert proxy.process is not None
        code = proxy.process.wait(60)
    finally:
        taken.close()
        proxy.stop()
    log = proxy.log_path.read_text()
    assert code == 1, f"exit code {code}:\n{proxy.log_tail()}"
    gave_up = re.search(r"worker (\d) is crash-looping: it died 4 times in a row, each time within 60 s of "
                        r"starting \(workers.max_restarts is 3\); stopping every worker and exiting with 1", log)
    assert gave_up, log
    # Both workers crash; the one that reached the limit first is the one to look at.
    worker = gave_up.group(1)
    lines = log.splitlines()
    delays = [float(m.group(1)) for line in lines
              if (m := re.search(rf"worker {worker}: restart \d of at most 3 in a row, in ([\d.]+) s", line))]
    assert len(delays) == 3 and delays[0] < delays[1] < delays[2], delays
    assert 0.08 <= delays[0] <= 0.12, delays  # 0.1 s, +-20%
    starts = [_log_time(line) for line in lines if re.search(rf"worker {worker} started \(pid", line)]
    assert len(starts) == 4, starts  # the first start and three restarts
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert all(gap >= delay - 0.002 for gap, delay in zip(gaps, delays, strict=True)), (gaps, delays)
