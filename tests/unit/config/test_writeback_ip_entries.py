"""AlterClientQuotas on an ip entity is written back too, and other keys survive."""

from __future__ import annotations

from pathlib import Path

from kqp.config import load_config, write_quota_entries
from kqp.quotas.settings import IpQuotaEntry, QuotaEntity, QuotaEntry


def test_ip_entries_are_written_back_with_the_client_entries(tmp_path: Path) -> None:
    path = tmp_path / "quotas.yaml"
    path.write_text("quotas:\n  dry_run: true\n  entries:\n    - entity: {user: alice}\n      request_percentage: 50\n")
    entries = [QuotaEntry(QuotaEntity(user="alice"), {"request_percentage": 50.0})]
    write_quota_entries(path, entries, [IpQuotaEntry("10.0.0.7", 20.0), IpQuotaEntry("<default>", 100.0)])
    settings = load_config([path]).quota_settings()
    assert settings.dry_run is True
    assert settings.entries == tuple(entries)
    assert settings.ip_entries == (IpQuotaEntry("10.0.0.7", 20.0), IpQuotaEntry("<default>", 100.0))


def test_a_file_without_ip_entries_gets_none_written_when_there_are_none(tmp_path: Path) -> None:
    path = tmp_path / "quotas.yaml"
    path.write_text("quotas:\n  entries:\n    - entity: {client-id: c}\n      producer_byte_rate: 1024\n")
    write_quota_entries(path, [QuotaEntry(QuotaEntity(client_id="c"), {"producer_byte_rate": 2048.0})], [])
    assert "ip_entries" not in path.read_text()
    assert load_config([path]).quota_settings().entries[0].limits == {"producer_byte_rate": 2048.0}
