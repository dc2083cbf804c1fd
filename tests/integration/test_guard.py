"""Acceptance (issue 36, 3): the cluster guard on real Kafka, with librdkafka producers at their defaults.

One broker; five producers, three at 100 kB/s and two at 800 kB/s (acks=all, linger.ms 5, 1 KB
records, a 64 MB queue: harness/paced_producers.py); a capacity file whose NW_IN limit is
1.2 MB/s (capacity x 0.8). With the guard on, the noisy two share what the quiet three leave
(1.2 MB/s - 300 kB/s = 450 kB/s each) and the quiet three keep their rate; when the noisy stop,
nobody is throttled 15 s later; one noisy producer with the quiet ones (1.1 MB/s, under the
limit, from producers connected before the offer starts) gets its whole offer and nobody is
throttled. With `dry_run: true` the same traffic is throttled by nobody and
the guard reports the limits it would have set.

Rates are what each producer had acknowledged, second by second. The load (their sum) is
judged over the whole converged span (from three quota windows on), within 0.95-1.05x the
limit, and over every 11 s window, within 0.90-1.10x (issue 41, acceptance 2): a backlogged
librdkafka producer held back by muting alone sends 1 MB requests (batch.size), and at a limit
of 450 kB/s one request is two seconds of its budget, so an 11 s window holds a whole number of
them, 7.6 % of the limit each. The guard's token bucket sends each noisy producer one every
2.3 s and spreads the two half a period apart (kqp.quotas.guard_limits: spread_admissions): 9
or 10 of theirs in every window (0.92-1.00x), where in phase they gave 8 or 10 (0.85x or 1.00x).
The 10 s extremes are printed beside, with the guard's metrics each second and its log.

Issue 41 adds two: the guard's metrics read through Prometheus as an operator's dashboard reads
them (the dashboard's guard row, kqp_guard_active engaging and releasing, the load gauge beside
what the producers had acknowledged), and a fleet of two instances with `guard.fleet_wide`.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from harness.local_kafka import KafkaCluster
from harness.paced_producers import ProducerTally, offer_from_clients
from harness.proxy_process import ProxyProcess
from tests.integration.helpers.fleet import metric, wait_for_fleet
from tests.integration.helpers.prometheus import SCRAPE_INTERVAL_S, dashboard_queries, scraping
from tests.integration.helpers.quota_proxy import ConfiguredProxy

pytestmark = pytest.mark.integration

LIMIT = 1_200_000  # NW_IN limit, bytes/s
QUIET, NOISY = 100_000, 800_000
QUIET_IDS = ("quiet-1", "quiet-2", "quiet-3")
NOISY_IDS = ("noisy-1", "noisy-2")
WINDOW_S = 11  # quota.window.num x quota.window.size.seconds
CONVERGED_S = 3 * WINDOW_S  # the convergence bound: three quota windows
RUN_S = 75
ALONE_S = 40  # one noisy producer with the quiet three, under the limit


def guard_config(tmp_path: Path, dry_run: bool) -> Path:
    capacity = tmp_path / "capacity.json"
    # Cruise Control's NW_IN is in KB/s (1024 bytes); the guard's limit is capacity x 0.8.
    nw_in_kb = LIMIT / 0.8 / 1024
    capacity.write_text(json.dumps({"brokerCapacities": [
        {"brokerId": "-1", "capacity": {"DISK": "100000", "CPU": "100", "NW_IN": str(nw_in_kb), "NW_OUT": "100000"},
         "doc": "issue 36, acceptance 3"},
    ]}))
    config = tmp_path / "guard.yaml"
    config.write_text(
        f"guard:\n  enabled: true\n  dry_run: {'true' if dry_run else 'false'}\n  capacity_file: {capacity}\n"
        "  replication_factor: 1\n  interval_seconds: 1\n"
    )
    return config


def throttles(proxy: ProxyProcess, client_id: str, enforced: bool = True) -> float:
    """kqp_throttles for this client-id's produce, summed over users."""
    total = 0.0
    wanted = ('quota_type="producer_byte_rate"', f'client_id="{client_id}"', f'enforced="{str(enforced).lower()}"')
    for line in proxy.metrics_text().splitlines():
        if line.startswith("kqp_throttles_total") and all(w in line for w in wanted):
            total += float(line.rsplit(" ", 1)[1])
    return total


