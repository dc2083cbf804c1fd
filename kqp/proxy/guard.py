"""The cluster guard's control loop: the pure step (kqp.quotas.guard) every `guard.interval_seconds`.

Each step reads what the engine's guard sensors measured (each entity's windowed rate per
broker, kqp.quotas.guard_limits), runs the step against the brokers' limits from the capacity
file, and hands the resulting guard limits back to the engine, which throttles with them as
with a configured quota (or, in dry run, computes and reports only). It logs when a broker
resource engages or releases the guard, naming the entities limited, and sets the guard's
metrics. Off the data path: one step is a few array operations per entity.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

from kqp.config.quota_sections import GuardSection
from kqp.proxy.metrics import ProxyMetrics
from kqp.quotas.engine import QuotaManagers
from kqp.quotas.guard import GuardDecision, GuardState, step
from kqp.quotas.guard_inputs import GuardSettings
from kqp.quotas.settings import entity_text

log = logging.getLogger("kqp.guard")


class GuardLoop:
    """Runs the guard's step on the engine's measurements; `update` takes a reloaded section."""

    def __init__(
        self,
        engine: QuotaManagers,
        section: GuardSection,
        brokers: Callable[[], Sequence[int]],
        now_ms: Callable[[], float],
        metrics: ProxyMetrics | None = None,
    ) -> None:
        self.engine = engine
        self.brokers = brokers
        self.now_ms = now_ms
        self.metrics = metrics
        self.state = GuardState()
        self.section = section
        self._settings: tuple[tuple[int, ...], GuardSettings] | None = None
        self._task: asyncio.Task[None] | None = None
        self.update(section)

    def update(self, section: GuardSection) -> None:
        """A reloaded `guard` section: new limits (from the capacity file as the reload read it) and entities."""
        if section.granularity != self.section.granularity:
            self.state = GuardState()  # other entities: the limits held so far name none of them
        self.section = section
        self._settings = None
        self.engine.set_guard(section.granularity, section.dry_run)

    def tick(self) -> GuardDecision:
        """One control step now."""
        guard = self.engine.guard
        assert guard is not None  # set by update() for as long as the loop runs
        now_ms = self.now_ms()
        # The damping (off by default) alone reads the load of the last seconds: not counted without it.
        gains = self._settings[1].trim if self._settings is not None else self.section.settings(()).trim
        measured = guard.measured(int(now_ms), recent=gains.damping > 0)
        known = tuple(sorted({*self.brokers(), *(broker for flow in measured for broker in flow.rates)}))
        if self._settings is None or self._settings[0] != known:
            window_s = self.engine.settings.window_num * self.engine.settings.window_size_s
            # Dry run enforces nothing: the load does not answer the limits, so no feedback on it.
            self._settings = (known, replace(self.section.settings(known), release_after_s=float(window_s),
                                             feedback=not self.section.dry_run))
        decision = step(self._settings[1], self.state, measured, now_ms / 1000.0)
        self.state = decision.state
        guard.set_limits(decision.limits)
        if not self.section.dry_run:
            # Backlogged clients with large requests held back together are spaced out
            # (kqp.quotas.guard_limits.GuardQuotas.spread_admissions).
            spaced = guard.spread_admissions(int(now_ms))
            if spaced:
                log.info("guard spaced %d held-back client(s) apart: their large requests were due together", spaced)
        self._report(decision)
        return decision

    def _report(self, decision: GuardDecision) -> None:
        mode = " (dry run: computed, not enforced)" if self.section.dry_run else ""
        limited = [f for f in decision.flows if f.guard_limit is not None]
        names = ", ".join(
            f"{entity_text(f.entity)} {f.quota_type} {f.guard_limit:,.0f} B/s (using {f.usage:,.0f})" for f in limited
        ) or "none"
        by_resource = {(r.broker, r.resource): r for r in decision.resources}
        for broker, resource in decision.engaged_now:
            status = by_resource[(broker, resource)]
            log.warning("guard engaged on broker %d %s: load %.0f B/s over the limit %.0f B/s; limits%s: %s",
                        broker, resource, status.load, status.limit, mode, names)
        for broker, resource in decision.released_now:
            status = by_resource[(broker, resource)]
            log.info("guard released broker %d %s: load %.0f B/s under %.0f B/s; limits still rising back: %s",
                     broker, resource, status.load, status.limit * (1 - self.section.release_margin), names)
        if self.metrics is not None:
            self.metrics.guard_status(
                [(r.broker, r.resource, r.load, r.limit, r.engaged) for r in decision.resources],
                [(entity_text(f.entity), f.quota_type, f.guard_limit, f.usage) for f in limited
                 if f.guard_limit is not None],
                self.section.dry_run,
            )

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.section.interval_seconds)
            try:
                self.tick()
            except Exception:  # a bad step must not end the loop: the next interval tries again
                log.exception("guard step failed; the guard limits in force are kept")

    def close(self) -> None:
        """Stop stepping and drop the guard's limits from the engine (the guard switched off)."""
        if self._task is not None:
            self._task.cancel()
        self.engine.set_guard(None)

    async def stop(self) -> None:
        task = self._task
        self.close()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task
