"""Quota advice arithmetic (kqp/spark_jobs/advice_math.py) on cases computed by hand.

Most cases use one bucket and the max statistic, so the water level can be worked out on
paper: the resource's limit = background + the sum over flows of min(demand, weight x L).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from kqp.quotas import QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings
from kqp.quotas.capacity import NW_IN, NW_OUT
from kqp.spark_jobs.advice_math import (
    FETCH,
    PRODUCE,
    UNLIMITED_QUOTA,
    Advice,
    ByteRateType,
    Entry,
    Flow,
    Problem,
    choose_entries,
    next_planned_limit,
    water_fill,
)


def client(name: str) -> QuotaEntity:
    return QuotaEntity(client_id=name)


def flow(
    name: str,
    per_broker: Sequence[Sequence[float]] | float,
    quota_type: ByteRateType = PRODUCE,
    weight: float = 1.0,
    protected: bool = False,
) -> Flow:
    demand = np.array([[per_broker]] if isinstance(per_broker, int | float) else per_broker, dtype=float)
    return Flow(client(name), quota_type, demand, weight, protected)


def one_broker(flows: list[Flow], nw_in: float = 100.0, nw_out: float = 1e12, **options: object) -> Problem:
    buckets = flows[0].demand.shape[1]
    return Problem(
        brokers=(1,),
        limits={(1, NW_IN): nw_in, (1, NW_OUT): nw_out},
        background={(1, NW_IN): np.zeros(buckets), (1, NW_OUT): np.zeros(buckets)},
        flows=flows,
        stat=str(options.pop("stat", "max")),
        **options,  # type: ignore[arg-type]
    )


def quotas(advice: Advice) -> dict[tuple[str | None, str], float | None]:
    return {(f.entity.client_id, f.quota_type): f.quota for f in advice.flows}


def test_one_entity_over_capacity_is_limited_to_what_the_others_leave() -> None:
    # 10 + 40 + L = 100 -> L = 50: a and b are under it (unlimited), c gets 50.
    advice = water_fill(one_broker([flow("a", 10), flow("b", 40), flow("c", 200)]))
    assert quotas(advice) == {("a", PRODUCE): None, ("b", PRODUCE): None, ("c", PRODUCE): 50}
    assert advice.fits
    (load,) = [row for row in advice.loads if row.resource == NW_IN]
    assert (load.before, load.after, load.limit) == (250, 100, 100)
    reasons = {f.entity.client_id: f.reason for f in advice.flows}
    assert reasons == {"a": "under its fair share", "b": "under its fair share", "c": "fair share of broker 1 NW_IN"}


def test_two_entities_over_their_fair_share_split_it_equally() -> None:
    # 10 + L + L = 100 -> L = 45.
    advice = water_fill(one_broker([flow("a", 10), flow("b", 80), flow("c", 200)]))
    assert quotas(advice) == {("a", PRODUCE): None, ("b", PRODUCE): 45, ("c", PRODUCE): 45}


def test_weights_share_the_binding_resource_in_proportion() -> None:
    # 10 + L + 2L = 100 -> L = 30: b gets 30, c (weight 2) gets 60.
    advice = water_fill(one_broker([flow("a", 10), flow("b", 80), flow("c", 200, weight=2.0)]))
    assert quotas(advice) == {("a", PRODUCE): None, ("b", PRODUCE): 30, ("c", PRODUCE): 60}


def test_a_protected_entity_is_never_limited_and_the_others_make_room() -> None:
    # c (60) is protected: 10 + L + 60 = 100 -> L = 30; a (10) stays under it.
    advice = water_fill(one_broker([flow("a", 10), flow("b", 80), flow("c", 60, protected=True)]))
    assert quotas(advice) == {("a", PRODUCE): None, ("b", PRODUCE): 30, ("c", PRODUCE): None}
    assert {f.entity.client_id: f.reason for f in advice.flows}["c"] == "protected"


def test_a_protected_entity_alone_over_the_limit_cannot_be_met() -> None:
    advice = water_fill(one_broker([flow("a", 10), flow("c", 150, protected=True)]))
    assert not advice.fits
    (reason,) = advice.unmet
    assert reason.startswith("broker 1 NW_IN:") and "protected client-id=c" in reason


def test_the_floor_holds_when_the_fair_share_is_lower() -> None:
    # c's weight 0.1 gives it 0.1 L; with the floor of 20: 10 + L + 20 = 100 -> L = 70, c at 20.
    advice = water_fill(
        one_broker([flow("a", 10), flow("b", 200), flow("c", 200, weight=0.1)], floor=20.0)
    )
    assert quotas(advice) == {("a", PRODUCE): None, ("b", PRODUCE): 70, ("c", PRODUCE): 20}
    assert {f.entity.client_id: f.reason for f in advice.flows}["c"].startswith("floor")


def test_a_floor_that_does_not_fit_names_the_resource() -> None:
    # Everyone at the floor of 50 already carries 10 + 50 + 50 = 110 > 100.
    advice = water_fill(one_broker([flow("a", 10), flow("b", 80), flow("c", 200)], floor=50.0))
    assert not advice.fits
    assert advice.unmet[0].startswith("broker 1 NW_IN:") and "floor of 50" in advice.unmet[0]


def test_entities_busy_in_different_seconds_each_get_the_whole_limit() -> None:
    # The limit applies per bucket: a and b never overlap, so each may use 60 of it.
    advice = water_fill(one_broker([flow("a", [[100, 0]]), flow("b", [[0, 100]])], nw_in=60.0))
    assert quotas(advice) == {("a", PRODUCE): 60, ("b", PRODUCE): 60}


def test_a_quota_sees_the_rate_over_its_window_and_lets_shorter_bursts_through() -> None:
    # Window of 2 buckets: the measured rate of [100, 0, 100, 0] is [100, 50, 50, 50]. Under a
    # quota q < 50 bucket 0 passes 100 q/100 = q and bucket 2 passes 100 q/50 = 2q: the burst
    # after a quiet bucket gets through at twice the quota, so a limit of 60 needs q = 30.
    advice = water_fill(one_broker([flow("a", [[100, 0, 100, 0]])], nw_in=60.0, window_buckets=2))
    assert quotas(advice) == {("a", PRODUCE): 30}
    assert advice.flows[0].demand_peak == 100
    # A quota at the windowed peak never throttles: the same flow under a limit it fits is unlimited.
    assert quotas(water_fill(one_broker([flow("a", [[100, 0, 100, 0]])], nw_in=100.0, window_buckets=2))) == {
        ("a", PRODUCE): None
    }


def test_the_demand_statistic_and_peak_are_of_the_same_windowed_rate() -> None:
    # Window of 2 buckets over [100, 0, 100, 0, 0]: the rate the quota measures is [100, 50, 50, 50, 0].
    # Its max is the peak (100), and its p50 (50) is the statistic: the raw buckets' p50 would be 0
    # and their max 100; the p99 of the raw buckets (100) could read above a windowed peak.
    advice = water_fill(one_broker([flow("a", [[100, 0, 100, 0, 0]])], nw_in=1_000.0, window_buckets=2, stat="p50"))
    assert advice.flows[0].demand_peak == 100
    assert advice.flows[0].demand_stat == 50
    # Bursty demand under a long window: p99 of the windowed rate <= its max, always.
    rng = np.random.default_rng(3)
    demand = rng.exponential(1_000.0, size=(1, 300)) * (rng.random((1, 300)) < 0.2)
    advice = water_fill(one_broker([flow("b", demand.tolist())], nw_in=1e12, window_buckets=10, stat="p99"))
    assert advice.flows[0].demand_stat <= advice.flows[0].demand_peak


def test_a_throttled_flow_is_planned_at_its_burst_above_the_quota() -> None:
    # Burst factor 2 (a 2 s window judged at 1 s): a throttled bucket keeps min(demand, 2q).
    # Quiet a at 15 stays under the level; b and c at 800 each: 15 + 2 x 2q = 115 at the
    # limit -> q = 25, half of what the plain model gives (15 + 2q = 115 -> q = 50).
    flows = [flow("a", 15), flow("b", 800), flow("c", 800)]
    advice = water_fill(one_broker(flows, nw_in=115.0, burst_factor=2.0))
    assert quotas(advice) == {("a", PRODUCE): None, ("b", PRODUCE): 25, ("c", PRODUCE): 25}
    (load,) = [row for row in advice.loads if row.resource == NW_IN]
    assert load.after == pytest.approx(115)
    assert quotas(water_fill(one_broker(flows, nw_in=115.0)))[("b", PRODUCE)] == 50
    # A flow under burst_factor x its quota is not cut in a bucket: with a limit of 1,015 the
    # quota must come down to (1,015 - 15) / 4 = 250, not to the plain (1,015 - 15) / 2 = 500.
    assert quotas(water_fill(one_broker(flows, nw_in=1_015.0, burst_factor=2.0)))[("b", PRODUCE)] == 250


def test_a_flow_within_the_burst_of_the_fair_share_is_left_alone() -> None:
    # a at 35 is over the level, but never over 2 x its quota: at L >= 17.5 it passes whole,
    # limited or not. 35 + 2 x 2L = 115 -> L = 20 >= 17.5, so a quota would throttle a without
    # lowering any bucket: a stays unlimited, and says why.
    advice = water_fill(one_broker([flow("a", 35), flow("b", 800), flow("c", 800)], nw_in=115.0, burst_factor=2.0))
    assert quotas(advice) == {("a", PRODUCE): None, ("b", PRODUCE): 20, ("c", PRODUCE): 20}
    assert advice.flows[0].reason == "within the burst a quota at its fair share lets through"


def test_p99_is_judged_like_analyze_with_linear_interpolation() -> None:
    # 101 buckets of 10 and one of 1000 for a single flow: p99 of min(d, q) is the 100th
    # value of the sorted 101 (rank 99 exactly) = 10 while q >= 10, so nothing is limited
    # although the max is 1000.
    demand = [[10.0] * 100 + [1000.0]]
    advice = water_fill(one_broker([flow("a", demand)], nw_in=20.0, stat="p99"))
    assert quotas(advice) == {("a", PRODUCE): None}
    assert advice.loads[0].after == pytest.approx(np.percentile(demand[0], 99))


def test_several_brokers_each_bind_their_own_entities() -> None:
    # Broker 1 NW_IN (limit 100) carries producers p and q (80 each): L = 50.
    # Broker 2 NW_OUT (limit 40) carries consumers x (100) and y (10): 10 + L = 40 -> L = 30,
    # the first resource to fill, so x is fixed there and p, q keep rising to 50.
    flows = [
        flow("p", [[80], [0]]),
        flow("q", [[80], [0]]),
        flow("x", [[0], [100]], FETCH),
        flow("y", [[0], [10]], FETCH),
    ]
    problem = Problem(
        brokers=(1, 2),
        limits={(1, NW_IN): 100, (1, NW_OUT): 1e9, (2, NW_IN): 1e9, (2, NW_OUT): 40},
        background={},
        flows=flows,
        stat="max",
    )
    advice = water_fill(problem)
    assert quotas(advice) == {("p", PRODUCE): 50, ("q", PRODUCE): 50, ("x", FETCH): 30, ("y", FETCH): None}
    bindings = {f.entity.client_id: f.binding for f in advice.flows}
    assert bindings == {"p": (1, NW_IN), "q": (1, NW_IN), "x": (2, NW_OUT), "y": None}


def test_a_broker_scoped_quota_binds_on_the_busiest_broker_and_frees_the_others() -> None:
    # w produces 60 on each broker; broker 2 NW_IN allows 50, so w gets 50 (on every broker,
    # Kafka's broker scope), which leaves broker 1 room for v's 150 (50 + 150 = 200).
    flows = [flow("w", [[60], [60]]), flow("v", [[150], [0]])]
    problem = Problem(
        brokers=(1, 2),
        limits={(1, NW_IN): 200, (1, NW_OUT): 1e9, (2, NW_IN): 50, (2, NW_OUT): 1e9},
        background={},
        flows=flows,
        stat="max",
    )
    assert quotas(water_fill(problem)) == {("w", PRODUCE): 50, ("v", PRODUCE): None}


def test_cluster_scope_limits_the_sum_over_brokers() -> None:
    # One budget for both brokers: q splits 50/50, and broker 1 allows 30, so q = 60.
    problem = Problem(
        brokers=(1, 2),
        limits={(1, NW_IN): 30, (1, NW_OUT): 1e9, (2, NW_IN): 1e9, (2, NW_OUT): 1e9},
        background={},
        flows=[flow("w", [[60], [60]])],
        stat="max",
        scope="cluster",
    )
    assert quotas(water_fill(problem)) == {("w", PRODUCE): 60}


def test_replication_is_modelled_like_analyze() -> None:
    # RF 2 on 2 brokers: a's 100 B/s produced to broker 1 is fetched by the follower on
    # broker 2 (broker 1 NW_OUT 100, broker 2 NW_IN 100). Broker 1 NW_OUT allows 50.
    problem = Problem(
        brokers=(1, 2),
        limits={(1, NW_IN): 1e9, (1, NW_OUT): 50, (2, NW_IN): 1e9, (2, NW_OUT): 1e9},
        background={},
        flows=[flow("a", [[100], [0]])],
        replication_factor=2,
        stat="max",
    )
    advice = water_fill(problem)
    assert quotas(advice) == {("a", PRODUCE): 50}
    loads = {(row.broker, row.resource): (row.before, row.after) for row in advice.loads}
    assert loads[(2, NW_IN)] == (100, 50) and loads[(1, NW_OUT)] == (100, 50)


def test_background_traffic_counts_against_the_limit() -> None:
    problem = one_broker([flow("a", 100)], nw_in=100.0)
    problem = Problem(**{**problem.__dict__, "background": {(1, NW_IN): np.array([30.0])}})
    assert quotas(water_fill(problem)) == {("a", PRODUCE): 70}


# ---------------------------------------------------------------- fewest entries


def advised(*rows: tuple[str, float | None, float]) -> list:  # type: ignore[type-arg]
    """(client-id, quota or None, demand peak) -> FlowAdvice rows of producer flows."""
    problem = one_broker([flow(name, peak) for name, _, peak in rows], nw_in=1e12)
    base = water_fill(problem).flows
    return [
        type(f)(**{**f.__dict__, "quota": quota}) for f, (_, quota, _) in zip(base, rows, strict=True)
    ]


def resolved(entries: list[Entry], names: Sequence[str]) -> dict[str, float | None]:
    settings = QuotaSettings(
        entries=tuple(QuotaEntry(e.entity, {t: float(v) for t, v in e.limits.items()}) for e in entries)
    )
    engine = QuotaEngine(settings)
    return {name: engine.quota(PRODUCE, "ANONYMOUS", name) for name in names}


def test_three_equal_limits_and_quiet_others_make_one_default_entry() -> None:
    rows = [("n1", 50, 300), ("n2", 50, 200), ("n3", 50, 90), ("q1", None, 20), ("q2", None, 49)]
    entries = choose_entries(advised(*rows), "client-id")
    assert entries == [Entry(QuotaEntity(client_id="<default>"), {PRODUCE: 50})]
    limits = resolved(entries, [name for name, *_ in rows])
    # The quiet ones resolve to the default too, but it is above anything they sent.
    assert limits == dict.fromkeys(["n1", "n2", "n3", "q1", "q2"], 50)


def test_a_quiet_entity_above_the_default_gets_kafkas_no_quota_value() -> None:
    rows = [("n1", 50, 300), ("n2", 50, 200), ("n3", 50, 90), ("q1", None, 70)]
    entries = choose_entries(advised(*rows), "client-id")
    assert entries == [
        Entry(QuotaEntity(client_id="<default>"), {PRODUCE: 50}),
        Entry(QuotaEntity(client_id="q1"), {PRODUCE: UNLIMITED_QUOTA}),
    ]
    assert resolved(entries, ["n1", "q1"]) == {"n1": 50, "q1": float(UNLIMITED_QUOTA)}


def test_a_single_limit_is_an_entry_of_its_own_not_a_default() -> None:
    rows = [("n1", 50, 300), ("q1", None, 20)]
    entries = choose_entries(advised(*rows), "client-id")
    assert entries == [Entry(QuotaEntity(client_id="n1"), {PRODUCE: 50})]
    assert resolved(entries, ["n1", "q1"]) == {"n1": 50, "q1": None}


def test_the_most_common_limit_becomes_the_default() -> None:
    rows = [("a", 30, 300), ("b", 30, 300), ("c", 30, 300), ("d", 60, 300), ("q", None, 10)]
    entries = choose_entries(advised(*rows), "client-id")
    assert entries == [
        Entry(QuotaEntity(client_id="<default>"), {PRODUCE: 30}),
        Entry(QuotaEntity(client_id="d"), {PRODUCE: 60}),
    ]


def test_user_granularity_uses_the_user_default() -> None:
    flows = [
        Flow(QuotaEntity(user=name), PRODUCE, np.array([[peak]]))
        for name, peak in (("alice", 300), ("bob", 300), ("carol", 5))
    ]
    advice = water_fill(one_broker(flows, nw_in=100.0))
    assert [f.quota for f in advice.flows] == [47, 47, None]  # 5 + 2L = 100 -> 47.5, rounded down
    entries = choose_entries(advice.flows, "user")
    assert entries == [Entry(QuotaEntity(user="<default>"), {PRODUCE: 47})]


def test_the_rendered_file_loads_as_kqp_config_whatever_the_names(tmp_path: Any) -> None:
    from kqp.config import load_config
    from kqp.spark_jobs.advise_yaml import render_quotas_yaml

    names = ['quote"d', "colon: and # hash", "ünï-çødé", "<not-default>"]
    # 5 + 2L + 3L = 605 -> L = 120: the first name (weight 2) gets its own entry of 240.
    flows = [flow(name, 300.0, weight=2.0 if name == names[0] else 1.0) for name in names] + [flow("quiet", 5.0)]
    advice = water_fill(one_broker(flows, nw_in=605.0))
    entries = choose_entries(advice.flows, "client-id")
    text = render_quotas_yaml(entries, advice.flows, {client(names[0]): 0.25}, ["header"], "broker", {"window_num": 2})
    path = tmp_path / "quotas.yaml"
    path.write_text(text)
    settings = load_config([str(path)]).quota_settings()
    engine = QuotaEngine(settings)
    assert {name: engine.quota(PRODUCE, "ANONYMOUS", name) for name in names} == {
        **dict.fromkeys(names, 120.0),
        names[0]: 240.0,
    }
    assert len(settings.entries) == 2
    assert settings.window_num == 2 and "throttled 25.0% of requests" in text


def test_the_first_cut_is_in_proportion_to_the_overshoot() -> None:
    assert next_planned_limit(1_000.0, 1_000.0, 1_250.0, 1) == pytest.approx(800.0)


def test_a_round_still_over_after_a_cut_doubles_the_cut() -> None:
    """The closed loop on real Kafka that stayed 0.2-0.5 % over through three proportional rounds:
    the rounds after the first cut deeper than the overshoot they saw, doubling each time."""
    limit = 1_228_800.0
    second = next_planned_limit(limit, limit, 1_231_068.4, 1)
    third = next_planned_limit(second, limit, 1_230_461.02, 2)
    fourth = next_planned_limit(third, limit, 1_235_526.28, 3)
    assert second == pytest.approx(limit * limit / 1_231_068.4)
    assert third == pytest.approx(second * (limit / 1_230_461.02) ** 2)
    assert fourth == pytest.approx(third * (limit / 1_235_526.28) ** 4)
    # Proportional cuts would have planned 1,218,210 B/s for a fourth round (0.9 % under the
    # limit); the doubled ones reach 1,196,806 (2.6 % under) in the same three steps.
    assert fourth < 1_199_500


def test_a_round_just_over_after_a_worse_one_cuts_from_the_worst() -> None:
    """A fresh clone's closed loop (2026-11-27): 1,230,780 B/s twice, then 1,228,804, then the
    same again after a cut of 17 B/s. advise passes the worst replay seen, so the fourth round's
    cut is of the 0.16 % overshoot to the fourth power, not of the 3 ppm one."""
    limit = 1_228_800.0
    third = 1_222_879.4489828823
    creeping = third * (limit / 1_228_804.335) ** 4
    from_the_worst = next_planned_limit(third, limit, 1_230_779.88, 3)
    assert third - creeping < 20
    assert from_the_worst == pytest.approx(third * (limit / 1_230_779.88) ** 4)
    assert from_the_worst < 1_215_100


def test_a_round_under_its_limit_is_never_planned_for() -> None:
    """advise only calls it for resources the replay left over their limit; at the limit it is the identity."""
    assert next_planned_limit(900.0, 1_000.0, 1_000.0, 3) == pytest.approx(900.0)
