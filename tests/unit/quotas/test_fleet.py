"""Fleet sharing in the pure model: usage reports, remote usage in the sensors, membership."""

from __future__ import annotations

import heapq
from collections.abc import Callable

import pytest

from kqp.protocol.api_keys import ApiKey
from kqp.quotas import QuotaEngine, QuotaType
from kqp.quotas.fleet import (
    ClaimClock,
    Departure,
    FleetView,
    MutationClaim,
    ReportError,
    UsageDelta,
    UsageReport,
    budget_holder,
    decode_record,
    decode_report,
    encode_claim,
    encode_report,
    split_usage,
    worker_instance_id,
)
from kqp.quotas.recording import QuotaClient, RequestCharges, charge_request
from tests.unit.helpers.quotas import D, settings_for

PRODUCE: QuotaType = "producer_byte_rate"
MUTATION: QuotaType = "controller_mutation_rate"
CONSUME: QuotaType = "consumer_byte_rate"
QUOTA = 100_000.0  # bytes/s


def _sharing_engine(quota_type: QuotaType = PRODUCE, limit: float = QUOTA, **options: object) -> QuotaEngine:
    engine = QuotaEngine(settings_for(quota_type, {(None, D): limit}, **options))
    engine.share_usage(True)
    return engine


def test_a_report_survives_its_encoding() -> None:
    report = UsageReport("host:1", 7, (
        UsageDelta(PRODUCE, None, (("user", "alice"), ("client-id", "app")), 1024.0),
        UsageDelta(MUTATION, "2", (("user", ""), ("client-id", "admin")), 40.0),
    ))
    assert decode_report(encode_report(report)) == report


@pytest.mark.parametrize(("data", "reason"), [
    (b"\xff\xfe", "not JSON"),
    (b'{"format": 99}', "format 1"),
    (b'{"format": 1, "instance": "a", "seq": "x", "usage": []}', "wrong type"),
    (b'{"format": 1, "instance": "a", "seq": 1, "usage": [["bogus_rate", null, [], 1]]}', "malformed"),
    (b'{"format": 1, "instance": "a", "seq": 1, "usage": [["producer_byte_rate", null, [], "1"]]}', "malformed"),
])
def test_an_unreadable_report_is_refused_with_its_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ReportError, match=reason):
        decode_report(data)


def test_local_usage_is_reported_once_per_sensor_and_then_forgotten() -> None:
    engine = _sharing_engine(scope="cluster")
    engine.record_produce("1", "u", "c", 300, 0)
    engine.record_produce("2", "u", "c", 200, 10)  # the same cluster-wide sensor
    engine.record_produce("1", "u", "d", 50, 20)
    usage = sorted(engine.take_local_usage(), key=lambda d: d.tags)
    assert usage == [
        UsageDelta(PRODUCE, None, (("user", ""), ("client-id", "c")), 500.0),
        UsageDelta(PRODUCE, None, (("user", ""), ("client-id", "d")), 50.0),
    ]
    assert engine.take_local_usage() == []


def test_a_broker_scoped_budget_is_reported_with_its_broker() -> None:
    engine = _sharing_engine()
    engine.record_produce("3", "u", "c", 10, 0)
    assert [d.broker for d in engine.take_local_usage()] == ["3"]


def test_remote_usage_counts_against_the_local_sensor_but_is_never_reported_back() -> None:
    engine = _sharing_engine(scope="cluster")
    tags = (("user", ""), ("client-id", "c"))
    # 10 windows' worth of quota already used elsewhere in the fleet.
    engine.record_remote_usage([UsageDelta(PRODUCE, None, tags, QUOTA * 10)], 0)
    assert engine.take_local_usage() == []
    throttle = engine.record_produce("1", "u", "c", 1000, 0)
    alone = QuotaEngine(settings_for(PRODUCE, {(None, D): QUOTA}, scope="cluster"))
    assert throttle > 0
    assert alone.record_produce("1", "u", "c", 1000, 0) == 0


def test_clients_no_quota_limits_are_not_reported() -> None:
    engine = QuotaEngine(settings_for(PRODUCE, {(None, "limited"): QUOTA}))
    engine.share_usage(True)
    engine.record_produce("1", "u", "unlimited", 300, 0)
    engine.record_produce("1", "u", "limited", 300, 0)
    assert [dict(d.tags)["client-id"] for d in engine.take_local_usage()] == ["limited"]


