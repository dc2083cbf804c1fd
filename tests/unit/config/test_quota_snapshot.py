"""The fleet's quota configuration travels as a snapshot that reads back exactly as a file would."""

from __future__ import annotations

import pytest

from kqp.config import ConfigError
from kqp.config.writeback import decode_quota_snapshot, encode_quota_snapshot
from kqp.quotas import IpQuotaEntry, QuotaEntity, QuotaEntry


def test_a_snapshot_reads_back_as_the_entries_it_was_made_of() -> None:
    entries = (
        QuotaEntry(QuotaEntity(client_id="batch-job"), {"producer_byte_rate": 4096.0}),
        QuotaEntry(QuotaEntity(user="alice", client_id="<default>"), {"request_percentage": 12.5}, dry_run=True,
                   scope="cluster"),
    )
    ip_entries = (IpQuotaEntry("<default>", 10.0),)
    assert decode_quota_snapshot(encode_quota_snapshot("a:1:2", entries, ip_entries)) == ("a:1:2", entries, ip_entries)


@pytest.mark.parametrize(("data", "reason"), [
    (b"not json", "not JSON"),
    (b'{"format": 7}', "not a format 1 quota snapshot"),
    (b'{"format": 1, "instance": "a", "entries": [{"entity": {"client-id": "x"}, "producer_byte_rate": 0}]}',
     "greater than 0"),
])
def test_a_bad_snapshot_is_refused_with_its_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        decode_quota_snapshot(data)
