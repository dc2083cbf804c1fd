"""Engine behaviour beyond Kafka's vectors: scopes, dry run, expiry, live updates, callbacks."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from kqp.quotas import (
    ClientQuotaCallback,
    ClusterMetadata,
    DefaultQuotaCallback,
    QuotaEngine,
    QuotaEntity,
    QuotaEntry,
    QuotaSettings,
    QuotaType,
    load_callback,
)
from kqp.quotas.groups import QuotaGroupsCallback
from tests.unit.helpers.quotas import D, settings_for

PRODUCE: QuotaType = "producer_byte_rate"


def _default_client_quota(**options: object) -> QuotaSettings:
    return settings_for(PRODUCE, {(None, D): 100}, **options)


def test_broker_scope_keeps_a_budget_per_broker() -> None:
    engine = QuotaEngine(_default_client_quota())
    assert engine.record_produce("1", "u", "c", 1000, 0) == 0  # 1000 / 10 s = 100 B/s: at quota
    assert engine.record_produce("2", "u", "c", 1000, 0) == 0  # another broker, another budget
    assert {s.broker for s in engine.snapshot(0)} == {"1", "2"}


def test_cluster_scope_shares_one_budget_across_brokers() -> None:
    engine = QuotaEngine(_default_client_quota(scope="cluster"))
    assert engine.record_produce("1", "u", "c", 1000, 0) == 0
    assert engine.record_produce("2", "u", "c", 1000, 0) == 10_000
    (snapshot,) = engine.snapshot(0)
    assert (snapshot.scope, snapshot.broker) == ("cluster", None)


def test_entry_scope_overrides_the_global_scope() -> None:
    settings = QuotaSettings(
        entries=(
            QuotaEntry(QuotaEntity(None, D), {PRODUCE: 100}),
            QuotaEntry(QuotaEntity(None, "pooled"), {PRODUCE: 100}, scope="cluster"),
        )
    )
    engine = QuotaEngine(settings)
    assert engine.record_produce("1", "u", "pooled", 1000, 0) == 0
    assert engine.record_produce("2", "u", "pooled", 1000, 0) == 10_000
    assert engine.record_produce("1", "u", "other", 1000, 0) == 0
    assert engine.record_produce("2", "u", "other", 1000, 0) == 0


def test_dry_run_reports_the_throttle_but_enforces_nothing() -> None:
    seen: list[tuple[str, Mapping[str, str], int, bool]] = []
    engine = QuotaEngine(
        _default_client_quota(dry_run=True),
        on_throttle=lambda *event: seen.append(event),
    )
    assert engine.record_produce("1", "u", "c", 2000, 0) == 0
    assert seen == [(PRODUCE, {"user": "", "client-id": "c"}, 10_000, False)]
    (snapshot,) = engine.snapshot(0)
    assert (snapshot.dry_run, snapshot.throttle_count, snapshot.throttle_ms_total) == (True, 1, 10_000)


def test_dry_run_per_entry_only_spares_that_entry() -> None:
    settings = QuotaSettings(
        entries=(
            QuotaEntry(QuotaEntity(None, D), {PRODUCE: 100}),
            QuotaEntry(QuotaEntity(None, "trial"), {PRODUCE: 100}, dry_run=True),
        )
    )
    engine = QuotaEngine(settings)
    assert engine.record_produce("1", "u", "trial", 2000, 0) == 0
    assert engine.record_produce("1", "u", "other", 2000, 0) == 10_000


def test_dry_run_strict_mutations_accept_every_topic_and_report_the_verdict() -> None:
    engine = QuotaEngine(settings_for("controller_mutation_rate", {(None, D): 2.0}, dry_run=True))
    outcome = engine.mutations("1", "u", "c", 19, 7, [("a", 30), ("b", 30)], 0)  # burst 22: 8 short
    assert (outcome.accepted, outcome.would_accept) == ([True, True], [True, False])
    assert (outcome.throttle_ms, outcome.computed_throttle_ms, outcome.dry_run) == (0, 4000, True)
    (snapshot,) = engine.snapshot(0)
    assert snapshot.tokens == -38  # both topics were really created, so both are charged


def test_observer_sees_enforced_throttles() -> None:
    seen: list[tuple[str, Mapping[str, str], int, bool]] = []
    engine = QuotaEngine(_default_client_quota(), on_throttle=lambda *e: seen.append(e))
    engine.record_produce("1", "u", "c", 1000, 0)
    assert seen == []
    engine.record_produce("1", "u", "c", 1000, 0)
    assert seen == [(PRODUCE, {"user": "", "client-id": "c"}, 10_000, True)]


def test_live_update_keeps_history_of_existing_sensors() -> None:
    engine = QuotaEngine(_default_client_quota())
    assert engine.record_produce("1", "u", "c", 1000, 0) == 0
    engine.update(settings_for(PRODUCE, {(None, D): 50}))
    assert engine.record_produce("1", "u", "c", 0, 0) == 10_000  # the 1000 bytes are still there
    (snapshot,) = engine.snapshot(0)
    assert snapshot.limit == 50


def test_kinds_ever_enabled_are_not_forgotten() -> None:
    """Once user quotas were enabled, a client-id-only config still walks the levels."""
    engine = QuotaEngine(settings_for(PRODUCE, {("alice", None): 100}))
    engine.update(settings_for(PRODUCE, {(None, "c"): 100}))
    engine.record_produce("1", "alice", "c", 10, 0)
    (snapshot,) = engine.snapshot(0)
    assert (snapshot.user, snapshot.client_id, snapshot.limit) == ("", "c", 100)
    engine.record_produce("1", "bob", "x", 10, 0)  # no quota: still recorded, never violated
    assert engine.tracked_sensors() == 2


def test_idle_sensors_expire_and_history_is_lost() -> None:
    engine = QuotaEngine(_default_client_quota(sensor_expiry_s=60))
    engine.record_produce("1", "u", "idle", 2000, 0)
    engine.record_produce("1", "u", "busy", 10, 0)
    assert engine.expire_idle(30_000) == 0
    engine.record_produce("1", "u", "busy", 10, 30_000)
    assert engine.expire_idle(60_001) == 1
    assert engine.tracked_sensors() == 1
    # A cached lookup of the expired client must not revive the dropped sensor.
    assert engine.record_produce("1", "u", "idle", 1000, 60_002) == 0
    assert engine.tracked_sensors() == 2


class _CountingDefaultCallback(DefaultQuotaCallback):
    """Kafka's default callback, noting every client whose tags it resolves."""

    def __init__(self) -> None:
        super().__init__()
        self.resolved: list[str] = []

    def metric_tags(self, quota_type: QuotaType, user: str, client_id: str) -> tuple[str, str]:
        self.resolved.append(client_id)
        return super().metric_tags(quota_type, user, client_id)


