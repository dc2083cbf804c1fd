"""ConfigFiles.changed(): content changes count, touches do not, appearance/disappearance do."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kqp.config import ConfigFiles


class FakeWallClock:
    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        return self.now_ns


def test_content_change_is_seen_once(tmp_path: Path) -> None:
    path = tmp_path / "q.yaml"
    path.write_text("quotas: {}\n")
    files = ConfigFiles([path])
    assert not files.changed()
    path.write_text("quotas: {dry_run: true}\n")
    assert files.changed()
    assert not files.changed()


def test_touch_without_change_is_not_a_change(tmp_path: Path) -> None:
    path = tmp_path / "q.yaml"
    path.write_text("quotas: {}\n")
    files = ConfigFiles([path])
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    assert not files.changed()


def test_same_size_same_mtime_edit_is_seen_while_the_file_is_fresh(tmp_path: Path) -> None:
    # Coarse timestamps: an edit within the same tick, of the same size, leaves the stat unchanged.
    path = tmp_path / "q.yaml"
    path.write_text("quotas: {dry_run: true}\n")
    stat = path.stat()
    clock = FakeWallClock()
    clock.now_ns = stat.st_mtime_ns + 500_000_000  # half a second after the write
    files = ConfigFiles([path], wall_clock_ns=clock)
    path.write_text("quotas: {dry_run: fals}\n")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size
    assert files.changed()


def test_settled_file_with_unchanged_stat_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "q.yaml"
    path.write_text("quotas: {}\n")
    clock = FakeWallClock()
    clock.now_ns = path.stat().st_mtime_ns + 10_000_000_000
    files = ConfigFiles([path], wall_clock_ns=clock)
    reads: list[Path] = []
    original = Path.read_bytes

    def counting_read(self: Path) -> bytes:
        reads.append(self)
        return original(self)

    monkeypatch.setattr(Path, "read_bytes", counting_read)
    assert not files.changed()
    assert reads == []  # the stat alone decided
    path.write_text("quotas: {dry_run: true}\n")
    assert files.changed()
    assert reads == [path]


def test_replaced_file_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "q.yaml"
    path.write_text("quotas: {}\n")
    files = ConfigFiles([path])
    other = tmp_path / "new.yaml"
    other.write_text("quotas: {dry_run: true}\n")
    os.replace(other, path)
    assert files.changed()


def test_missing_and_reappearing_file(tmp_path: Path) -> None:
    listener = tmp_path / "listener.yaml"
    listener.write_text("proxy: {}\n")
    quotas = tmp_path / "q.yaml"
    quotas.write_text("quotas: {}\n")
    files = ConfigFiles([listener, quotas])
    quotas.unlink()
    assert files.changed()
    assert not files.changed()
    quotas.write_text("quotas: {}\n")
    assert files.changed()
    assert files.paths == (listener, quotas)