def increase_between(earlier: dict[str, float], later: dict[str, float]) -> dict[str, float]:
    """Throttles (or any per-client counter: request bytes) per client between two readings. A
    counter that went down was reset (the proxy drops an idle client-id's series,
    kqp/proxy/metrics.py rerank_top_entities, and starts it again at 0 when the client comes
    back): all of its later value is new, as Prometheus's increase() reads a reset."""
    return {client: (later[client] - earlier.get(client, 0.0) if later[client] >= earlier.get(client, 0.0)
                     else later[client])
            for client in later}


def request_bytes(proxy: ProxyProcess) -> dict[str, float]:
    """kqp_client_request_bytes per client-id (the proxy's traffic counter, not the guard's sensors)."""
    total: dict[str, float] = {}
    for line in proxy.metrics_text().splitlines():
        match = re.match(r'kqp_client_request_bytes_total\{(.*)\} (\S+)$', line)
        if match:
            client_id = dict(re.findall(r'(\w+)="([^"]*)"', match[1]))["client_id"]
            total[client_id] = total.get(client_id, 0.0) + float(match[2])
    return total


def guard_limits(proxy: ProxyProcess) -> dict[str, float]:
    limits = {}
    for line in proxy.metrics_text().splitlines():
        match = re.match(r'kqp_guard_entity_limit_bytes_per_second\{(.*)\} (\S+)$', line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match[1]))
            limits[f"{labels['entity']} {labels['dry_run']}"] = float(match[2])
    return limits


class GuardSampler:
    """The guard's metrics once a second, in a thread: load, engaged, and each entity's limit."""

    def __init__(self, proxy: ProxyProcess) -> None:
        self.proxy = proxy
        self.samples: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GuardSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        start = time.monotonic()
        while not self._stop.wait(1.0):
            text = self.proxy.metrics_text()
            load = re.search(r'kqp_guard_load_bytes_per_second\{broker="1",resource="NW_IN"\} (\S+)', text)
            active = re.search(r'kqp_guard_active\{broker="1",resource="NW_IN"\} (\S+)', text)
            limits = {name.split()[0]: round(value / 1000) for name, value in guard_limits(self.proxy).items()}
            self.samples.append(f"{time.monotonic() - start:.0f}s load {float(load[1]) / 1000 if load else 0:.0f} "
                                f"active {active[1] if active else '-'} limits {limits}")


def window_means(per_second: list[int], first: int, last: int, span: int) -> list[float]:
    return [sum(per_second[s - span:s]) / span for s in range(first + span, last + 1)]


def load_of(tallies: dict[str, ProducerTally]) -> list[int]:
    seconds = len(next(iter(tallies.values())).per_second)
    return [sum(t.per_second[s] for t in tallies.values()) for s in range(seconds)]


