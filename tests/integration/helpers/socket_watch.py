"""Which TCP peers a process (and its children) is connected to, sampled from /proc.

A client that learned a broker's real address would open a connection to a broker port and
keep it open while producing or fetching; sampling every few milliseconds sees it. The
sampler also records the proxy ports it sees, so a test can tell "watched and clean" from
"watched nothing".
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_LISTEN_STATE = "0A"


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    try:
        with os.scandir(f"/proc/{pid}/fd") as entries:
            for fd in entries:
                try:
                    target = os.readlink(fd.path)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _descendants(pid: int) -> list[int]:
    found = [pid]
    index = 0
    while index < len(found):
        current = found[index]
        index += 1
        try:
            with os.scandir(f"/proc/{current}/task") as tasks:
                for task in tasks:
                    children = Path(task.path, "children").read_text().split()
                    found.extend(int(child) for child in children)
        except OSError:
            continue
    return found


def remote_ports(pid: int, children: bool = True, ignored: frozenset[str] = frozenset()) -> set[int]:
    """Remote ports of the TCP connections held by pid (and its descendants if `children`),
    leaving out the sockets whose inodes are `ignored`."""
    inodes: set[str] = set()
    for process in _descendants(pid) if children else [pid]:
        inodes |= _socket_inodes(process)
    inodes -= ignored
    ports: set[int] = set()
    for table in _TCP_TABLES:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[9] in inodes and fields[3] != _LISTEN_STATE:
                ports.add(int(fields[2].rsplit(":", 1)[1], 16))
    return ports


class SocketWatch:
    """Samples remote_ports(pid) in a thread until stopped; `seen` is the union.

    Without a pid it watches this process alone: the test process's children include the
    brokers themselves, whose sockets say nothing about the client under test. With
    `only_new`, the sockets the process already held when the watch started are left out: in a
    whole-suite run the test process may still hold a connection an earlier test's client left
    open, which says nothing about the clients a test creates inside the watch.
    """

    def __init__(self, pid: int | None = None, interval_s: float = 0.02, only_new: bool = False) -> None:
        self.children = pid is not None
        self.pid = os.getpid() if pid is None else pid
        self.interval_s = interval_s
        self._only_new = only_new
        self._ignored: frozenset[str] = frozenset()
        self.seen: set[int] = set()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"socket-watch-{self.pid}", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        self.seen |= remote_ports(self.pid, self.children, self._ignored)
        self.samples += 1

    def start(self) -> SocketWatch:
        if self._only_new:
            processes = _descendants(self.pid) if self.children else [self.pid]
            self._ignored = frozenset().union(*(_socket_inodes(process) for process in processes))
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def __enter__(self) -> SocketWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