def test_without_sharing_nothing_is_kept_for_a_report() -> None:
    engine = QuotaEngine(settings_for(PRODUCE, {(None, D): QUOTA}))
    engine.record_produce("1", "u", "c", 300, 0)
    assert engine.take_local_usage() == []


def test_an_unrecorded_fetch_is_not_reported() -> None:
    engine = _sharing_engine("consumer_byte_rate", limit=100.0)
    engine.record_fetch("1", "u", "c", 10_000, 0)  # throttled, not delivered: unrecorded
    assert engine.take_local_usage() == []
    engine.record_fetch("1", "u", "c", 10_000, 1, delivered=True)
    assert [d.amount for d in engine.take_local_usage()] == [10_000.0]


def test_remote_partitions_drain_the_local_token_bucket() -> None:
    """KIP-599 across instances: partitions created through one instance use the tokens of
    every instance's bucket for that client (5/s x 11 windows = 55 tokens)."""
    first, second = _sharing_engine(MUTATION, 5.0), _sharing_engine(MUTATION, 5.0)
    assert first.mutations("1", "u", "c", 19, 7, [("t1", 40), ("t2", 40)], 0).accepted == [True, True]
    second.record_remote_usage(first.take_local_usage(), 100)
    outcome = second.mutations("1", "u", "c", 19, 7, [("t3", 40)], 100)
    assert outcome.accepted == [False]
    assert outcome.throttle_ms == 5000  # a deficit of 25 tokens at 5/s, as on one broker


def _claim(instance: str, claim_id: int, wall_ms: float, topics: int = 7, partitions: int = 40) -> MutationClaim:
    names = tuple((f"{instance}-{claim_id}-{i}", partitions) for i in range(topics))
    return MutationClaim(instance, claim_id, wall_ms, "1", "u", "c", ApiKey.CREATE_TOPICS, 7, names)


def test_a_claim_survives_its_encoding_and_is_told_apart_from_a_report() -> None:
    claim = _claim("host:1:42", 3, 1_700_000_000_123.5, topics=2)
    assert decode_record(encode_claim(claim)) == claim
    report = UsageReport("host:1", 7, ())
    assert decode_record(encode_report(report)) == report


@pytest.mark.parametrize(("data", "reason"), [
    (b'{"format": 1, "claim": 1, "instance": "a"}', "wrong type"),
    (b'{"format": 1, "claim": 1, "instance": "a", "wall_ms": 1, "broker": "1", "user": "", "client_id": "c",'
     b' "api_key": 0, "api_version": 7, "topics": []}', "not a partition mutation"),
    (b'{"format": 1, "claim": 1, "instance": "a", "wall_ms": 1, "broker": "1", "user": "", "client_id": "c",'
     b' "api_key": 19, "api_version": 7, "topics": [["t"]]}', "malformed topics"),
])
def test_an_unreadable_claim_is_refused_with_its_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ReportError, match=reason):
        decode_record(data)


def test_the_claim_clock_keeps_the_gaps_between_claims_and_never_goes_back() -> None:
    clock = ClaimClock(wall_minus_engine_ms=1_000_000.0)
    times = [clock.engine_time(_claim("a", i, wall)) for i, wall in enumerate([1_000_500.0, 1_000_400.0, 1_002_500.0])]
    assert times == [500.0, 500.0, 2500.0]


def test_instances_charging_the_same_claims_in_the_same_order_agree_with_one_controller() -> None:
    """Issue 13, criterion 2, in the pure model: two instances each receive CreateTopics of 7
    topics x 40 partitions at the same moment, with 5 partitions/s over 11 windows (55 tokens).
    Both claims go through one topic; every instance charges them in its order, on its own
    clock, and every instance computes the verdicts a single controller gives: the first
    request gets 2 topics (strict mode admits a topic while the bucket is not negative: 55,
    then 15), everything else THROTTLING_QUOTA_EXCEEDED with the same throttle."""
    log = [_claim("a", 1, 5_000_000.0), _claim("b", 1, 5_000_000.0), _claim("a", 2, 5_003_000.0, topics=1)]
    verdicts: list[list[tuple[list[bool], int]]] = []
    for engine_clock_offset in (4_000_000.0, 123.0):  # instances whose engine clocks differ
        engine = _sharing_engine(MUTATION, 5.0)
        engine.share_usage(True, mutations_claimed=True)
        clock = ClaimClock(engine_clock_offset)
        seen = []
        for claim in log:
            charges = RequestCharges(claim.api_key, claim.api_version, mutations=claim.topics)
            outcome = charge_request(engine, QuotaClient(claim.broker, claim.user, claim.client_id), charges,
                                     clock.engine_time(claim)).mutation
            assert outcome is not None
            seen.append((outcome.accepted, outcome.throttle_ms))
        assert engine.take_local_usage() == []  # the claims are the sharing: no usage reported as well
        verdicts.append(seen)
    assert verdicts[0] == verdicts[1]
    first, second, third = verdicts[0]
    assert first == ([True, True] + [False] * 5, 5000)  # 25 tokens of debt at 5/s
    assert second == ([False] * 7, 5000)
    assert third == ([False], 2000)  # 3 s later: 10 of the 25 tokens back
    assert sum(40 for accepted, _ in verdicts[0] for ok in accepted if ok) == 80


