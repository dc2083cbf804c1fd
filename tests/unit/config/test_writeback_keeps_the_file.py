"""A write-back (AlterClientQuotas, the fleet) keeps the operator's file: comments, key order,
quoting, blank lines and indentation survive, and only the changed entry changes."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from kqp.config import load_config, write_quota_entries
from kqp.config.writeback import decode_quota_snapshot, encode_quota_snapshot
from kqp.quotas.settings import IpQuotaEntry, QuotaEntity, QuotaEntry

ORIGIN = "AlterClientQuotas by User:ops at 2026-11-25T03:00:00Z"

COMMENTED = """\
# The team's quotas. Ask #kafka-platform before changing.
upstream:
  bootstrap_servers: ["k1:9092", 'k2:9092']   # both racks

quotas:
  window_num: 11
  entries:
    # The batch job: heavy, but only at night.
    - entity: {client-id: batch-job}   # owned by data-eng
      producer_byte_rate: 1048576  # 1 MiB/s
      consumer_byte_rate: 2_000_000

    - entity:
        user: "alice"
        client-id: 'reporting'
      request_percentage: 50.0
      dry_run: false

  # Per-IP connection rates (KIP-612).
  ip_entries:
    - ip: "<default>"
      connection_creation_rate: 100
# end of file
"""

BATCH = QuotaEntity(client_id="batch-job")
ALICE = QuotaEntity(user="alice", client_id="reporting")


def entries_of(path: Path) -> list[QuotaEntry]:
    return list(load_config([path]).quota_settings().entries)


def changed_lines(before: str, after: str) -> list[str]:
    """The lines a diff shows as removed (-) or added (+), in order."""
    return [line for line in difflib.ndiff(before.splitlines(), after.splitlines()) if line[:1] in "+-"]


@pytest.fixture
def quota_file(tmp_path: Path) -> Path:
    path = tmp_path / "quotas.yaml"
    path.write_text(COMMENTED)
    return path


def test_a_changed_value_changes_that_line_and_stamps_the_entry(quota_file: Path) -> None:
    entries = entries_of(quota_file)
    entries[0] = QuotaEntry(BATCH, {**entries[0].limits, "producer_byte_rate": 2097152.0})
    write_quota_entries(quota_file, entries, origin=ORIGIN)
    assert changed_lines(COMMENTED, quota_file.read_text()) == [
        f"+       origin: {ORIGIN}",
        "-       producer_byte_rate: 1048576  # 1 MiB/s",
        "+       producer_byte_rate: 2097152  # 1 MiB/s",
    ]
    assert entries_of(quota_file) == entries


def test_without_an_origin_stamp_only_the_altered_value_changes(quota_file: Path) -> None:
    # quotas.stamp_origin: false, as the proxy writes then.
    entries = entries_of(quota_file)
    entries[0] = QuotaEntry(BATCH, {**entries[0].limits, "producer_byte_rate": 2097152.0})
    write_quota_entries(quota_file, entries, origin=None)
    assert changed_lines(COMMENTED, quota_file.read_text()) == [
        "-       producer_byte_rate: 1048576  # 1 MiB/s",
        "+       producer_byte_rate: 2097152  # 1 MiB/s",
    ]
    assert entries_of(quota_file) == entries


def test_writing_the_same_entries_leaves_the_file_as_it_is(quota_file: Path) -> None:
    inode = quota_file.stat().st_ino
    # 2_000_000 and 2000000.0, 50.0 and 50, `dry_run: false` and no dry_run: the same quotas.
    write_quota_entries(quota_file, entries_of(quota_file), [IpQuotaEntry("<default>", 100.0)], origin=ORIGIN)
    assert quota_file.read_text() == COMMENTED
    assert quota_file.stat().st_ino == inode  # not even replaced


def test_a_quota_added_to_an_entry_is_one_line_and_keeps_the_blank_line_after_it(quota_file: Path) -> None:
    entries = entries_of(quota_file)
    entries[0] = QuotaEntry(BATCH, {**entries[0].limits, "request_percentage": 25.0})
    write_quota_entries(quota_file, entries, origin=ORIGIN)
    after = quota_file.read_text()
    assert changed_lines(COMMENTED, after) == [f"+       origin: {ORIGIN}", "+       request_percentage: 25.0"]
    assert "      request_percentage: 25.0\n\n    - entity:\n" in after


def test_a_new_entity_is_appended_and_the_comment_after_the_list_stays_after_it(quota_file: Path) -> None:
    bob = QuotaEntry(QuotaEntity(user="bob"), {"consumer_byte_rate": 4096.0})
    write_quota_entries(quota_file, [*entries_of(quota_file), bob], origin=ORIGIN)
    after = quota_file.read_text()
    assert changed_lines(COMMENTED, after) == [
        "+     - entity: {user: bob}",
        f"+       origin: {ORIGIN}",
        "+       consumer_byte_rate: 4096",
    ]
    assert "consumer_byte_rate: 4096\n\n  # Per-IP connection rates (KIP-612).\n  ip_entries:" in after


def test_a_removed_entity_takes_only_its_own_lines(quota_file: Path) -> None:
    write_quota_entries(quota_file, entries_of(quota_file)[:1], origin=ORIGIN)
    after = quota_file.read_text()
    assert changed_lines(COMMENTED, after) == [
        "-     - entity:",
        '-         user: "alice"',
        "-         client-id: 'reporting'",
        "-       request_percentage: 50.0",
        "-       dry_run: false",
        "- ",
    ]
    assert "  # Per-IP connection rates (KIP-612).\n  ip_entries:" in after


def test_a_quota_removed_from_the_last_key_keeps_what_followed_it(quota_file: Path) -> None:
    entries = entries_of(quota_file)
    entries[0] = QuotaEntry(BATCH, {"producer_byte_rate": 1048576.0})  # consumer_byte_rate deleted
    write_quota_entries(quota_file, entries, origin=ORIGIN)
    assert changed_lines(COMMENTED, quota_file.read_text()) == [
        f"+       origin: {ORIGIN}",
        "-       consumer_byte_rate: 2_000_000",
    ]


def test_the_files_own_indentation_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "wide.yaml"
    original = ("quotas:\n"
                "    entries:\n"
                "    -   entity: {user: a}\n"
                "        producer_byte_rate: 10\n"
                "    -   entity: {user: b}   # keep me\n"
                "        producer_byte_rate: 20\n")
    path.write_text(original)
    write_quota_entries(path, [QuotaEntry(QuotaEntity(user="a"), {"producer_byte_rate": 10.0}),
                               QuotaEntry(QuotaEntity(user="b"), {"producer_byte_rate": 30.0})], origin="x")
    assert changed_lines(original, path.read_text()) == [
        "+         origin: x",
        "-         producer_byte_rate: 20",
        "+         producer_byte_rate: 30",
    ]


def test_a_fleet_snapshot_changes_only_what_it_changes(quota_file: Path) -> None:
    # What another instance publishes on the fleet's quota topic, as the app writes it back.
    entries = entries_of(quota_file)
    entries[1] = QuotaEntry(ALICE, {"request_percentage": 75.0})
    snapshot = encode_quota_snapshot("other:9192:1", entries, [IpQuotaEntry("<default>", 100.0)])
    _, fleet_entries, fleet_ip_entries = decode_quota_snapshot(snapshot)
    write_quota_entries(quota_file, fleet_entries, fleet_ip_entries,
                        origin="the fleet's quota topic, from instance other:9192:1")
    assert changed_lines(COMMENTED, quota_file.read_text()) == [
        "+       origin: the fleet's quota topic, from instance other:9192:1",
        "-       request_percentage: 50.0",
        "+       request_percentage: 75.0",
    ]
