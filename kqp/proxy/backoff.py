"""Exponential backoff with jitter, for everything in the proxy that tries again: the
`--workers` supervisor's restarts and the fleet exchange's reconnects.

Pure: the caller passes the attempt number and a uniform random draw, so tests pick both.
The shape is the one Kafka's clients use for reconnect.backoff.ms (its ExponentialBackoff):
initial * multiplier**attempt, capped, then spread by +-jitter so that processes that failed
together do not retry in lock step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    initial_s: float
    max_s: float
    multiplier: float = 2.0
    # The delay is spread uniformly over [1 - jitter, 1 + jitter] times its base (Kafka's 0.2).
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError(f"expected 0 < initial_s <= max_s, got {self.initial_s} and {self.max_s}")
        if self.multiplier < 1 or not 0 <= self.jitter < 1:
            raise ValueError(f"expected multiplier >= 1 and 0 <= jitter < 1, got {self.multiplier}, {self.jitter}")

    def delay_s(self, attempt: int, uniform: float) -> float:
        """The wait before retry number `attempt` (0 for the first), for a draw `uniform` in [0, 1).

        The cap applies before the jitter, so retries at the cap stay spread out too.
        """
        # Past the cap the power only grows; stop it before it overflows a float.
        exponent = min(attempt, 64)
        base = min(self.max_s, self.initial_s * self.multiplier ** exponent)
        return base * (1.0 - self.jitter + 2.0 * self.jitter * uniform)