def test_the_share_policy_scales_every_limit_and_restores_them() -> None:
    engine = _sharing_engine(scope="cluster")
    engine.record_produce("1", "u", "c", 1, 0)
    engine.set_budget_share(1 / 4)
    assert [s.limit for s in engine.snapshot(0)] == [QUOTA / 4]
    assert engine.fetch_max_bytes_cap("1", "u", "c", 0) is None  # no consumer quota configured
    engine.set_budget_share(1.0)
    assert [s.limit for s in engine.snapshot(0)] == [QUOTA]


def test_reports_are_split_so_that_no_record_outgrows_kafka() -> None:
    usage = [UsageDelta(PRODUCE, None, (("client-id", str(i)),), 1.0) for i in range(7)]
    chunks = split_usage(usage, 3)
    assert [len(c) for c in chunks] == [3, 3, 1]
    assert [d for c in chunks for d in c] == usage


def test_membership_ages_out_a_silent_instance_and_falls_back_when_the_exchange_stops() -> None:
    view = FleetView("a", "share", member_timeout_ms=11_000, unreachable_after_ms=3_000, started_ms=0)
    assert view.state(0) == "starting"
    for t in (100, 200):
        view.report_seen("a", t)
        view.report_seen("b", t)
        view.report_seen("c", t)
    assert view.instances(200) == 3
    assert (view.state(200), view.budget_share(200)) == ("ok", 1.0)
    # c stops; a and b keep reporting.
    for t in range(300, 11_400, 100):
        view.report_seen("a", t)
        view.report_seen("b", t)
    assert view.instances(11_300) == 2
    # The topic becomes unreachable: a's own reports stop coming back.
    assert view.state(11_300 + 3_000) == "ok"
    assert view.state(11_300 + 3_001) == "share"
    assert view.instances(11_300 + 20_000) == 1  # b looks gone, but the share stays 1/2
    assert view.budget_share(11_300 + 20_000) == 0.5
    view.report_seen("a", 40_000)
    assert (view.state(40_000), view.budget_share(40_000)) == ("ok", 1.0)


def test_a_forgotten_instance_is_told_with_its_silence_at_the_first_check_past_the_timeout() -> None:
    """The exchange logs each instance it stops counting (kqp.proxy.fleet); the wire test of a
    killed instance reads that it left only after a whole member timeout of silence, at the
    first check after it."""
    view = FleetView("a", "share", member_timeout_ms=11_000, unreachable_after_ms=3_000, started_ms=0)
    view.report_seen("a", 100)
    view.report_seen("b", 100)
    view.report_seen("c", 150)
    for t in range(200, 11_200, 100):
        view.report_seen("a", t)
        view.report_seen("b", t)
        assert view.instances(t) == 3
    assert view.take_departures() == []
    assert view.instances(11_250) == 2  # c, last heard at 150, silent 11,100 ms > 11,000
    assert view.take_departures() == [Departure("c", 11_100, 150)]
    assert view.take_departures() == []  # told once


def test_under_the_share_policy_the_workers_of_one_host_hold_one_share() -> None:
    """Two hosts of `--workers 2` and a plain instance lose the topic: each host's workers
    still share their usage through their supervisor, so each holds 1/3 between them (one
    third per worker would give the two hosts a sixth each)."""
    view = FleetView(worker_instance_id("h1:9092:7", 0), "share", member_timeout_ms=11_000,
                     unreachable_after_ms=3_000, started_ms=0)
    names = [worker_instance_id(host, i) for host in ("h1:9092:7", "h2:9092:8") for i in range(2)] + ["plain:w"]
    for name in names:
        view.report_seen(name, 0)
    assert view.instances(0) == 5
    assert view.budget_share(3_001) == pytest.approx(1 / 3)
    assert [budget_holder(n) for n in names] == ["h1:9092:7", "h1:9092:7", "h2:9092:8", "h2:9092:8", "plain:w"]


