"""Kafka's byte-rate quota arithmetic, written apart from `kqp.quotas` to check it from outside.

An integration test replays what a capture says the proxy charged (its `quota_*` columns) through
this and compares the throttle each response carried with the one Kafka's arithmetic gives for
that request. It must not share code with the proxy's engine, or an error the two share could
not show: it is written from Kafka 4.3.1's behaviour as ../shared/docs/kafka-quota-spec.md
describes it (sections 1.4, 1.5, 1.8, 2.4), not from kqp's.

* A sensor's samples form a ring of `samples + 1` slots (the extra one overlaps the window's
  start). Recording at t: the current sample, when t - its start >= the window, moves on to the
  next slot, which restarts at t; the value adds to it, and its last event is t.
* Measuring at t first resets every sample whose last event is at least samples x window old,
  then sums every slot and divides by the window size: t - the oldest start, made up to at least
  samples - 1 whole windows, in seconds.
* A Produce is recorded when its response is ready, and if the rate then exceeds the quota the
  throttle is Java's Math.round((rate - quota) / quota x window size), in ms, unbounded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class _Sample:
    start_ms: float
    last_ms: float
    value: float = 0.0

    def restart(self, now_ms: float) -> None:
        self.start_ms = self.last_ms = now_ms
        self.value = 0.0


@dataclass
class KafkaRateSensor:
    """One quota sensor (a `Rate` over a `WindowedSum`) with its upper bound, in bytes/s."""

    bound: float
    samples: int = 11
    window_ms: float = 1000.0
    _ring: list[_Sample] = field(default_factory=list)
    _current: int = 0

    def record(self, value: float, now_ms: float) -> int:
        """Record `value` at `now_ms`; the throttle in ms Kafka would answer (0: none)."""
        if not self._ring:
            self._ring.append(_Sample(now_ms, now_ms))
        sample = self._ring[self._current]
        if now_ms - sample.start_ms >= self.window_ms:
            self._current = (self._current + 1) % (self.samples + 1)
            if self._current == len(self._ring):
                self._ring.append(_Sample(now_ms, now_ms))
            else:
                self._ring[self._current].restart(now_ms)
            sample = self._ring[self._current]
        sample.value += value
        sample.last_ms = now_ms
        window_s = self._window_size_ms(now_ms) / 1000.0
        rate = sum(s.value for s in self._ring) / window_s
        if rate <= self.bound:
            return 0
        return _java_round((rate - self.bound) / self.bound * window_s * 1000.0)

    def _window_size_ms(self, now_ms: float) -> float:
        for sample in self._ring:
            if now_ms - sample.last_ms >= self.samples * self.window_ms:
                sample.restart(now_ms)
        elapsed = now_ms - min(s.start_ms for s in self._ring)
        whole = math.floor(elapsed / self.window_ms)
        if whole < self.samples - 1:
            elapsed += (self.samples - 1 - whole) * self.window_ms
        return max(elapsed, 1.0)


def _java_round(value: float) -> int:
    """Java's Math.round: floor(x + 0.5), not Python's round half to even."""
    return math.floor(value + 0.5)
