"""The burst before the first throttle, in the simulator: the `ten` shape of `make system-test`
(ten librdkafka producers of one client-id, each offering 1x a 1 MiB/s quota, small requests)
through kqp beside Kafka's model, seed by seed, with the proxy's handling time as calibrated
(docs/testing.md, "The proxy's handling time"; docs/quotas.md, "Open on the wire").

    .venv/bin/python bench/simulator_burst.py                    # the table's `ten` row, seeds 0-11
    .venv/bin/python bench/simulator_burst.py --seeds 48 --scenario 'connections=10,...'

For each seed and side: what was acknowledged in the first 3 s (MB), when the first throttled
answer reached a client and its ThrottleTimeMs, the figure over the row's measured seconds and
the mean over twelve shifted windows (bench/quota_shapes.shifted_mean, as the wire's system test
prints it), request time-outs, and how fast a connection's waiting requests went through back to
back (the figure the proxy's handling time is calibrated on: Kafka's broker 1,500 a second on the
wire, one at a time through kqp 200-450). Virtual time: the same seed gives the same numbers anywhere.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Sequence

from bench.quota_shapes import shifted_mean
from kqpsim.clients import ConnectionRecord
from kqpsim.scenario import Figures, Scenario, parse_scenario, simulate
from kqpsim.table import TEN_PRODUCERS

FIRST_SECONDS = 3.0


def per_second(records: Sequence[ConnectionRecord], seconds: int) -> list[int]:
    totals = [0] * seconds
    for record in records:
        for at, size in record.acks:
            if at < seconds:
                totals[int(at)] += size
    return totals


def first_throttle(records: Sequence[ConnectionRecord]) -> tuple[float, int]:
    """When the first throttled answer reached a client, and the largest ThrottleTimeMs of the
    answers in the 100 ms after it (the first round of throttles)."""
    throttles = sorted(t for record in records for t in record.throttles)
    if not throttles:
        return math.nan, 0
    first = throttles[0][0]
    return first, max(ms for at, ms in throttles if at < first + 0.1)


def back_to_back(records: Sequence[ConnectionRecord]) -> float:
    """Requests a second a connection gets through while its next request is waiting: one over
    the median gap between an answer without a throttle and the connection's next answer, over
    the gaps under 20 ms (longer ones are the client's own pauses: its offer, its batching)."""
    gaps = []
    for record in records:
        throttled = {at for at, _ in record.throttles}
        gaps.extend(later - at for (at, _), (later, _) in zip(record.acks, record.acks[1:], strict=False)
                    if at not in throttled and 0 < later - at < 0.02)
    return 1.0 / statistics.median(gaps) if gaps else math.nan


def side(figures: Figures, scenario: Scenario) -> dict[str, float]:
    end = math.ceil(scenario.warmup + scenario.measure)
    seconds = per_second(figures.records, end)
    at, throttle_ms = first_throttle(figures.records)
    shifted = shifted_mean(seconds, round(scenario.warmup), end)
    return {
        "first": sum(size for r in figures.records for t, size in r.acks if t < FIRST_SECONDS) / 1e6,
        "throttled_at": at,
        "throttle_ms": throttle_ms,
        "plain": figures.admitted,
        "shifted": math.nan if shifted is None else shifted * 1024 * 1024 / scenario.quota.rate,
        "timeouts": figures.timeouts,
        "back_to_back": back_to_back(figures.records),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=12, help="seeds 0 .. N-1")
    parser.add_argument("--scenario", default="", help="a scenario as field=value,... (default: the table's "
                        "`ten` row)")
    args = parser.parse_args()
    scenario = parse_scenario(args.scenario) if args.scenario else TEN_PRODUCERS
    print(f"{scenario.name}: seconds {scenario.warmup:g}-{scenario.warmup + scenario.measure:g} measured")
    print("seed | first 3 s MB kqp / Kafka | first throttle at s (ms) kqp / Kafka | measured x quota kqp / Kafka "
          "| shifted x quota kqp / Kafka | time-outs kqp / Kafka | back to back, requests/s kqp / Kafka")
    rows = []
    for seed in range(args.seeds):
        outcome = simulate(scenario, seed)
        kqp, kafka = side(outcome.kqp, scenario), side(outcome.kafka, scenario)
        rows.append((kqp, kafka))
        print(f"{seed} | {kqp['first']:.2f} / {kafka['first']:.2f} | {kqp['throttled_at']:.2f} "
              f"({kqp['throttle_ms']:.0f}) / {kafka['throttled_at']:.2f} ({kafka['throttle_ms']:.0f}) | "
              f"{kqp['plain']:.3f} / {kafka['plain']:.3f} | {kqp['shifted']:.3f} / {kafka['shifted']:.3f} | "
              f"{kqp['timeouts']:.0f} / {kafka['timeouts']:.0f} | {kqp['back_to_back']:.0f} / "
              f"{kafka['back_to_back']:.0f}", flush=True)
    for key in ("first", "plain", "shifted", "timeouts", "back_to_back"):
        medians = [statistics.median(r[i][key] for r in rows) for i in (0, 1)]
        print(f"median {key}: kqp {medians[0]:.3f}, Kafka {medians[1]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