def test_the_local_policy_keeps_the_whole_budget_when_the_exchange_stops() -> None:
    view = FleetView("a", "local", member_timeout_ms=11_000, unreachable_after_ms=3_000, started_ms=0)
    view.report_seen("a", 0)
    view.report_seen("b", 0)
    view.instances(0)
    assert (view.state(5_000), view.budget_share(5_000)) == ("local", 1.0)


def _simulate(engines: list[QuotaEngine], clients: int, exchange: bool | None, interval_ms: int,
              step: Callable[[QuotaEngine, float], tuple[int, float]], quiet_below: float = 0.0) -> float:
    """Clients spread over `engines` (client i on engine i mod n), instances exchanging usage
    every `interval_ms` (with their names when `exchange` is True, anonymously when False).
    `step(engine, now)` serves one request: (bytes it moved, ms until the client's next one).
    Returns the bytes/s moved in total over 45 s of steady state."""
    events = [(float(i), "request", i) for i in range(clients)]
    events += [(float(interval_ms), "exchange", -1)]
    moved = 0
    steady_from, end = 15_000, 60_000
    while events:
        now, kind, who = heapq.heappop(events)
        if now > end:
            break
        if kind == "exchange":
            reports = [engine.take_local_usage(now, quiet_below) for engine in engines]
            for i, engine in enumerate(engines):
                for j, usage in enumerate(reports):
                    if i != j and exchange is not None:
                        engine.record_remote_usage(usage, now, f"instance-{j}" if exchange else None)
            heapq.heappush(events, (now + interval_ms, "exchange", -1))
            continue
        nbytes, next_in_ms = step(engines[who % len(engines)], now)
        if now >= steady_from:
            moved += nbytes
        heapq.heappush(events, (now + next_in_ms, "request", who))
    return moved / ((end - steady_from) / 1000)


def _aggregate_rate(instances: int, exchange: bool | None, exchange_interval_ms: int = 100,
                    quiet_below: float = 0.0) -> float:
    """Three producers with one client-id each offer twice the quota and wait out every
    throttle (as librdkafka does); bytes/s admitted in total over 45 s of steady state.

    exchange None: all three go through one engine, as three connections to one broker
    would (Kafka's own figure); True/False: each through its own instance, with or without
    the usage exchange.
    """
    engines = [_sharing_engine(scope="cluster") for _ in range(1 if exchange is None else instances)]
    request = 10_000
    send_every_ms = request / (2 * QUOTA) * 1000

    def produce(engine: QuotaEngine, now: float) -> tuple[int, float]:
        return request, max(send_every_ms, engine.record_produce("1", "u", "c", request, now))

    return _simulate(engines, instances, True if exchange else None, exchange_interval_ms, produce, quiet_below)


def test_three_instances_sharing_usage_admit_what_one_broker_would() -> None:
    one_broker = _aggregate_rate(3, exchange=None)
    # Kafka's throttle delays each of the three clients, so one broker admits a little less
    # than the quota here (the same formula, the same shortfall through the fleet).
    assert 0.8 * QUOTA < one_broker <= QUOTA
    fleet = _aggregate_rate(3, exchange=True)
    # Never more than one broker + 2 % (issue 39) ...
    assert fleet <= 1.02 * one_broker
    # ... and short of it by what counting the others' unreported usage costs producers that
    # send evenly: each throttle takes the others to have admitted as much as this instance did
    # since its last report, also while they were waiting out theirs (measured: 0.949x one
    # broker at this zero lag; the bound was rel=0.05 while produce was not counted by default).
    assert fleet >= 0.94 * one_broker
    # Without the exchange each instance admits a budget of its own.
    assert _aggregate_rate(3, exchange=False) > 2.5 * QUOTA