def test_the_guard_shares_the_limit_and_lets_go(kafka_1node: KafkaCluster, tmp_path: Path) -> None:
    kafka_1node.create_topic("guarded", partitions=1, replication=1)
    proxy = ConfiguredProxy(kafka_1node.bootstrap, tmp_path / "proxy.log", guard_config(tmp_path, dry_run=False))
    proxy.start()
    try:
        everyone = {**dict.fromkeys(QUIET_IDS, QUIET), **dict.fromkeys(NOISY_IDS, NOISY)}
        with GuardSampler(proxy) as sampler:
            shared = offer_from_clients(proxy.bootstrap, "guarded", everyone, RUN_S)
        limits_seen = guard_limits(proxy)
        # The noisy stop: 15 s later nobody is throttled any more.
        quiet = dict.fromkeys(QUIET_IDS, QUIET)
        before = {c: throttles(proxy, c) for c in everyone}
        offer_from_clients(proxy.bootstrap, "guarded", quiet, 15)
        after_15 = {c: throttles(proxy, c) for c in everyone}
        offer_from_clients(proxy.bootstrap, "guarded", quiet, 15)
        after_30 = {c: throttles(proxy, c) for c in everyone}
        # One noisy producer with the quiet ones: 1.1 MB/s, under the limit, from producers already
        # connected (harness.paced_producers._connect: a producer's start-up backlog would put the
        # offer of more seconds than it spans into the guard's first window).
        forwarded_before = request_bytes(proxy)
        with GuardSampler(proxy) as alone_sampler:
            alone = offer_from_clients(proxy.bootstrap, "guarded", {**quiet, "noisy-1": NOISY}, ALONE_S,
                                       connected_first=True)
        forwarded_alone = request_bytes(proxy)
        after_alone = {c: throttles(proxy, c) for c in everyone}
    finally:
        assert proxy.stop() == 0, proxy.log_tail()

    load = load_of(shared)
    window = window_means(load, CONVERGED_S, RUN_S, WINDOW_S)
    ten = window_means(load, CONVERGED_S, RUN_S, 10)
    rates = {c: t.rate(CONVERGED_S, RUN_S) for c, t in shared.items()}
    left = (LIMIT - sum(rates[c] for c in QUIET_IDS)) / len(NOISY_IDS)
    print(f"guard on, seconds {CONVERGED_S}-{RUN_S}: load over 11 s {min(window) / LIMIT:.3f}x to "
          f"{max(window) / LIMIT:.3f}x the limit (over 10 s {min(ten) / LIMIT:.3f}x to {max(ten) / LIMIT:.3f}x); "
          f"rates {({c: round(r) for c, r in rates.items()})}; equal share of what is left {left:.0f}; "
          f"guard limits at the end {limits_seen}; noisy-1 alone {alone['noisy-1'].rate(15, ALONE_S):.0f} B/s; "
          f"throttles before/15 s/30 s after the noisy stopped {before} {after_15} {after_30}")
    print("load per second (kB):", [round(b / 1000) for b in load])
    for client_id in NOISY_IDS:
        print(f"{client_id} per second (kB):", [round(b / 1000) for b in shared[client_id].per_second])
    print("the guard's metrics each second (kB/s):\n" + "\n".join(sampler.samples))
    print("the guard's log:\n" + "\n".join(line for line in proxy.log_tail(400).splitlines() if "guard" in line))
    span = sum(load[CONVERGED_S:RUN_S]) / (RUN_S - CONVERGED_S)
    print(f"load over seconds {CONVERGED_S}-{RUN_S}: {span / LIMIT:.3f}x the limit")
    # Issue 41, acceptance 2: over the converged span within 0.95-1.05x, over every 11 s window 0.90-1.10x.
    assert 0.95 * LIMIT <= span <= 1.05 * LIMIT, f"{span / LIMIT:.3f}x the limit once converged"
    assert min(window) >= 0.90 * LIMIT and max(window) <= 1.10 * LIMIT, (min(window) / LIMIT, max(window) / LIMIT)
    for client_id in QUIET_IDS:
        assert abs(rates[client_id] - QUIET) <= 0.05 * QUIET, (client_id, rates[client_id])
    for client_id in NOISY_IDS:
        assert abs(rates[client_id] - left) <= 0.10 * left, (client_id, rates[client_id], left)
    assert any(name.startswith("client-id=noisy") for name in limits_seen), limits_seen
    assert not any(name.startswith("client-id=quiet") for name in limits_seen), limits_seen
    assert not any(increase_between(after_15, after_30).values()), \
        "a client was throttled 15 s after the noisy producers stopped"
    # Under the limit: nobody throttled, wherever the load offered was under the limit over every
    # window the guard judges (10-11 s: Kafka's windowed rate spans 10 to 11 one-second samples).
    # The offer is what the producers handed to produce() each second, in the bytes the broker
    # receives: times the Produce requests' overhead over their records, which the proxy's
    # traffic counter gives for the phase (a quiet producer's request carries one or two 1 KB
    # records, so the 1.1 MB/s of records are about 1.16 MB/s of requests, 0.97x the limit).
    # Only a pacer starved by the host and catching up can offer more over a window; the
    # assertion then does not apply, and the line printed says so.
    alone_ids = (*QUIET_IDS, "noisy-1")
    acked_alone = sum(sum(alone[c].per_second) for c in alone_ids)
    overhead = sum(increase_between(forwarded_before, forwarded_alone).get(c, 0.0) for c in alone_ids) / acked_alone
    offered = [sum(alone[c].offered[s] for c in alone_ids) for s in range(ALONE_S)]
    peak_offer = overhead * max(window_means(offered, 0, ALONE_S, 10) + window_means(offered, 0, ALONE_S, 11))
    throttled_alone = increase_between(after_30, after_alone)
    acked_each_second = [round(sum(alone[c].per_second[s] for c in alone_ids) / 1000) for s in range(ALONE_S)]
    print(f"noisy-1 with the quiet three: offered at most {peak_offer / LIMIT:.3f}x the limit over a 10-11 s "
          f"window (the records x {overhead:.3f}, the requests' overhead); throttles {throttled_alone}; "
          f"acknowledged per second (kB) {acked_each_second}; the guard's metrics each second (kB/s):")
    print("\n".join(alone_sampler.samples))
    if peak_offer <= LIMIT:
        assert not any(throttled_alone.values()), \
            f"a client was throttled while the load offered stayed under the limit ({peak_offer / LIMIT:.3f}x)"
    else:
        print("the offer itself went over the limit over a window (the pacer caught up): no-throttle not judged")
    assert alone["noisy-1"].rate(15, ALONE_S) >= 0.95 * NOISY


