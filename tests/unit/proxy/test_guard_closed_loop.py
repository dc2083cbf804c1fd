"""The cluster guard in closed loop, virtual time: clients that obey ThrottleTimeMs, the engine, the loop.

Each client offers its rate in one produce every 100 ms and, as a Kafka client and the broker's
muted channel do, sends nothing while a throttle it was given runs (what it would have sent then
is lost: the demand is an offered rate, not a backlog). The guard steps every second. Judged
as the issue asks: the NW_IN load once converged (three quota windows after a change), the
quiet clients' and noisy clients' shares, no throttle once the load is under the limit, and how
far the load moves (oscillation).

The load is judged at its mean over the quota window (11 s), not over 10 s: a throttled Kafka
client is muted for (rate - quota) / quota x window and then sends at its full rate, so a span
shorter than the window that holds its throttle cycle depends on the cycle's phase. Over 10 s
the same run reaches 1.09x the limit early on while its 11 s means stay within 1.04x. That
movement is Kafka's own sawtooth on a fixed quota, not the guard's: the test also asserts that
the guard limits move by no more than the trim's integral once converged.
"""

from __future__ import annotations

import json
from pathlib import Path

from kqp.config.quota_sections import GuardSection
from kqp.proxy.guard import GuardLoop
from kqp.quotas import QuotaEngine, QuotaSettings
from kqp.quotas.guard_control import DEFAULT_MAX_DAMPING

LIMIT = 1500 * 1024 * 0.8  # NW_IN 1500 KB/s at the 0.8 threshold: 1,228,800 B/s
QUIET, NOISY = 102_400, 819_200
TICK_MS = 100
WINDOW_S = 11  # quota.window.num x quota.window.size.seconds


