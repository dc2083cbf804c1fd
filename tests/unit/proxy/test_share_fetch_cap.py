"""A ShareFetch's MaxBytes (and MinBytes) are capped at the consumer quota's window, as Kafka's
handleFetchFromShareFetchRequest does: min(MaxBytes, fetch.max.bytes, quota x (samples - 1) x window)."""

from __future__ import annotations

from kqp.config.models import EnforcementSection
from kqp.protocol.apis import API_SPECS
from kqp.protocol.fast_path import parse_share_fetch_request
from kqp.protocol.headers import encode_request_header, parse_request_header
from kqp.proxy.enforcement import QuotaEnforcement
from kqp.proxy.hooks import Exchange
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings
from tests.unit.client_views import client_view

SHARE_FETCH = 78


def share_fetch_frame(version: int, min_bytes: int, max_bytes: int) -> bytes:
    message = API_SPECS[SHARE_FETCH].request_class[version](
        group_id="g", member_id="m", share_session_epoch=0, max_wait_ms=500, min_bytes=min_bytes,
        max_bytes=max_bytes, max_records=500, batch_size=500, share_acquire_mode=0, is_renew_ack=False,
        topics=[], forgotten_topics_data=[])
    return encode_request_header(SHARE_FETCH, version, 5, "consumer") + bytes(message.encode())


def capped(rate: float | None, version: int, min_bytes: int, max_bytes: int) -> tuple[int, int]:
    entries = () if rate is None else (QuotaEntry(QuotaEntity(client_id="consumer"), {"consumer_byte_rate": rate}),)
    enforcement = QuotaEnforcement(QuotaEngine(QuotaSettings(entries=entries)), EnforcementSection(),
                                   lambda: 1_000_000.0, TopicDirectory())
    frame = share_fetch_frame(version, min_bytes, max_bytes)
    header = parse_request_header(frame)
    exchange = Exchange(header=header, request_bytes=len(frame) + 4, received_at=0.0)
    verdict = enforcement.request(client_view(), exchange, frame)
    out = frame if verdict is None or verdict.frame is None else verdict.frame
    limits = parse_share_fetch_request(memoryview(out)[header.body_offset:], version)
    assert exchange.fetch_max_wait_ms == (500 if rate is not None else None)
    return limits.min_bytes, limits.max_bytes


def test_max_and_min_bytes_are_capped_at_the_quota_window() -> None:
    # 1000 B/s x 10 full samples x 1 s = 10,000 bytes; MinBytes follows MaxBytes down.
    for version in (1, 2):
        assert capped(1000.0, version, min_bytes=50_000, max_bytes=52_428_800) == (10_000, 10_000)
        assert capped(1000.0, version, min_bytes=1, max_bytes=52_428_800) == (1, 10_000)


def test_a_request_within_the_window_or_without_a_quota_is_unchanged() -> None:
    assert capped(1000.0, 1, min_bytes=1, max_bytes=4_000) == (1, 4_000)
    assert capped(None, 1, min_bytes=1, max_bytes=52_428_800) == (1, 52_428_800)