def test_a_client_far_from_its_quota_is_kept_quiet_and_one_near_it_is_reported() -> None:
    engine = _sharing_engine(scope="cluster")
    for second in range(11):  # a whole window: the rate is what the client sends
        engine.record_produce("1", "u", "far", round(0.01 * QUOTA), second * 1000)
        engine.record_produce("1", "u", "near", round(0.5 * QUOTA), second * 1000)
    usage = engine.take_local_usage(11_000, quiet_below=0.02)
    assert [d.tags for d in usage] == [(("user", ""), ("client-id", "near"))]
    assert engine.deltas_kept_quiet == 1
    # Without the share, both are reported; a kept-quiet delta is dropped, not held back.
    engine.record_produce("1", "u", "far", round(0.01 * QUOTA), 11_000)
    engine.record_produce("1", "u", "near", round(0.5 * QUOTA), 11_000)
    assert sorted(d.amount for d in engine.take_local_usage(11_000)) == [0.01 * QUOTA, 0.5 * QUOTA]


def test_quiet_clients_change_nothing_for_a_client_over_its_quota() -> None:
    # The fleet default: 2 % of a quota for the fleet, so 2/3 % per instance of three.
    full = _aggregate_rate(3, exchange=True)
    assert _aggregate_rate(3, exchange=True, quiet_below=0.02 / 3) == pytest.approx(full, rel=0.01)


def test_what_instances_keep_quiet_is_less_than_the_share_of_the_quota() -> None:
    """Three instances serve one client-id, each just under the per-instance threshold: none
    reports it and none throttles, and the fleet admits less than the share of the quota it
    left unreported; a little more on one instance, and that instance reports it."""
    share, instances = 0.02, 3
    engines = [_sharing_engine(scope="cluster") for _ in range(instances)]
    per_instance = round(0.9 * share / instances * QUOTA)  # bytes/s: a request's size is whole bytes
    admitted, reported = 0.0, 0
    for second in range(30):
        for engine in engines:
            assert engine.record_produce("1", "u", "c", per_instance, second * 1000) == 0
            admitted += per_instance
        for engine in engines:
            reported += len(engine.take_local_usage(second * 1000 + 500, share / instances))
    assert reported == 0 and admitted / 30 < share * QUOTA
    engines[0].record_produce("1", "u", "c", round(0.2 * share / instances * QUOTA * 11), 30_000)
    assert len(engines[0].take_local_usage(30_500, share / instances)) == 1


def _consumers_rate(exchange: bool | None, instances: int = 3, exchange_interval_ms: int = 100) -> float:
    """Consumers with one client-id, one per instance, each reading a backlog as fast as its
    throttles let it (a fetch returns one second of the quota, as a Java consumer's 1 MiB
    against 1 MiB/s), the data of a throttled fetch delivered and kept recorded (`delivered`:
    a ShareFetch's; a Fetch is answered empty since issue 39, which this model does not follow:
    with empty answers it gives 0.60x for the fleet and 0.89x for one broker, docs/quotas.md).
    Bytes/s delivered in total over 45 s of steady state.

    exchange None: all go through one engine (one broker's figure); True: each through its
    own instance with the usage exchange; False: the same, but the reports do not say which
    instance sent them, so no instance knows that others serve the client.
    """
    engines = [_sharing_engine(CONSUME, scope="cluster") for _ in range(1 if exchange is None else instances)]
    fetch_bytes, round_trip_ms = int(QUOTA), 5.0

    def fetch(engine: QuotaEngine, now: float) -> tuple[int, float]:
        throttle = engine.record_fetch("1", "u", "c", fetch_bytes, now + round_trip_ms, delivered=True)
        return fetch_bytes, round_trip_ms + throttle

    return _simulate(engines, instances, exchange, exchange_interval_ms, fetch)


def test_an_instance_counts_its_unreported_fetches_once_for_each_instance_serving_the_client() -> None:
    engines = {name: _sharing_engine(CONSUME, scope="cluster") for name in ("a", "b", "c")}
    for name in ("b", "c"):
        engines[name].record_fetch("1", "u", "c", 1_000, 0, delivered=True)
        engines["a"].record_remote_usage(engines[name].take_local_usage(), 0, name)
    # 2,000 known + 3 x 350,000: more than the 10 windows' worth (1,000,000) a fresh sensor admits.
    assert engines["a"].record_fetch("1", "u", "c", 350_000, 0, delivered=True) > 0
    # Once reported, its usage counts once: 353,000 + 2 x 1,000 is within the window.
    engines["a"].take_local_usage()
    assert engines["a"].record_fetch("1", "u", "c", 1_000, 0, delivered=True) == 0