def test_dry_run_throttles_nothing_and_reports_the_limits(kafka_1node: KafkaCluster, tmp_path: Path) -> None:
    kafka_1node.create_topic("guarded-dry", partitions=1, replication=1)
    proxy = ConfiguredProxy(kafka_1node.bootstrap, tmp_path / "proxy.log", guard_config(tmp_path, dry_run=True))
    proxy.start()
    try:
        everyone = {**dict.fromkeys(QUIET_IDS, QUIET), **dict.fromkeys(NOISY_IDS, NOISY)}
        tallies = offer_from_clients(proxy.bootstrap, "guarded-dry", everyone, 40)
        limits_seen = guard_limits(proxy)
        enforced = {c: throttles(proxy, c) for c in everyone}
        computed = {c: throttles(proxy, c, enforced=False) for c in everyone}
    finally:
        assert proxy.stop() == 0, proxy.log_tail()
    rates = {c: t.rate(15, 40) for c, t in tallies.items()}
    print(f"dry run: rates {({c: round(r) for c, r in rates.items()})}; limits reported {limits_seen}; "
          f"throttles enforced {enforced}, computed {computed}")
    assert all(value == 0 for value in enforced.values()), enforced
    for client_id in NOISY_IDS:
        assert rates[client_id] >= 0.95 * NOISY, (client_id, rates[client_id])
        reported = limits_seen.get(f"client-id={client_id} true")
        assert reported is not None, limits_seen
        assert reported == pytest.approx((LIMIT - 3 * QUIET) / 2, rel=0.10)
    assert computed["noisy-1"] > 0 and computed["noisy-2"] > 0


