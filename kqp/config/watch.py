"""Cheap change detection for live reload: stat every poll, read a file only when its stat changed.

Polling rather than inotify: it works the same on every platform and file system (network
file systems send no events for remote writes), and a stat through the path sees a file
replaced by rename (an editor's save) or by a symlink swap (a Kubernetes ConfigMap update)
as an inode change. A change is the content's hash changing, so touching a file, or an
update that writes the same bytes, does not reload.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# A file modified this recently may be modified again within the same timestamp tick without its
# stat changing (coarse mtimes, same size), so it is re-read until it has been still this long.
_SETTLE_NS = 2_000_000_000


@dataclass(frozen=True, slots=True)
class _Fingerprint:
    """A file's stat (to skip reading it) and content hash (to decide if it changed)."""

    mtime_ns: int
    size: int
    inode: int
    digest: bytes


class ConfigFiles:
    """The config files the proxy runs from, and whether they changed since last asked.

    Create it *before* loading the files, so that an edit made while loading is seen by the
    first `changed()`. A missing or unreadable file is a state of its own: its appearing or
    disappearing counts as a change (the reload then reports the error).
    """

    def __init__(self, paths: Sequence[str | Path], wall_clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.paths = tuple(Path(path) for path in paths)
        self._wall_clock_ns = wall_clock_ns
        self._seen = {path: self._fingerprint(path, None) for path in self.paths}

    def changed(self) -> bool:
        """True when any file's content differs from the previous call (or construction)."""
        any_changed = False
        for path in self.paths:
            previous = self._seen[path]
            current = self._fingerprint(path, previous)
            if current != previous:
                # A new stat with the same digest is not a change; appearing or vanishing is.
                any_changed = any_changed or previous is None or current is None or (
                    current.digest != previous.digest
                )
                self._seen[path] = current
        return any_changed

    def _fingerprint(self, path: Path, previous: _Fingerprint | None) -> _Fingerprint | None:
        try:
            stat = os.stat(path)
        except OSError:
            return None
        settled = self._wall_clock_ns() - stat.st_mtime_ns > _SETTLE_NS
        if (
            previous is not None
            and settled
            and (stat.st_mtime_ns, stat.st_size, stat.st_ino) == (previous.mtime_ns, previous.size, previous.inode)
        ):
            return previous
        try:
            digest = hashlib.sha256(path.read_bytes()).digest()
        except OSError:
            return None
        return _Fingerprint(stat.st_mtime_ns, stat.st_size, stat.st_ino, digest)