def test_an_instance_that_stopped_reporting_no_longer_counts_as_serving_the_client() -> None:
    a, b = _sharing_engine(CONSUME, scope="cluster"), _sharing_engine(CONSUME, scope="cluster")
    b.record_fetch("1", "u", "c", 1_000, 0, delivered=True)
    a.record_remote_usage(b.take_local_usage(), 0, "b")
    # b is silent for a whole quota window (11 x 1 s): a's fetch counts once.
    assert a.record_fetch("1", "u", "c", 600_000, 11_001, delivered=True) == 0


def test_three_instances_hold_consumers_that_fetch_together_to_the_quota() -> None:
    # Through one engine the three fetch together too, and each throttle is computed before
    # the fetches that came with it are recorded: a little over the quota, as the proxy alone.
    one_instance = _consumers_rate(exchange=None)
    assert QUOTA < one_instance < 1.2 * QUOTA
    fleet = _consumers_rate(exchange=True)
    assert fleet == pytest.approx(QUOTA, rel=0.05)
    assert fleet <= one_instance
    # Without knowing who else serves the client, each instance fills the room the others'
    # reports have not yet taken, after every throttle: a lasting excess.
    assert _consumers_rate(exchange=False) > 1.3 * QUOTA


def _producers_engine() -> QuotaEngine:
    engine = QuotaEngine(settings_for(PRODUCE, {(None, D): QUOTA}, scope="cluster"))
    engine.share_usage(True)
    return engine


def test_a_produce_throttle_counts_the_unreported_bytes_once_for_each_other_instance() -> None:
    """b serves the client too, so a takes b to admit as much as a has not reported yet before
    a's throttle is over (2 x 950,000 + 1,000 > 1,000,000), in every fleet since issue 39
    (`fleet.count_other_instances`, which asked for it before, is accepted and changes nothing)."""
    a, b = _producers_engine(), _producers_engine()
    b.record_produce("1", "u", "c", 1_000, 0)
    a.record_remote_usage(b.take_local_usage(), 0, "b")
    alone = _producers_engine()
    throttle = a.record_produce("1", "u", "c", 950_000, 0)
    # (1,000 + 2 x 950,000) / 10 s is 1.901 x the quota: 9.01 s to wait.
    assert throttle == 9_010
    # Only what is counted changes, not what is recorded: the report carries the bytes once.
    assert [d.amount for d in a.take_local_usage()] == [950_000.0]
    # Nobody else serves it: Kafka's throttle.
    assert alone.record_produce("1", "u", "c", 950_000, 0) == 0
    # An instance silent for a whole quota window (11 x 1 s) no longer counts.
    assert a.record_produce("1", "u", "c", 1_000, 11_001) == java_round_throttle(a, 11_001)


def java_round_throttle(engine: QuotaEngine, now_ms: int) -> int:
    """The throttle Kafka's arithmetic alone gives the cluster-wide sensor of client "c" at `now_ms`."""
    sensor = engine.manager(PRODUCE).sensor("1", "u", "c", now_ms)
    return max(0, int(sensor.rate.throttle_with(0.0, now_ms)))


def test_host_usage_and_topic_usage_are_kept_apart_and_taken_each_once() -> None:
    """A worker of a fleet reports to its host's other workers every loop turn and to the topic
    every interval: each gets every byte once."""
    engine = _sharing_engine(scope="cluster")
    calls: list[int] = []
    engine.share_with_host(True, lambda: calls.append(1))
    engine.record_produce("1", "u", "c", 300, 0)
    engine.record_produce("1", "u", "c", 200, 1)
    assert calls == [1]  # one call per batch, not per request
    tags = (("user", ""), ("client-id", "c"))
    assert engine.take_host_usage() == [UsageDelta(PRODUCE, None, tags, 500.0)]
    engine.record_produce("1", "u", "c", 50, 2)
    assert calls == [1, 1]
    assert engine.take_host_usage() == [UsageDelta(PRODUCE, None, tags, 50.0)]
    assert engine.take_local_usage() == [UsageDelta(PRODUCE, None, tags, 550.0)]


def test_workers_without_a_topic_share_through_the_host_alone() -> None:
    engine = QuotaEngine(settings_for(PRODUCE, {(None, D): QUOTA}, scope="cluster"))
    engine.share_with_host(True)
    engine.record_produce("1", "u", "c", 300, 0)
    assert engine.take_local_usage() == []
    assert [d.amount for d in engine.take_host_usage()] == [300.0]
    engine.share_with_host(False)
    engine.record_produce("1", "u", "c", 300, 0)
    assert engine.take_host_usage() == []


