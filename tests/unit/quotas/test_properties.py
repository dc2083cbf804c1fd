"""Hypothesis properties of the quota model."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from kqp.quotas import QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings
from kqp.quotas.callbacks import precedence_entities
from kqp.quotas.stats import TokenBucket, WindowedRate
from tests.unit.helpers.quotas import D, FakeClock, settings_for

FAST = settings(max_examples=60, deadline=None)


@FAST
@given(
    quota=st.integers(min_value=1_000, max_value=1_000_000),
    size_share=st.floats(min_value=0.01, max_value=1.0),
    overload=st.floats(min_value=1.5, max_value=20.0),
)
def test_a_client_honouring_throttles_converges_to_its_quota(quota: int, size_share: float, overload: float) -> None:
    """Offered load is `overload` x quota; the client waits out every throttle before sending again."""
    engine = QuotaEngine(settings_for("producer_byte_rate", {(None, D): quota}))
    clock = FakeClock()
    size = max(1, int(quota * size_share))
    interval_ms = size / (quota * overload) * 1000
    sent = 0
    duration_ms = 300_000
    while clock.now_ms < duration_ms:
        throttle = engine.record_produce("1", "u", "c", size, clock.now_ms)
        sent += size
        clock.sleep(max(interval_ms, throttle))
    admitted = sent / (clock.now_ms / 1000)
    assert 0.9 * quota <= admitted <= 1.1 * quota


@FAST
@given(
    quota=st.integers(min_value=100, max_value=1_000_000),
    requests=st.lists(
        st.tuples(st.floats(min_value=0.0, max_value=0.5), st.floats(min_value=1.0, max_value=5.0)),
        min_size=1,
        max_size=200,
    ),
)
def test_no_throttle_at_or_below_quota(quota: int, requests: list[tuple[float, float]]) -> None:
    """A client that never exceeds 90% of its quota over any interval (bursts of at most half a
    second's quota) is never throttled."""
    engine = QuotaEngine(settings_for("producer_byte_rate", {(None, D): quota}))
    now = 0
    for share, slack in requests:
        size = int(quota * share)
        assert engine.record_produce("1", "u", "c", size, now) == 0
        now += math.ceil(size / (0.9 * quota) * 1000 * slack)


@FAST
@given(
    bound=st.floats(min_value=0.1, max_value=1000),
    samples=st.integers(min_value=1, max_value=20),
    window_s=st.integers(min_value=1, max_value=5),
    events=st.lists(
        st.tuples(st.integers(min_value=0, max_value=5000), st.floats(min_value=-1e4, max_value=1e4)), max_size=100
    ),
)
def test_token_bucket_never_exceeds_its_burst(
    bound: float, samples: int, window_s: int, events: list[tuple[int, float]]
) -> None:
    bucket = TokenBucket(samples, window_s * 1000, bound, now_ms=0)
    now = 0
    for gap, value in events:
        now += gap
        bucket.record(value, now)
        assert bucket.measure(now) <= bucket.burst
        assert bucket.peek(now + gap) <= bucket.burst


@FAST
@given(
    configured=st.lists(st.booleans(), min_size=8, max_size=8),
    user=st.sampled_from(["alice", "bob"]),
    client_id=st.sampled_from(["c1", "c2"]),
)
def test_precedence_picks_the_most_specific_configured_entity(
    configured: list[bool], user: str, client_id: str
) -> None:
    levels = precedence_entities("alice", "c1")
    entries = tuple(
        QuotaEntry(entity, {"producer_byte_rate": 1000.0 * (level + 1)})
        for level, (entity, on) in enumerate(zip(levels, configured, strict=True))
        if on
    )
    engine = QuotaEngine(QuotaSettings(entries=entries))
    limits = {entry.entity: entry.limits["producer_byte_rate"] for entry in entries}
    expected = next((limits[e] for e in precedence_entities(user, client_id) if e in limits), None)
    assert engine.quota("producer_byte_rate", user, client_id) == expected
    engine.record_produce("1", user, client_id, 1, 0)
    snapshots = list(engine.snapshot(0))
    assert [s.limit for s in snapshots] == ([expected] if entries else [])  # no quota at all: nothing recorded


@FAST
@given(
    samples=st.integers(min_value=1, max_value=12),
    events=st.lists(
        st.tuples(st.integers(min_value=0, max_value=3000), st.integers(min_value=0, max_value=10_000)), max_size=80
    ),
)
def test_record_and_throttle_agrees_with_measure(samples: int, events: list[tuple[int, int]]) -> None:
    """The inlined hot path computes what Kafka's record-then-measure computes."""
    fast, reference = WindowedRate(samples, 1000, bound=500.0), WindowedRate(samples, 1000, bound=500.0)
    now = 0
    for gap, value in events:
        now += gap
        throttle = fast.record_and_throttle(value, now)
        reference.record(value, now)
        rate = reference.measure(now)
        window = reference.window_size(now)
        expected = 0 if rate <= 500.0 else math.floor((rate - 500.0) / 500.0 * window + 0.5)
        assert throttle == expected


def test_quota_entity_precedence_levels_are_kip55_order() -> None:
    assert precedence_entities("u", "c") == (
        QuotaEntity("u", "c"),
        QuotaEntity("u", D),
        QuotaEntity("u", None),
        QuotaEntity(D, "c"),
        QuotaEntity(D, D),
        QuotaEntity(D, None),
        QuotaEntity(None, "c"),
        QuotaEntity(None, D),
    )
