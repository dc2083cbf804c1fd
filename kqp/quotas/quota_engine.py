"""QuotaEngine: the quota engine the proxy and the replay build, Kafka's quota managers
(kqp.quotas.engine) with the fleet's sharing seam (kqp.quotas.fleet) attached.

Until a fleet or a host's workers share usage with it, it decides exactly as one Kafka broker.
It has a module of its own because it sits above both: the engine knows nothing of fleets, and
the fleet's bookkeeping nothing of who holds it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kqp.quotas.callbacks import ClientQuotaCallback
from kqp.quotas.engine import QuotaManagers, ThrottleObserver
from kqp.quotas.fleet import FleetSharing, GuardDelta, UsageDelta
from kqp.quotas.settings import QuotaSettings


class QuotaEngine(QuotaManagers):
    """Kafka's quota managers (kqp.quotas.engine.QuotaManagers) with a `FleetSharing` attached.

    Until `share_usage(True)` or a budget share below 1, it decides exactly as QuotaManagers;
    the proxy and the replay both use it. The methods below are the fleet exchange's interface.
    """

    def __init__(
        self,
        settings: QuotaSettings,
        callback: ClientQuotaCallback | None = None,
        on_throttle: ThrottleObserver | None = None,
    ) -> None:
        self.fleet = FleetSharing()
        super().__init__(settings, callback, on_throttle, sharing=self.fleet)

    def share_usage(self, enabled: bool, *, mutations_claimed: bool = False) -> None:
        """Start (or stop) keeping what each sensor records until `take_local_usage` asks;
        `mutations_claimed`: partition mutations are shared as claims, not as usage."""
        self.fleet.share_usage(enabled, mutations_claimed=mutations_claimed)

    def take_local_usage(self, now_ms: float = 0.0, quiet_below: float = 0.0) -> list[UsageDelta]:
        """This instance's usage report since the last call (FleetSharing.take_local_usage)."""
        return self.fleet.take_local_usage(now_ms, quiet_below)

    def share_with_host(self, enabled: bool, on_pending: Callable[[], None] | None = None, *,
                        mutations_claimed: bool = False) -> None:
        """Keep usage for the other workers of this host as well (FleetSharing.share_with_host)."""
        self.fleet.share_with_host(enabled, on_pending, mutations_claimed=mutations_claimed)

    def take_host_usage(self) -> list[UsageDelta]:
        """This worker's usage since the last call, for its host's other workers."""
        return self.fleet.take_host_usage()

    def record_remote_usage(self, usage: Iterable[UsageDelta], now_ms: float, instance: str | None = None,
                            via_host: bool = False, round_trip_ms: float = 0.0, interval_ms: float = 0.0) -> None:
        """Another instance's report: its usage counts against the same sensors as this one's.

        Nothing is throttled here; the next local request measures the fleet's rate. A quota
        type this instance does not enforce ignores the usage (its sensors would never be read).
        `instance` (the reporter; give it for heartbeats too) lets fetch sensors know how many
        live instances serve a client; `via_host`: it is a worker of this host, whose usage comes
        through the supervisor at a loop tick's lag rather than through the topic;
        `round_trip_ms` (ReportPacer.least_round_trip_ms) and `interval_ms` (ReportPacer.interval_ms):
        how long a report takes through the topic and how often one is sent, which with each
        delta's age date its usage (FleetSharing.record_remote_usage).
        """
        self.fleet.record_remote_usage(self, usage, now_ms, instance, via_host, round_trip_ms, interval_ms)

    def share_guard_usage(self, enabled: bool) -> None:
        """Start (or stop) keeping what the cluster guard's sensors record for the fleet's reports."""
        self.fleet.share_guard(enabled)

    def take_guard_usage(self) -> list[GuardDelta]:
        """This instance's guard deltas since the last call (FleetSharing.take_guard_usage)."""
        return self.fleet.take_guard_usage()

    def record_remote_guard(self, deltas: Iterable[GuardDelta], now_ms: float) -> None:
        """Another instance's guard deltas: its use of the guard's sensors counts in this one's, so
        that the guard measures the fleet's load (nothing is throttled here)."""
        self.fleet.record_remote_guard(self, deltas, now_ms)

    @property
    def deltas_kept_quiet(self) -> int:
        return self.fleet.kept_quiet

    @property
    def budget_share(self) -> float:
        return self.fleet.limit_scale

    def set_budget_share(self, share: float) -> None:
        """Enforce `share` of every client quota (the fleet's `share` policy); 1 restores them."""
        if share != self.fleet.limit_scale:
            self.fleet.limit_scale = share
            self.refresh_limits()