def test_a_sibling_is_taken_to_have_served_only_what_this_worker_has_not_relayed_yet() -> None:
    """The fetch rule (pending_elsewhere) with a sibling: what this worker has relayed, the
    sibling knows; only the current request is unknown to it. An instance elsewhere does not
    know this worker's usage until the topic's next report."""
    engine = _sharing_engine(CONSUME, scope="cluster")
    engine.share_with_host(True)
    tags = (("user", ""), ("client-id", "c"))
    engine.record_remote_usage([UsageDelta(CONSUME, None, tags, 1.0)], 0, "h:w1", via_host=True)
    engine.record_fetch("1", "u", "c", 10_000, 0)
    engine.take_host_usage()  # relayed; not reported to the topic yet
    sensor = engine.manager(CONSUME).sensor_for_tags(None, dict(tags), 0)
    assert engine.fleet.pending_elsewhere(sensor, 100, 1) == 100
    engine.record_remote_usage([UsageDelta(CONSUME, None, tags, 1.0)], 1, "other-host")
    assert engine.fleet.pending_elsewhere(sensor, 100, 1) == 100 + 10_100


def test_the_engine_asks_about_other_instances_only_once_one_could_answer() -> None:
    """pending_elsewhere answers None until another instance reported or the topic's reports are
    on: the engine skips the call until then (consults_others), and the throttles stay the same."""
    tags = (("user", ""), ("client-id", "c"))
    alone = QuotaEngine(settings_for(CONSUME, {(None, D): QUOTA}, scope="cluster"))
    alone.record_fetch("1", "u", "c", 10_000, 0)
    sensor = alone.manager(CONSUME).sensor_for_tags(None, dict(tags), 0)
    assert not alone.fleet.consults_others
    assert alone.fleet.pending_elsewhere(sensor, 100, 1) is None
    alone.record_remote_usage([UsageDelta(CONSUME, None, tags, 1.0)], 1, "other-host")
    assert alone.fleet.consults_others
    assert alone.fleet.pending_elsewhere(sensor, 100, 1) is not None
    with_topic = QuotaEngine(settings_for(CONSUME, {(None, D): QUOTA}, scope="cluster"))
    assert not with_topic.fleet.consults_others
    with_topic.share_usage(True)
    assert with_topic.fleet.consults_others
    with_topic.share_usage(False)
    assert not with_topic.fleet.consults_others


def test_a_client_new_to_the_fleet_is_taken_to_be_served_by_every_live_instance_until_a_report_crosses() -> None:
    """Clients that appear on every instance at once (a fleet starting, clients reconnecting
    after a failure) are each admitted into the whole room unless each instance takes every
    live one to serve them until a report has had time to say otherwise."""
    a = _producers_engine()
    a.record_remote_usage([], 0, "b")  # b's heartbeat: b is alive, nothing known of the client
    # (600,000 + 600,000 counted for b) / 10 s is 1.2 x the quota: 2 s to wait.
    assert a.record_produce("1", "u", "c", 600_000, 10) == 2_000
    alone = _producers_engine()
    assert alone.record_produce("1", "u", "c", 600_000, 10) == 0
    # Two reports later b has said nothing of the client: only this instance serves it.
    a.take_local_usage(100)
    a.record_remote_usage([], 150, "b")
    a.take_local_usage(200)
    a.record_remote_usage([], 250, "b")
    assert a.record_produce("1", "u", "c", 1_000, 260) == java_round_throttle(a, 260)


def test_until_the_others_report_after_this_instances_last_one_its_last_report_counts_too() -> None:
    """b's report sent with a's last one is still on its way (the topic's lag): b is taken to
    have admitted what a's last report carried as well as what a admitted since."""
    a, b = _producers_engine(), _producers_engine()
    b.record_produce("1", "u", "c", 1_000, 0)
    a.record_remote_usage(b.take_local_usage(0), 50, "b")
    a.record_produce("1", "u", "c", 300_000, 60)
    assert [d.amount for d in a.take_local_usage(100)] == [300_000.0]
    # At 120 b's report of 100 has not come: recorded 1,000 + 300,000 + 400,000, and for b what a
    # reported at 100 and what it admits now, 300,000 + 400,000: 1,401,000 over Kafka's 10.07 s
    # (the first sample began at 50, nine whole windows added).
    assert a.record_produce("1", "u", "c", 400_000, 120) == round((1_401_000 / 10.07 - QUOTA) / QUOTA * 10_070)
    # b's report of 100 arrives at 150 (nothing more from b): a's last report no longer counts,
    # only what a admitted since: 702,000 + (400,000 + 1,000) = 1,103,000 over 10.11 s (920 ms,
    # where counting the last report as well would give 3,920).
    a.record_remote_usage([], 150, "b")
    assert a.record_produce("1", "u", "c", 1_000, 160) == round((1_103_000 / 10.11 - QUOTA) / QUOTA * 10_110)