# The metrics test's timeline (seconds from the producers' start): the noisy two for NOISY_S,
# the quiet three throughout. The guard must release within two quota windows of the noisy
# stop: one for their windowed rates to fall under the release level, one more while the
# clients it held back still count as held back (kqp.quotas.guard: release_after_s); one
# second more for its step and Prometheus's scrape.
NOISY_S = 30
RELEASED_BY_S = NOISY_S + 2 * WINDOW_S + 1
METRICS_RUN_S = RELEASED_BY_S + 6
GUARD_ROW = "Cluster guard"
ACTIVE = 'kqp_guard_active{broker="1",resource="NW_IN"}'
LOAD = 'kqp_guard_load_bytes_per_second{broker="1",resource="NW_IN"}'
# The Produce request bytes the proxy received (its traffic counter, not the guard's sensors):
# what the broker's NW_IN carries and Kafka's quotas count, the protocol's overhead included.
PRODUCE_BYTES = 'kqp_request_bytes_total{api="Produce"}'


def on_the_second(series: list[tuple[float, float]], start: float) -> dict[int, float]:
    """A Prometheus range's values by whole second since `start` (wall clock)."""
    return {round(at - start): value for at, value in series}


def test_the_guard_metrics_an_operator_reads(kafka_1node: KafkaCluster, tmp_path: Path) -> None:
    """Issue 41: Prometheus scraping the guard's proxy, as an operator's does: kqp_guard_active goes
    to 1 once the broker's load is over its limit and back to 0 after the noisy producers stop;
    kqp_guard_load_bytes_per_second follows what the producers had acknowledged; every query of
    the dashboard's guard row answers while the guard limits someone."""
    kafka_1node.create_topic("guarded-metrics", partitions=1, replication=1)
    proxy = ConfiguredProxy(kafka_1node.bootstrap, tmp_path / "proxy.log", guard_config(tmp_path, dry_run=False))
    proxy.start()
    tallies: dict[str, ProducerTally] = {}
    try:
        with scraping(proxy.metrics_port, tmp_path) as prometheus:
            guard_row = dashboard_queries(GUARD_ROW)
            wall_start = time.time()

            def offer(offers: dict[str, float], seconds: int) -> None:
                tallies.update(offer_from_clients(proxy.bootstrap, "guarded-metrics", offers, seconds))

            producers = [threading.Thread(target=offer, args=(dict.fromkeys(QUIET_IDS, QUIET), METRICS_RUN_S)),
                         threading.Thread(target=offer, args=(dict.fromkeys(NOISY_IDS, NOISY), NOISY_S))]
            for thread in producers:
                thread.start()
            # While the guard limits the noisy two, every query of its dashboard row answers.
            time.sleep(NOISY_S - 8)
            unanswered = [expr for expr in guard_row if not prometheus.query(expr)]
            limited = {series["metric"]["entity"]
                       for series in prometheus.query("kqp_guard_entity_limit_bytes_per_second")}
            for thread in producers:
                thread.join(METRICS_RUN_S + 120)
            time.sleep(2 * SCRAPE_INTERVAL_S)  # the last seconds scraped
            active = on_the_second(prometheus.series(ACTIVE, wall_start, wall_start + METRICS_RUN_S), wall_start)
            load = on_the_second(prometheus.series(LOAD, wall_start, wall_start + METRICS_RUN_S), wall_start)
            produced = on_the_second(prometheus.series(PRODUCE_BYTES, wall_start, wall_start + METRICS_RUN_S),
                                     wall_start)
    finally:
        assert proxy.stop() == 0, proxy.log_tail()

    acked = [sum(t.per_second[s] for t in tallies.values() if s < len(t.per_second)) for s in range(METRICS_RUN_S)]
    # What the producers had acknowledged, and the Produce request bytes forwarded, over the quota
    # window ending at each second.
    trailing = {s: sum(acked[s - WINDOW_S:s]) / WINDOW_S for s in range(WINDOW_S, METRICS_RUN_S + 1)}
    forwarded = {s: (produced[s] - produced[s - WINDOW_S]) / WINDOW_S for s in produced if s - WINDOW_S in produced}
    print(f"guard row queries {guard_row}; unanswered {unanswered}; limited {sorted(limited)}")
    print("second: active, load gauge, Produce bytes forwarded and acknowledged over the last 11 s (kB/s)\n"
          + "\n".join(f"{s}: {active.get(s, '-')} {load.get(s, 0) / 1000:.0f} {forwarded.get(s, 0) / 1000:.0f} "
                       f"{trailing.get(s, 0) / 1000:.0f}" for s in range(METRICS_RUN_S + 1)))
    print("the guard's log:\n" + "\n".join(line for line in proxy.log_tail(400).splitlines() if "guard" in line))

    assert len(guard_row) >= 4 and unanswered == [], f"guard row queries without a series: {unanswered}"
    assert limited == {"client-id=noisy-1", "client-id=noisy-2"}, limited
    # Engaged once, while the noisy produce, at a second whose load was over the limit; released
    # once, within two quota windows of their stop, and not again engaged.
    engaged = sorted(s for s, value in active.items() if value == 1)
    assert engaged, f"kqp_guard_active never went to 1: {active}"
    first, last = engaged[0], engaged[-1]
    assert first < NOISY_S and load[first] > LIMIT, (first, load.get(first))
    assert all(active.get(s) == 1 for s in range(first, last + 1)), f"the guard flapped: {active}"
    assert NOISY_S <= last < RELEASED_BY_S, f"released at {last + 1} s, the noisy stopped at {NOISY_S} s"
    assert all(active[s] == 0 for s in active if s > last)
    # The load gauge follows the load the broker takes, the Produce request bytes forwarded (the
    # records acknowledged are 10-12 % fewer bytes here: a quiet producer's request carries one or
    # two 1 KB records at linger.ms 5, and its headers): over the guarded span, and once the quota
    # window holds only the quiet three. The gauge is Kafka's windowed rate, which starts a window
    # at a request's arrival (Kafka starts a sample at its first record) and so counts that
    # request whole over less than the time it stands for: up to one request per producer sending
    # large ones high, the noisy two's 1 MB requests over Kafka's 10-11 s window, 0.16x the limit
    # (about half that on average). The quiet three's small requests leave only the windows' phase.
    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    guarded = range(first + WINDOW_S, NOISY_S)
    quiet = range(NOISY_S + WINDOW_S + 3, METRICS_RUN_S)
    large_requests = len(NOISY_IDS) * 1_000_000 / 10.5
    for span in (guarded, quiet):
        gauge, truth = mean([load[s] for s in span]), mean([forwarded[s] for s in span])
        ceiling = 1.05 * truth + (large_requests if span is guarded else 0.0)
        print(f"seconds {span.start}-{span.stop}: gauge {gauge:.0f} B/s, Produce bytes forwarded {truth:.0f} B/s "
              f"({gauge / truth:.3f}x; acknowledged {mean([trailing[s] for s in span]):.0f}), "
              f"allowed {0.95 * truth:.0f}-{ceiling:.0f}")
        assert 0.95 * truth <= gauge <= ceiling, (span, gauge, truth)