def test_client_lookups_are_forgotten_after_two_idle_periods() -> None:
    """A flood of one-off client-ids cannot grow the lookup cache: a lookup unused for two
    sensor-expiry periods is dropped, so that client's next request resolves its tags again,
    while a steady client keeps its lookup. The quota is per user, so one sensor serves both
    clients and never expires: only the lookup can have been forgotten."""
    callback = _CountingDefaultCallback()
    engine = QuotaEngine(settings_for(PRODUCE, {("u", None): 1e9}, sensor_expiry_s=10), callback=callback)
    engine.record_produce("1", "u", "one-off", 10, 0)
    engine.record_produce("1", "u", "steady", 10, 0)
    engine.record_produce("1", "u", "one-off", 10, 1)
    assert callback.resolved == ["one-off", "steady"]  # the second request found its lookup
    for now in range(5_000, 40_001, 5_000):
        engine.record_produce("1", "u", "steady", 10, now)
        engine.expire_idle(now)
    engine.record_produce("1", "u", "one-off", 10, 40_001)
    assert callback.resolved == ["one-off", "steady", "one-off"]
    assert engine.tracked_sensors() == 1


class _RecordingCallback(QuotaGroupsCallback):
    reset_polls = 0

    def quota_reset_required(self, quota_type: QuotaType) -> bool:
        self.reset_polls += 1
        return False


def test_quota_groups_callback_pools_client_ids() -> None:
    callback = _RecordingCallback(groups={"ingest": ["ingest-a", "ingest-b"]})
    settings = QuotaSettings(
        entries=(
            QuotaEntry(QuotaEntity(None, "ingest"), {PRODUCE: 100}),
            QuotaEntry(QuotaEntity(None, D), {PRODUCE: 1000}),
        )
    )
    engine = QuotaEngine(settings, callback=callback)
    assert isinstance(callback, ClientQuotaCallback)
    assert engine.record_produce("1", "u", "ingest-a", 1000, 0) == 0
    assert engine.record_produce("1", "u", "ingest-b", 1000, 0) == 10_000  # one pooled budget of 100 B/s
    assert engine.record_produce("1", "u", "other", 2000, 0) == 0  # own sensor, default 1000 B/s
    assert engine.quota(PRODUCE, "u", "ingest-b") == 100
    pooled = [s for s in engine.snapshot(0) if s.client_id == "ingest"]
    assert len(pooled) == 1 and pooled[0].value == 200
    assert callback.reset_polls >= 3  # a custom callback is asked on every lookup, as Kafka does


def test_quota_groups_callback_is_loaded_from_settings() -> None:
    settings = QuotaSettings(
        entries=(QuotaEntry(QuotaEntity(None, "g"), {PRODUCE: 100}),),
        callback="kqp.quotas.groups:QuotaGroupsCallback",
        callback_options={"groups": {"g": ["a", "b"]}},
    )
    engine = QuotaEngine(settings)
    engine.record_produce("1", "u", "a", 1000, 0)
    assert engine.record_produce("1", "u", "b", 1000, 0) == 10_000


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("no_colon", ValueError),
        ("kqp.quotas.groups:Missing", ValueError),
        ("kqp.quotas.settings:QuotaEntity", TypeError),
    ],
)
def test_load_callback_reports_bad_names(spec: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        load_callback(spec, {})


class _MetadataCallback(QuotaGroupsCallback):
    """Changes the pooled limit when told about cluster metadata (as partition-based quotas would)."""

    def update_cluster_metadata(self, metadata: ClusterMetadata) -> bool:
        self.update_quota(PRODUCE, QuotaEntity(None, "g"), 10.0 * sum(metadata.partitions.values()))
        return True


def test_cluster_metadata_updates_reach_existing_sensors() -> None:
    engine = QuotaEngine(
        QuotaSettings(entries=(QuotaEntry(QuotaEntity(None, "g"), {PRODUCE: 100}),)),
        callback=_MetadataCallback(groups={"g": ["a"]}),
    )
    engine.record_produce("1", "u", "a", 1000, 0)
    assert engine.update_cluster_metadata(ClusterMetadata(partitions={"t": 3}, leaders={}))
    (snapshot,) = engine.snapshot(0)
    assert snapshot.limit == 30
    assert engine.record_produce("1", "u", "a", 0, 0) > 0


def test_changing_windows_starts_sensors_afresh() -> None:
    engine = QuotaEngine(_default_client_quota())
    engine.record_produce("1", "u", "c", 1000, 0)
    engine.update(_default_client_quota(window_num=6))
    assert engine.tracked_sensors() == 0
    assert engine.record_produce("1", "u", "c", 500, 0) == 0  # 500 / 5 s = 100 B/s