class Simulation:
    def __init__(self, tmp_path: Path) -> None:
        path = tmp_path / "capacity.json"
        path.write_text(json.dumps({"brokerCapacities": [
            {"brokerId": "-1", "capacity": {"DISK": "1", "CPU": "100", "NW_IN": "1500", "NW_OUT": "100000"}},
        ]}))
        section = GuardSection(enabled=True, capacity_file=str(path), replication_factor=1)
        self.now_ms = 0
        self.engine = QuotaEngine(QuotaSettings())
        self.loop = GuardLoop(self.engine, section, lambda: [1], lambda: float(self.now_ms))
        self.limits: list[dict[str, float]] = []  # the guard limits after each step
        self.muted_until: dict[str, int] = {}
        self.sent: dict[str, list[float]] = {}  # bytes per second, per client
        self.throttles: list[int] = []  # throttle ms given, per second

    def run(self, seconds: int, rates: dict[str, float]) -> None:
        for _ in range(seconds):
            second = len(self.throttles)
            self.throttles.append(0)
            for _ in range(1000 // TICK_MS):
                for name, rate in rates.items():
                    row = self.sent.setdefault(name, [])
                    row.extend([0.0] * (second + 1 - len(row)))
                    if self.muted_until.get(name, 0) > self.now_ms or rate <= 0:
                        continue
                    nbytes = int(rate * TICK_MS / 1000)
                    throttle = self.engine.record_produce("1", "", name, nbytes, self.now_ms)
                    row[second] += nbytes
                    if throttle > 0:
                        self.muted_until[name] = self.now_ms + throttle
                        self.throttles[second] += throttle
                self.now_ms += TICK_MS
            decision = self.loop.tick()
            self.limits.append({key[0].client_id or "": limit for key, limit in decision.limits.items()})

    def load(self) -> list[float]:
        seconds = len(self.throttles)
        return [sum(row[s] if s < len(row) else 0.0 for row in self.sent.values()) for s in range(seconds)]

    def mean(self, series: list[float], start: int, end: int) -> float:
        return sum(series[start:end]) / (end - start)


def window_means(series: list[float], start: int, end: int) -> list[float]:
    """The mean over each quota window (WINDOW_S seconds) that ends in [start + WINDOW_S, end]."""
    return [sum(series[s - WINDOW_S:s]) / WINDOW_S for s in range(start + WINDOW_S, end + 1)]


def test_the_issues_shape_converges_without_oscillation_and_releases(tmp_path: Path) -> None:
    sim = Simulation(tmp_path)
    everyone = {"q1": QUIET, "q2": QUIET, "q3": QUIET, "n1": NOISY, "n2": NOISY}
    sim.run(120, everyone)
    load = sim.load()
    fair = (LIMIT - 3 * QUIET) / 2
    # Converged within three quota windows (33 s); judged from there on. The limits are the fair
    # share of the limit x (trim + damping) (kqp.quotas.guard_control): the trim moves them by its
    # integral of the carried load only, by less than 1 % of the limit over the quota window (their
    # 11 s mean); the damping moves them about that mean, each by at most half of its bound (0.1 of
    # the limit, shared by the two held back), and by nothing over a window.
    converged_limits = [limits for limits in sim.limits[3 * WINDOW_S:]]
    assert all(set(limits) == {"n1", "n2"} for limits in converged_limits)
    for name in ("n1", "n2"):
        held = [limits[name] for limits in converged_limits]
        assert fair * 0.85 <= min(held) and max(held) <= fair * 1.15  # the trim's bounds
        means = window_means(held, 0, len(held))
        assert max(means) - min(means) <= 0.01 * LIMIT, (min(means), max(means))
        assert all(abs(limit - mean) <= DEFAULT_MAX_DAMPING * LIMIT / 2
                   for limit, mean in zip(held[WINDOW_S - 1:], means, strict=True))
    converged = window_means(load, 3 * WINDOW_S, 120)
    assert max(converged) <= LIMIT * 1.05, max(converged)
    assert LIMIT * 0.95 <= sum(load[3 * WINDOW_S:120]) / (120 - 3 * WINDOW_S) <= LIMIT  # capacity used, not over
    assert max(converged) - min(converged) <= 0.10 * LIMIT  # no oscillation beyond 10 % of the limit
    for name in ("q1", "q2", "q3"):
        assert sim.mean(sim.sent[name], 3 * WINDOW_S, 120) >= 0.95 * QUIET, name
    for name in ("n1", "n2"):
        share = sim.mean(sim.sent[name], 3 * WINDOW_S, 120)
        assert abs(share - fair) <= 0.10 * fair, (name, share, fair)

    # The noisy ones stop: 15 s later nobody is throttled, and the guard holds no limit.
    sim.run(60, {"q1": QUIET, "q2": QUIET, "q3": QUIET, "n1": 0, "n2": 0})
    assert sum(sim.throttles[120 + 15:]) == 0
    assert sim.loop.state.limits == {}

    # One noisy producer alone with the quiet ones (1.1 MB/s, under the limit): it gets all it asks,
    # and nobody is throttled while the load is under the limit.
    sim.run(60, {"q1": QUIET, "q2": QUIET, "q3": QUIET, "n1": NOISY})
    assert sim.mean(sim.sent["n1"], 180 + WINDOW_S, 240) >= 0.95 * NOISY
    assert sum(sim.throttles[180:]) == 0


def test_a_noisy_producer_alone_takes_the_capacity_the_others_leave(tmp_path: Path) -> None:
    # Two noisy at 2 x their fair share; when one stops, the other's limit rises (bounded) to what is left.
    sim = Simulation(tmp_path)
    sim.run(60, {"q1": QUIET, "n1": 2 * NOISY, "n2": 2 * NOISY})
    sim.run(90, {"q1": QUIET, "n1": 2 * NOISY, "n2": 0})
    load = sim.load()
    late = window_means(load, 150 - 3 * WINDOW_S, 150)
    assert max(late) <= LIMIT * 1.05
    assert min(late) >= LIMIT * 0.90  # the capacity left is used, not wasted
    assert sim.mean(sim.sent["n1"], 120, 150) >= 0.90 * (LIMIT - QUIET)