# -- dating the others' usage when it happened (docs/quotas.md, finding h) ---------------------

TAGS_C = (("user", ""), ("client-id", "c"))


def test_a_report_says_how_long_ago_it_last_recorded_each_sensor() -> None:
    engine = _sharing_engine(scope="cluster")
    engine.record_produce("1", "u", "c", 300, 1_000)
    engine.record_produce("1", "u", "c", 200, 1_030)
    engine.record_produce("1", "u", "d", 50, 1_010)
    usage = sorted(engine.take_local_usage(1_100), key=lambda d: d.tags)
    assert [(dict(d.tags)["client-id"], d.amount, d.age_ms) for d in usage] == [("c", 500.0, 70), ("d", 50.0, 90)]


def test_ages_survive_the_encoding_and_a_report_without_them_reads_as_age_zero() -> None:
    aged = UsageReport("a", 1, (UsageDelta(PRODUCE, None, TAGS_C, 10.0, 40), UsageDelta(PRODUCE, None, TAGS_C, 5.0)))
    assert decode_report(encode_report(aged)) == aged
    # A kqp that does not date its usage sends no ages: its reports are the bytes they were.
    plain = UsageReport("a", 1, (UsageDelta(PRODUCE, None, TAGS_C, 10.0),))
    assert b"age_ms" not in encode_report(plain)
    assert decode_report(encode_report(plain)) == plain


@pytest.mark.parametrize(("data", "reason"), [
    (b'{"format": 1, "instance": "a", "seq": 1, "usage": [["producer_byte_rate", null, [], 1]], "age_ms": [1, 2]}',
     "2 ages for 1 usage entries"),
    (b'{"format": 1, "instance": "a", "seq": 1, "usage": [["producer_byte_rate", null, [], 1]], "age_ms": [-1]}',
     "a negative age"),
    (b'{"format": 1, "instance": "a", "seq": 1, "usage": [["producer_byte_rate", null, [], 1]], "age_ms": ["1"]}',
     "malformed usage ages"),
])
def test_a_report_with_unreadable_ages_is_refused_with_its_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ReportError, match=reason):
        decode_report(data)


def _window_of_remote_burst(round_trip_ms: float, interval_ms: float) -> tuple[int, int]:
    """An instance that served the client a byte at 0 ms hears at 1,150 ms of 20 windows' worth of
    bytes another recorded last at 1,000 ms (a report taken at 1,100 and 50 ms through the topic):
    the first and last millisecond, in steps of 10 from 2,150 (after the sample the usage went to),
    at which a byte of its own is throttled."""
    engine = _sharing_engine(scope="cluster")
    engine.record_produce("1", "u", "c", 1, 0)
    engine.record_remote_usage([UsageDelta(PRODUCE, None, TAGS_C, QUOTA * 20, 100)], 1_150, "other",
                               round_trip_ms=round_trip_ms, interval_ms=interval_ms)
    throttled = [t for t in range(2_150, 13_000, 10) if engine.record_produce("1", "u", "c", 1, t) > 0]
    return throttled[0], throttled[-1]


def test_the_others_usage_leaves_the_window_when_it_would_have_left_one_brokers() -> None:
    # Kafka keeps a sample until 11 s (samples x window) after its last event: 1,000 + 11,000.
    assert _window_of_remote_burst(round_trip_ms=50, interval_ms=100) == (2_150, 11_990)


def test_the_others_usage_is_kept_from_its_arrival_when_a_report_can_be_a_sample_late() -> None:
    # A report interval plus a round trip of a whole sample (1 s) or more: recorded at its arrival.
    assert _window_of_remote_burst(round_trip_ms=500, interval_ms=1_000) == (2_150, 12_140)
