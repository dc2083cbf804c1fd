"""The engine's `delivered`: a ShareFetch's data reaches the client even when throttled (its records
were acquired for the member), so its bytes stay recorded; a Fetch's are unrecorded, as Kafka's."""

from __future__ import annotations

from kqp.quotas import QuotaEngine
from kqp.quotas.settings import QuotaEntity, QuotaEntry, QuotaSettings

LIMIT = 1000.0


def engine() -> QuotaEngine:
    entry = QuotaEntry(QuotaEntity(client_id="c"), {"consumer_byte_rate": LIMIT})
    return QuotaEngine(QuotaSettings(entries=(entry,)))


def test_delivered_fetch_keeps_its_bytes_while_a_broker_style_fetch_unrecords_them() -> None:
    broker_style, proxy_style = engine(), engine()
    # 20 kB at t=0 on a fresh sensor: well over the 10 s x 1000 B/s the young window absorbs.
    first_broker = broker_style.record_fetch("1", "ANONYMOUS", "c", 20_000, 0.0)
    first_proxy = proxy_style.record_fetch("1", "ANONYMOUS", "c", 20_000, 0.0, delivered=True)
    assert first_broker == first_proxy > 0
    # A small fetch a second later: after an unrecord the window is nearly empty again,
    # while the delivered bytes still count and keep the client throttled.
    assert broker_style.record_fetch("1", "ANONYMOUS", "c", 100, 1000.0) == 0
    assert proxy_style.record_fetch("1", "ANONYMOUS", "c", 100, 1000.0, delivered=True) > 0


def test_quota_enabled_follows_the_configured_types_and_live_updates() -> None:
    quotas = engine()
    assert quotas.quota_enabled("consumer_byte_rate")
    assert not quotas.quota_enabled("producer_byte_rate")
    produce = QuotaEntry(QuotaEntity(user="<default>"), {"producer_byte_rate": 5.0})
    quotas.update(QuotaSettings(entries=(produce,)))
    assert quotas.quota_enabled("producer_byte_rate")