FLEET_RUN_S = 60


@pytest.mark.skipif(os.environ.get("KQP_GUARD_FLEET_WIRE") != "1", reason=(
    "issue 41 acceptance 3, not yet in make test (2026-11-27): passed its one run (heavy, load 2.54 before: "
    "the broker at 0.899x the limit over seconds 33-60, 11 s windows 0.691-1.066x, both instances engaged, "
    "noisy limits 456 and 445 kB/s), but its check that the two instances' load gauges agree within 10 % "
    "compares two windowed rates at one instant, whose spread over runs with 1 MB requests is not known; "
    "KQP_GUARD_FLEET_WIRE=1 runs it, until it has had several runs"))
def test_a_fleet_of_two_guards_the_load_both_forward(kafka_1node: KafkaCluster, tmp_path: Path) -> None:
    """Issue 41 (fleet): two instances with guard.fleet_wide, each forwarding one quiet and one noisy
    producer (900 kB/s each, under the 1.2 MB/s limit alone; 1.8 MB/s together). Each instance's
    guard measures both instances' load, both engage and limit their noisy producer, and the
    broker's acknowledged load over the converged span is within its limit +5 % (acceptance 3's
    bound, here on one broker)."""
    kafka_1node.create_topic("guarded-fleet", partitions=1, replication=1)
    proxies = []
    try:
        for index in range(2):
            workdir = tmp_path / f"instance-{index}"
            workdir.mkdir()
            config = guard_config(workdir, dry_run=False)
            config.write_text(config.read_text() + "  fleet_wide: true\nfleet:\n  enabled: true\n"
                              "  topic: _kqp_usage-guarded-fleet\n  report_interval_seconds: 0.1\n")
            proxies.append(ConfiguredProxy(kafka_1node.bootstrap, tmp_path / f"proxy-{index}.log", config).start())
        wait_for_fleet(proxies)
        tallies: dict[str, ProducerTally] = {}

        def offer(proxy: ProxyProcess, offers: dict[str, float]) -> None:
            tallies.update(offer_from_clients(proxy.bootstrap, "guarded-fleet", offers, FLEET_RUN_S))

        producers = [threading.Thread(target=offer, args=(proxy, {f"quiet-{index}": QUIET, f"noisy-{index}": NOISY}))
                     for index, proxy in enumerate(proxies, start=1)]
        for thread in producers:
            thread.start()
        time.sleep(FLEET_RUN_S - 10)
        seen = [(metric(proxy, "kqp_guard_load_bytes_per_second", broker="1", resource="NW_IN"),
                 metric(proxy, "kqp_guard_active", broker="1", resource="NW_IN"), guard_limits(proxy))
                for proxy in proxies]
        for thread in producers:
            thread.join(FLEET_RUN_S + 120)
    finally:
        for proxy in proxies:
            assert proxy.stop() == 0, proxy.log_tail()
    load = [sum(t.per_second[s] for t in tallies.values()) for s in range(FLEET_RUN_S)]
    span = sum(load[CONVERGED_S:]) / (FLEET_RUN_S - CONVERGED_S)
    rates = {c: round(t.rate(CONVERGED_S, FLEET_RUN_S)) for c, t in tallies.items()}
    window = window_means(load, CONVERGED_S, FLEET_RUN_S, WINDOW_S)
    print(f"fleet of 2, seconds {CONVERGED_S}-{FLEET_RUN_S}: load {span / LIMIT:.3f}x the limit, 11 s windows "
          f"{min(window) / LIMIT:.3f}x to {max(window) / LIMIT:.3f}x; rates {rates}; each instance's load gauge, "
          f"active and limits at {FLEET_RUN_S - 10} s: {seen}")
    print("load per second (kB):", [round(b / 1000) for b in load])
    gauges = [gauge or 0.0 for gauge, _, _ in seen]
    for index, (gauge, active, limits) in enumerate(seen, start=1):
        # Each instance forwards at most 900 kB/s (0.75x the limit), about half of that once its
        # noisy producer is limited: a gauge above that is the other instance's reports counted.
        assert gauge is not None and gauge > 0.75 * LIMIT, (index, gauge)
        assert active == 1, (index, active)
        assert f"client-id=noisy-{index} false" in limits, (index, limits)
    # Both measure the same load, a report interval apart (and a second's step).
    assert max(gauges) - min(gauges) <= 0.10 * max(gauges), gauges
    assert span <= 1.05 * LIMIT, f"{span / LIMIT:.3f}x the limit once converged"
