"""The cluster guard's control step (kqp/quotas/guard.py) on cases computed by hand.

One broker unless said otherwise, one interval per step. With every flow at its measured rate,
the fair level L on a resource solves: limit = background + sum over flows of min(demand, weight x L).
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from kqp.quotas.fair_share import FETCH, NW_IN, NW_OUT, PRODUCE, ByteRateType
from kqp.quotas.guard import GuardDecision, GuardState, step
from kqp.quotas.guard_control import TrimGains
from kqp.quotas.guard_inputs import GuardSettings, MeasuredFlow
from kqp.quotas.settings import QuotaEntity

BIG = 1e9  # a limit nothing reaches


def client(name: str) -> QuotaEntity:
    return QuotaEntity(client_id=name)


def produce(name: str, rate: float | Mapping[int, float], configured: float | None = None) -> MeasuredFlow:
    rates = {1: rate} if isinstance(rate, int | float) else rate
    return MeasuredFlow(client(name), PRODUCE, rates, configured)


def fetch(name: str, rates: Mapping[int, float]) -> MeasuredFlow:
    return MeasuredFlow(client(name), FETCH, rates)


def one_broker(nw_in: float = 1200.0, **options: object) -> GuardSettings:
    # Limits fall at once unless a test says otherwise: the cases below are about the targets.
    options.setdefault("fall_per_s", 0.0)
    return GuardSettings(limits={(1, NW_IN): nw_in, (1, NW_OUT): BIG}, **options)  # type: ignore[arg-type]


def limit_of(decision: GuardDecision, name: str, quota_type: ByteRateType = PRODUCE) -> float | None:
    return decision.limits.get((client(name), quota_type))


def status_of(decision: GuardDecision, name: str, quota_type: ByteRateType = PRODUCE) -> object:
    return next(f for f in decision.flows if f.entity == client(name) and f.quota_type == quota_type)


def engaged(decision: GuardDecision) -> set[tuple[int, str]]:
    return {(r.broker, r.resource) for r in decision.resources if r.engaged}


def test_under_the_limit_nobody_is_limited() -> None:
    # 1150 B/s against a limit of 1200: the guard stays out of the way.
    decision = step(one_broker(), GuardState(), [produce("a", 550), produce("b", 600)], now_s=0)
    assert decision.limits == {}
    assert engaged(decision) == set()
    assert decision.resources[0].load == pytest.approx(1150)


def test_an_idle_proxy_steps_with_no_flow_at_all() -> None:
    """Brokers known, nothing forwarded yet: the step answers (it raised on numpy's reshape of an
    empty array, and the proxy logged a failed step every second until the first request)."""
    decision = step(one_broker(), GuardState(), [], now_s=0)
    assert decision.limits == {} and engaged(decision) == set()
    assert [r.load for r in decision.resources] == [0.0, 0.0]


def test_one_broker_quiet_producers_keep_their_rate_and_the_noisy_share_what_is_left() -> None:
    # The shape: three at 100 B/s, two at 800 B/s, NW_IN limit 1200.
    # 3 x 100 + 2 x L = 1200: L = 450 for each noisy producer; the quiet ones are under it.
    flows = [produce("q1", 100), produce("q2", 100), produce("q3", 100), produce("n1", 800), produce("n2", 800)]
    first = step(one_broker(), GuardState(), flows, now_s=0)
    assert first.resources[0].load == pytest.approx(1900)
    assert first.engaged_now == [(1, NW_IN)]
    assert limit_of(first, "n1") == pytest.approx(450)
    assert limit_of(first, "n2") == pytest.approx(450)
    assert [limit_of(first, q) for q in ("q1", "q2", "q3")] == [None, None, None]

    # The throttled producers now measure at their limit: load 1200, inside the hysteresis band.
    # Held back, they are modelled as wanting more, and get the same share again: a fixed point.
    converged = [produce("q1", 100), produce("q2", 100), produce("q3", 100), produce("n1", 449), produce("n2", 449)]
    second = step(one_broker(), first.state, converged, now_s=5)
    assert engaged(second) == {(1, NW_IN)}
    assert second.engaged_now == []
    assert limit_of(second, "n1") == pytest.approx(450)
    assert limit_of(second, "n2") == pytest.approx(450)
    assert status_of(second, "n1").held_back  # type: ignore[attr-defined]

    # The noisy ones stop: 300 B/s is under 1200 x 0.9, the resource releases and their limits go.
    quiet = [produce("q1", 100), produce("q2", 100), produce("q3", 100), produce("n1", 0), produce("n2", 0)]
    third = step(one_broker(), second.state, quiet, now_s=10)
    assert third.released_now == [(1, NW_IN)]
    assert third.limits == {}


def test_a_noisy_producer_alone_gets_what_the_others_leave_at_a_bounded_rate() -> None:
    # n1 held at 450 while the others stop: its share is now the whole 1200, reached by steps
    # of at most raise_per_s x 5 s = 25 % of its limit, never above its target.
    state = GuardState(engaged={(1, NW_IN): 0.0}, limits={(client("n1"), PRODUCE): 450.0}, last_step_s=0.0)
    expected = [562.5, 703.125, 878.90625, 1098.6328125, 1200.0, 1200.0]
    seen = []
    rate = 450.0
    for index in range(len(expected)):
        decision = step(one_broker(raise_per_s=0.05), state, [produce("n1", rate)], now_s=5.0 * (index + 1))
        seen.append(limit_of(decision, "n1"))
        state = decision.state
        rate = float(seen[-1] or 0.0)  # Kafka's throttle holds its windowed rate at the limit
    assert seen == pytest.approx(expected)


def test_hysteresis_keeps_the_guard_on_inside_the_band_and_off_below_it() -> None:
    # n1 is under its limit of 1000 (not held back): its load alone decides.
    limits = {(client("n1"), PRODUCE): 1000.0}
    inside = step(one_broker(1000), GuardState({(1, NW_IN): 0.0}, limits, 0.0), [produce("n1", 910)], now_s=1)
    assert engaged(inside) == {(1, NW_IN)}  # 910 > 1000 x 0.9: still engaged
    below = step(one_broker(1000), GuardState({(1, NW_IN): 0.0}, limits, 0.0), [produce("n1", 890)], now_s=1)
    assert engaged(below) == set()
    assert below.released_now == [(1, NW_IN)]


def test_a_resource_whose_clients_are_held_back_releases_only_after_a_quota_window_under_the_band() -> None:
    # n1 throttled by its limit of 500: its windowed rate dipping to 850 (under 1000 x 0.9) between
    # two large requests is no sign its demand fell. The resource stays engaged for release_after_s
    # (11 s) of such dips, and releases at the first step after, if the load is still under.
    settings = one_broker(1000)
    state = GuardState({(1, NW_IN): 0.0}, {(client("n1"), PRODUCE): 500.0}, 0.0)
    held = [MeasuredFlow(client("n1"), PRODUCE, {1: 850.0}, throttled=True)]
    seen = []
    for second in range(1, 14):
        decision = step(settings, state, held, now_s=float(second))
        seen.append(bool(engaged(decision)))
        state = decision.state
    assert seen == [True] * 11 + [False, False]
    # A step back over the band restarts the count.
    state = GuardState({(1, NW_IN): 0.0}, {(client("n1"), PRODUCE): 500.0}, 0.0, below_since={(1, NW_IN): 0.0})
    over = step(settings, state, [MeasuredFlow(client("n1"), PRODUCE, {1: 950.0}, throttled=True)], now_s=5)
    assert engaged(over) == {(1, NW_IN)} and over.state.below_since == {}


# The feedback closes only once the resource has been engaged for a quota window (11 s): before,
# the window's load is the overload the limits had not decided yet.
ENGAGED_A_WINDOW_AGO = 11.0


def test_the_loop_does_not_close_on_the_window_from_before_the_engagement() -> None:
    # Engaged 5 s ago, the window 1500 of 1200 (the overload before the limits): the trim and the
    # damping stay out of it; a quota window after the engagement they close.
    limits = {(client("n1"), PRODUCE): 450.0, (client("n2"), PRODUCE): 450.0}
    flows = [produce("q1", 100), produce("q2", 100), produce("q3", 100),
             *(MeasuredFlow(client(n), PRODUCE, {1: 600.0}, throttled=True, recent={1: 450.0}) for n in ("n1", "n2"))]
    damped = one_broker(trim=TrimGains(damping=0.1))
    early = step(damped, GuardState(engaged={(1, NW_IN): 0.0}, limits=limits, last_step_s=4.0), flows, now_s=5)
    assert (early.resources[0].trim, early.resources[0].damping) == (1.0, 0.0)
    late = step(damped, GuardState(engaged={(1, NW_IN): 0.0}, limits=limits, last_step_s=10.0), flows, now_s=11)
    assert late.resources[0].trim == pytest.approx(0.99) and late.resources[0].damping == pytest.approx(0.025)


def test_the_trim_raises_the_shares_while_held_back_clients_leave_the_broker_under_its_limit() -> None:
    # Two noisy throttled at 450, the load they and three quiet carried over the window 1100 of 1200
    # (inside the hysteresis band, so the resource stays engaged):
    # the trim rises by gain x error = 0.1 x 100/1200 per second.
    state = GuardState(engaged={(1, NW_IN): -ENGAGED_A_WINDOW_AGO},
                       limits={(client("n1"), PRODUCE): 450.0, (client("n2"), PRODUCE): 450.0}, last_step_s=0.0)
    quiet = [produce("q1", 100), produce("q2", 100), produce("q3", 100)]
    throttled = [MeasuredFlow(client(n), PRODUCE, {1: 400.0}, throttled=True) for n in ("n1", "n2")]
    decision = step(one_broker(), state, [*quiet, *throttled], now_s=1)
    trim = 1 + 0.1 * 100 / 1200
    assert decision.resources[0].trim == pytest.approx(trim)
    assert limit_of(decision, "n1") == pytest.approx((1200 * trim - 300) / 2, abs=1)  # whole bytes/s
    # Over the next ten seconds, as much again per second less the leak toward 1 (0.01 x (trim - 1)
    # per second); then the bound: never above 1.15.
    later = step(one_broker(), decision.state, [*quiet, *throttled], now_s=11)
    assert later.resources[0].trim == pytest.approx(trim + 10 * (0.1 * 100 / 1200 - 0.01 * (trim - 1)))
    much_later = step(one_broker(), later.state, [*quiet, *throttled], now_s=71)
    assert much_later.resources[0].trim == pytest.approx(1.15)
    # A load far under (a window between two large requests): the change is capped at 0.01 per second.
    dipped = [MeasuredFlow(client(n), PRODUCE, {1: 150.0}, throttled=True) for n in ("n1", "n2")]
    capped = step(one_broker(), state, [*quiet, *dipped], now_s=2)
    assert capped.resources[0].trim == pytest.approx(1.02)
    assert engaged(capped) == {(1, NW_IN)}  # under the band since this step only


def test_the_trim_closes_on_the_carried_load_not_on_kafkas_windowed_rate() -> None:
    # Kafka's rate of a client sending a large request every few seconds reads up to a request high;
    # `carried` is what it put on the broker over the window: the trim integrates that.
    state = GuardState(engaged={(1, NW_IN): -ENGAGED_A_WINDOW_AGO}, limits={(client("n1"), PRODUCE): 1000.0},
                       last_step_s=0.0)
    flow = MeasuredFlow(client("n1"), PRODUCE, {1: 1250.0}, throttled=True, carried={1: 1140.0})
    decision = step(one_broker(), state, [flow], now_s=1)
    assert decision.resources[0].carried == pytest.approx(1140)
    assert decision.resources[0].trim == pytest.approx(1 + 0.1 * 60 / 1200)


def test_the_damping_lowers_the_shares_while_the_held_back_burst_and_raises_them_while_they_are_muted() -> None:
    # Two noisy held back at 450 and three quiet at 100 carried the limit over the window (the trim
    # stays at 1); over the last few seconds the noisy sent 600 each (a burst after a mute): the
    # damping takes 0.1 x (1200 - 1500) / 1200 = 0.025 of the limit from their shares. (Off by
    # default since the guard throttles with a token bucket: DEFAULT_DAMPING; asked for here.)
    damped = TrimGains(damping=0.1)
    state = GuardState(engaged={(1, NW_IN): -ENGAGED_A_WINDOW_AGO},
                       limits={(client("n1"), PRODUCE): 450.0, (client("n2"), PRODUCE): 450.0}, last_step_s=0.0)
    quiet = [produce("q1", 100), produce("q2", 100), produce("q3", 100)]

    def noisy(recent: float) -> list[MeasuredFlow]:
        return [MeasuredFlow(client(n), PRODUCE, {1: 450.0}, throttled=True, carried={1: 450.0}, recent={1: recent})
                for n in ("n1", "n2")]

    burst = step(one_broker(trim=damped), state, [*quiet, *noisy(600)], now_s=1)
    assert burst.resources[0].trim == 1.0
    assert burst.resources[0].damping == pytest.approx(-0.025)
    assert limit_of(burst, "n1") == pytest.approx((1200 * 0.975 - 300) / 2, abs=1)
    # Muted (nothing sent lately): the damping gives back, and the limits rise toward their new
    # target, (1200 x 1.075 - 300) / 2 = 495, by at most raise_per_s (5 % a second) as any rise.
    muted = step(one_broker(trim=damped), state, [*quiet, *noisy(0)], now_s=1)
    assert muted.resources[0].damping == pytest.approx(0.1 * 900 / 1200)
    assert limit_of(muted, "n1") == pytest.approx(450 * 1.05)
    capped = step(one_broker(trim=damped), state, [*quiet, *noisy(3000)], now_s=1)
    assert capped.resources[0].damping == pytest.approx(-0.1)
    # Without feedback (dry run), or nobody held back, no damping.
    dry = step(one_broker(feedback=False, trim=damped), state, [*quiet, *noisy(600)], now_s=1)
    assert dry.resources[0].damping == 0.0
    free = [MeasuredFlow(client("a"), PRODUCE, {1: 1150.0}, carried={1: 1150.0}, recent={1: 1500.0})]
    unheld = step(one_broker(trim=damped), GuardState(engaged={(1, NW_IN): -ENGAGED_A_WINDOW_AGO}), free, now_s=1)
    assert unheld.resources[0].damping == 0.0


def test_the_trim_does_not_wind_up_while_limits_rise_or_nobody_is_held_back() -> None:
    # Nobody held back (demand under the limit): the trim returns toward 1 at 0.01 per second.
    state = GuardState(engaged={(1, NW_IN): 0.0}, limits={}, last_step_s=0.0, trims={(1, NW_IN): 1.1})
    decision = step(one_broker(), state, [produce("a", 1150)], now_s=2)
    assert decision.resources[0].trim == pytest.approx(1.08)
    # A held-back client whose limit the raise rate still holds under its target: no integration.
    rising = GuardState(engaged={(1, NW_IN): 0.0}, limits={(client("n1"), PRODUCE): 450.0}, last_step_s=0.0,
                        rising=frozenset({(client("n1"), PRODUCE)}))
    decision = step(one_broker(), rising, [produce("n1", 450)], now_s=1)
    assert decision.resources[0].trim == 1.0


def test_several_brokers_with_different_binding_resources() -> None:
    # Two brokers, RF 2: every produced byte is fetched by the other broker's follower, so each
    # broker's NW_IN is the cluster's produce and a leader's NW_OUT is its fetches plus its produce.
    # Limits: broker 1 NW_IN 900, broker 2 NW_OUT 1100 (the others out of reach).
    settings = GuardSettings(
        limits={(1, NW_IN): 900, (1, NW_OUT): BIG, (2, NW_IN): BIG, (2, NW_OUT): 1100},
        replication_factor=2, fall_per_s=0.0,
    )
    flows = [
        produce("p", {1: 600}),  # produce to broker 1
        produce("q", {2: 600}),  # produce to broker 2
        fetch("f", {2: 500}),
        fetch("g", {2: 300}),
    ]
    decision = step(settings, GuardState(), flows, now_s=0)
    loads = {(r.broker, r.resource): r.load for r in decision.resources}
    assert loads == pytest.approx({(1, NW_IN): 1200, (1, NW_OUT): 600, (2, NW_IN): 1200, (2, NW_OUT): 1400})
    # Broker 2 NW_OUT binds first: min(500,L) + min(300,L) + min(600,L) = 1100 at L = 400 (g under it).
    # Then broker 1 NW_IN: p + q = p + 400 = 900, so p = 500.
    assert limit_of(decision, "q") == pytest.approx(400)
    assert limit_of(decision, "f", FETCH) == pytest.approx(400)
    assert limit_of(decision, "p") == pytest.approx(500)
    assert limit_of(decision, "g", FETCH) is None
    assert engaged(decision) == {(1, NW_IN), (2, NW_OUT)}


def test_weights_share_in_proportion() -> None:
    # 2L + L = 1200: a (weight 2) gets 800, b gets 400.
    settings = one_broker(weights={client("a"): 2.0})
    decision = step(settings, GuardState(), [produce("a", 1000), produce("b", 1000)], now_s=0)
    assert limit_of(decision, "a") == pytest.approx(800)
    assert limit_of(decision, "b") == pytest.approx(400)


def test_protected_entities_and_the_floor() -> None:
    # Limit 1000: p protected at 400, z at 90 (under the floor of 100, never limited), x and y at 500
    # with y's weight 0.2: x + y = 510, y = max(100, 0.2 x) = 100 (the floor), so x = 410.
    settings = one_broker(1000, protected=frozenset({client("p")}), weights={client("y"): 0.2}, floor=100.0)
    flows = [produce("p", 400), produce("z", 90), produce("x", 500), produce("y", 500)]
    decision = step(settings, GuardState(), flows, now_s=0)
    assert limit_of(decision, "p") is None
    assert limit_of(decision, "z") is None
    assert limit_of(decision, "x") == pytest.approx(410, abs=1)
    assert limit_of(decision, "y") == pytest.approx(100)


def test_the_floor_holds_even_when_it_cannot_bring_the_load_under_the_limit() -> None:
    # Protected 600 + two at the floor of 250 = 1100 > 1000: the guard limits them to the floor, no lower.
    settings = one_broker(1000, protected=frozenset({client("p")}), floor=250.0)
    decision = step(settings, GuardState(), [produce("p", 600), produce("x", 500), produce("y", 500)], now_s=0)
    assert limit_of(decision, "x") == pytest.approx(250)
    assert limit_of(decision, "y") == pytest.approx(250)


def test_an_entity_with_a_configured_quota_gets_the_lower_of_the_two() -> None:
    # a holds at its configured 300, c at its configured 700, b unlimited at 1000; limit 1200.
    # 300 + L + L = 1200: L = 450, under c's configured 700: c's effective quota is the guard's 450.
    flows = [produce("a", 300, configured=300), produce("b", 1000), produce("c", 700, configured=700)]
    decision = step(one_broker(), GuardState(), flows, now_s=0)
    assert limit_of(decision, "b") == pytest.approx(450)
    c = status_of(decision, "c")
    assert c.guard_limit == pytest.approx(450)  # type: ignore[attr-defined]
    assert c.effective_quota == pytest.approx(450)  # type: ignore[attr-defined]
    a = status_of(decision, "a")
    assert a.guard_limit is None  # type: ignore[attr-defined]
    assert a.effective_quota == 300  # type: ignore[attr-defined]


def test_a_configured_quota_under_the_fair_share_is_left_to_bind() -> None:
    # c's configured 400 is under its share: 300 + L + 400 = 1200 gives b L = 500, c no guard limit.
    flows = [produce("a", 300, configured=300), produce("b", 1000), produce("c", 400, configured=400)]
    decision = step(one_broker(), GuardState(), flows, now_s=0)
    assert limit_of(decision, "b") == pytest.approx(500)
    c = status_of(decision, "c")
    assert c.guard_limit is None  # type: ignore[attr-defined]
    assert c.effective_quota == 400  # type: ignore[attr-defined]


def test_a_limit_its_flow_still_uses_rises_at_the_bounded_rate_after_release() -> None:
    # Released (load 600 <= 900) but n1 still runs at its limit of 600: its limit rises by 25 % a
    # step instead of vanishing, so that a held-back flow cannot jump the broker over its limit.
    state = GuardState(engaged={}, limits={(client("n1"), PRODUCE): 600.0}, last_step_s=0.0)
    decision = step(one_broker(1000), state, [produce("n1", 599)], now_s=5)
    assert limit_of(decision, "n1") == pytest.approx(750)


def test_a_flow_its_limit_throttled_is_held_back_though_its_windowed_rate_dipped() -> None:
    # Kafka mutes a throttled client for (rate - limit) / limit x window, so its windowed rate swings
    # under its limit between throttles: 380 B/s under a limit of 450 (below 0.95 x 450). Throttled in
    # the last window, it still wants more: it keeps its fair share (3 x 100 + 2 x 450 = 1200) ...
    state = GuardState(engaged={(1, NW_IN): -ENGAGED_A_WINDOW_AGO},
                       limits={(client("n1"), PRODUCE): 450.0, (client("n2"), PRODUCE): 450.0}, last_step_s=0.0)
    quiet = [produce("q1", 100), produce("q2", 100), produce("q3", 100)]
    throttled = [MeasuredFlow(client(n), PRODUCE, {1: 380.0}, throttled=True) for n in ("n1", "n2")]
    held = step(one_broker(), state, [*quiet, *throttled], now_s=1)
    # (The trim adds 0.01 of the limit, the most it moves in a second: the load they carried, 1060,
    # was under it, and 0.1 x 140/1200 is more than that.)
    share = (1200 * 1.01 - 300) / 2
    assert limit_of(held, "n1") == pytest.approx(share, abs=1)  # water_fill gives whole bytes/s
    assert limit_of(held, "n2") == pytest.approx(share, abs=1)
    # ... while the same rates without a recent throttle say the demand fell: the limits go
    # (1060 B/s is under 1200 x 0.9, so the resource releases too).
    fell = step(one_broker(), state, [*quiet, produce("n1", 380), produce("n2", 380)], now_s=1)
    assert fell.limits == {}


def test_a_new_limit_starts_at_the_flows_rate_and_falls_by_at_most_fall_per_s() -> None:
    # n1 at 900 over a limit of 1200 with three quiet at 100: target 900. By default (fall_per_s 0.1)
    # its first limit is its own rate less 10 %, then 10 % of the limit per second, down to the target.
    flows = [produce("q1", 100), produce("q2", 100), produce("q3", 100), produce("n1", 1000)]
    settings = GuardSettings(limits={(1, NW_IN): 1200.0, (1, NW_OUT): BIG})
    first = step(settings, GuardState(), flows, now_s=0)
    assert limit_of(first, "n1") == pytest.approx(900)  # max(target 900, 1000 x 0.9)
    flows = [produce("q1", 100), produce("q2", 100), produce("q3", 100), produce("n1", 2000)]
    first = step(settings, GuardState(), flows, now_s=0)
    assert limit_of(first, "n1") == pytest.approx(1800)
    second = step(settings, first.state, flows, now_s=1)
    assert limit_of(second, "n1") == pytest.approx(1620)


def test_a_held_back_flow_wants_more_only_on_the_brokers_its_limit_holds_it_on() -> None:
    # Two brokers, NW_IN limit 1000 on broker 1 only. n1 is throttled on broker 1 (held back there)
    # and sends 100 B/s to broker 2, under its limit: it wants more on broker 1 only. With RF 2 its
    # broker-2 traffic reaches broker 1's NW_IN as follower traffic at what it sends there (100),
    # where the old scaling (every broker x ceiling / peak) counted it at the ceiling's share.
    limits = {(1, NW_IN): 1000.0, (1, NW_OUT): BIG, (2, NW_IN): BIG, (2, NW_OUT): BIG}
    state = GuardState(engaged={(1, NW_IN): 0.0}, limits={(client("n1"), PRODUCE): 500.0}, last_step_s=0.0)
    n1 = MeasuredFlow(client("n1"), PRODUCE, {1: 480.0, 2: 100.0}, throttled=True, throttled_brokers=frozenset({1}))
    flows = [produce("q1", {1: 100.0}), n1]

    def share_and_room(replication_factor: int) -> tuple[float, float]:
        settings = GuardSettings(limits=limits, replication_factor=replication_factor, fall_per_s=0.0)
        decision = step(settings, state, flows, now_s=1)
        room = 1000.0 * decision.resources[0].trim  # the limit x the loop's feedback on the carried load
        return float(status_of(decision, "n1").target), room  # type: ignore[attr-defined]

    # RF 1: broker 1 carries q1 (100) and n1's broker-1 traffic: n1's share is the room less 100.
    share, room = share_and_room(1)
    assert share == pytest.approx(room - 100, abs=1)
    # RF 2: broker 1's NW_IN also carries n1's broker-2 traffic as a follower (100): less 200.
    share, room = share_and_room(2)
    assert share == pytest.approx(room - 200, abs=1)


def test_without_feedback_the_trim_stays_at_one() -> None:
    # Dry run: nothing is enforced, so the load (1860 of 1200) says nothing of the limits.
    state = GuardState(engaged={(1, NW_IN): 0.0},
                       limits={(client("n1"), PRODUCE): 450.0, (client("n2"), PRODUCE): 450.0}, last_step_s=0.0)
    flows = [produce("q1", 300), *(MeasuredFlow(client(n), PRODUCE, {1: 780.0}, throttled=True) for n in ("n1", "n2"))]
    decision = step(one_broker(feedback=False), state, flows, now_s=5)
    assert decision.resources[0].trim == 1.0
    assert limit_of(decision, "n1") == pytest.approx(450)
