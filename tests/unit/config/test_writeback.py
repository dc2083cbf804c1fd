"""AlterClientQuotas write-back: only quotas.entries changes, and the file is replaced atomically."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from kqp.config import ConfigError, find_quota_file, load_config, write_quota_entries
from kqp.quotas.settings import QuotaEntity, QuotaEntry

ORIGINAL = """\
# a comment that survives the write
proxy:
  bootstrap_port: 19192
upstream:
  bootstrap_servers: ["k:9092"]
quotas:
  scope: cluster
  window_num: 7
  entries:
    - entity: {user: old}
      producer_byte_rate: 1
  ip_entries:
    - {ip: 1.2.3.4, connection_creation_rate: 9}
"""

NEW_ENTRIES = (
    QuotaEntry(QuotaEntity(user="alice", client_id="<default>"), {"producer_byte_rate": 1048576.0}),
    QuotaEntry(
        QuotaEntity(client_id="app"),
        {"consumer_byte_rate": 2048.0, "request_percentage": 12.5, "controller_mutation_rate": 3.0},
        dry_run=True,
        scope="broker",
    ),
)


def test_round_trip_keeps_other_keys(tmp_path: Path) -> None:
    path = tmp_path / "kqp.yaml"
    path.write_text(ORIGINAL)
    before = load_config([path])

    write_quota_entries(path, NEW_ENTRIES)

    after = load_config([path])
    assert after.quota_settings().entries == NEW_ENTRIES
    # Everything but the entries is as it was.
    assert after.model_dump(exclude={"quotas": {"entries"}}) == before.model_dump(exclude={"quotas": {"entries"}})
    raw = yaml.safe_load(path.read_text())
    assert list(raw) == ["proxy", "upstream", "quotas"]  # key order kept
    assert raw["quotas"]["entries"][0] == {"entity": {"user": "alice", "client-id": "<default>"},
                                           "producer_byte_rate": 1048576}
    assert isinstance(raw["quotas"]["entries"][0]["producer_byte_rate"], int)


def test_file_is_replaced_not_rewritten_in_place(tmp_path: Path) -> None:
    path = tmp_path / "kqp.yaml"
    path.write_text(ORIGINAL)
    os.chmod(path, 0o640)
    inode_before = path.stat().st_ino
    with path.open() as reader:  # a reader that opened the file before the write
        write_quota_entries(path, NEW_ENTRIES)
        # It still sees the complete old file: the new content went to a new inode.
        assert reader.read() == ORIGINAL
    assert path.stat().st_ino != inode_before
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["kqp.yaml"]  # no temporary file left


def test_failed_replace_leaves_the_file_and_no_debris(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kqp.yaml"
    path.write_text(ORIGINAL)

    def refuse(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="No space left"):
        write_quota_entries(path, NEW_ENTRIES)
    assert path.read_text() == ORIGINAL
    assert [p.name for p in tmp_path.iterdir()] == ["kqp.yaml"]


def test_invalid_entries_are_refused_and_the_file_untouched(tmp_path: Path) -> None:
    path = tmp_path / "kqp.yaml"
    path.write_text(ORIGINAL)
    bad = (QuotaEntry(QuotaEntity(user="a"), {"producer_byte_rate": 0.0}),)
    with pytest.raises(ConfigError, match=r"quotas\.entries\[0\]\.producer_byte_rate"):
        write_quota_entries(path, bad)
    assert path.read_text() == ORIGINAL


def test_empty_entries_remove_every_quota(tmp_path: Path) -> None:
    path = tmp_path / "kqp.yaml"
    path.write_text(ORIGINAL)
    write_quota_entries(path, ())
    config = load_config([path])
    assert config.quotas.entries == ()
    assert len(config.quotas.ip_entries) == 1


def test_writing_to_a_file_without_quotas_adds_the_section(tmp_path: Path) -> None:
    path = tmp_path / "listener.yaml"
    path.write_text("proxy: {bootstrap_port: 19192}\n")
    write_quota_entries(path, NEW_ENTRIES[:1])
    config = load_config([path])
    assert config.proxy.bootstrap_port == 19192
    assert config.quota_settings().entries == NEW_ENTRIES[:1]


def test_find_quota_file(tmp_path: Path) -> None:
    listener = tmp_path / "listener.yaml"
    listener.write_text("proxy: {bootstrap_port: 19192}\n")
    with_entries = tmp_path / "quotas.yaml"
    with_entries.write_text("quotas:\n  entries: []\n")
    tuning = tmp_path / "tuning.yaml"
    tuning.write_text("quotas:\n  dry_run: true\n")

    assert find_quota_file([listener, with_entries, tuning]) == with_entries  # the effective entries
    assert find_quota_file([listener, tuning]) == tuning  # the only quotas section
    assert find_quota_file([listener]) == listener  # nowhere else to put them
    assert find_quota_file([str(with_entries), str(listener)]) == with_entries


def test_the_entries_a_write_adds_or_changes_carry_its_origin_and_the_others_keep_theirs(tmp_path: Path) -> None:
    path = tmp_path / "quotas.yaml"
    path.write_text("quotas:\n  entries:\n    - entity: {user: hand}\n      producer_byte_rate: 5\n"
                    "      dry_run: false\n")
    hand = QuotaEntry(QuotaEntity(user="hand"), {"producer_byte_rate": 5.0})
    alice = QuotaEntry(QuotaEntity(user="alice"), {"producer_byte_rate": 10.0})
    write_quota_entries(path, (hand, alice), origin="first")
    write_quota_entries(path, (hand, alice, QuotaEntry(QuotaEntity(user="bob"), {"consumer_byte_rate": 7.0})),
                        origin="second")
    entries = yaml.safe_load(path.read_text())["quotas"]["entries"]
    assert [(e["entity"]["user"], e.get("origin")) for e in entries] == [
        ("hand", None), ("alice", "first"), ("bob", "second"),
    ]
    write_quota_entries(path, (hand, QuotaEntry(QuotaEntity(user="alice"), {"producer_byte_rate": 11.0})),
                        origin="third")
    entries = yaml.safe_load(path.read_text())["quotas"]["entries"]
    assert [e.get("origin") for e in entries] == [None, "third"]
    # The stamp is not part of the quota.
    assert load_config([path]).quota_settings().entries[1] == QuotaEntry(QuotaEntity(user="alice"),
                                                                         {"producer_byte_rate": 11.0})
