"""Partition-mutation claims waiting for their turn: the bookkeeping the fleet's topic and a
host's supervisor share (kqp.proxy.fleet, kqp.proxy.host_exchange).

A claim goes out through one ordered channel and comes back to every instance in the same
order; each instance charges every claim in that order (kqp.quotas.fleet.MutationClaim,
ClaimClock), and the claimer answers its request with the charge its own engine gave it.
A claim not back within the deadline is charged here alone; if it comes back later, the
others charge it and this instance does not charge it twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from kqp.proxy.hooks import FleetCharge
from kqp.proxy.metrics import ProxyMetrics
from kqp.quotas import QuotaEngine
from kqp.quotas.fleet import ClaimClock, MutationClaim
from kqp.quotas.recording import QuotaClient, RequestCharges, charge_request

log = logging.getLogger(__name__)


class ClaimBook:
    """This instance's claims still to come back, and the charging of everyone's in order."""

    def __init__(self, instance_id: str, engine: QuotaEngine, now_ms: Callable[[], float],
                 metrics: ProxyMetrics | None, what: str) -> None:
        self.instance_id = instance_id
        self.engine = engine
        self._metrics = metrics
        self._what = what  # names the channel in the log
        self._waiting: dict[int, asyncio.Future[FleetCharge | None]] = {}
        self._charged_alone: set[int] = set()
        self._seq = 0
        # Puts every instance's claims on this engine's timeline (the wall clock is the only
        # time the instances share).
        self._clock = ClaimClock(time.time() * 1000.0 - now_ms())

    def open(self, client: QuotaClient, charges: RequestCharges, deadline_s: float,
             send: Callable[[MutationClaim], None]) -> asyncio.Future[FleetCharge | None]:
        """A new claim for this request, handed to `send`; the future gets the charge once the
        claim is back, None if it is not back within `deadline_s` (charged here alone)."""
        assert charges.mutations is not None
        self._seq += 1
        claim = MutationClaim(
            self.instance_id, self._seq, time.time() * 1000.0, client.broker, client.principal,
            client.client_id, charges.api_key, charges.api_version, charges.mutations,
        )
        loop = asyncio.get_running_loop()
        waiting: asyncio.Future[FleetCharge | None] = loop.create_future()
        self._waiting[claim.claim_id] = waiting
        timeout = loop.call_later(deadline_s, self.timed_out, claim.claim_id, deadline_s)
        sent_at = loop.time()

        def answered(done: asyncio.Future[FleetCharge | None]) -> None:
            timeout.cancel()
            if self._metrics is not None and not done.cancelled():
                self._metrics.fleet_mutation_claimed(loop.time() - sent_at, ordered=done.result() is not None)

        waiting.add_done_callback(answered)
        send(claim)
        return waiting

    def timed_out(self, claim_id: int, deadline_s: float = 0.0) -> None:
        waiting = self._waiting.pop(claim_id, None)
        if waiting is not None and not waiting.done():
            # The request is charged here and now; if the claim still arrives, the others
            # charge it and this instance must not charge it twice.
            self._charged_alone.add(claim_id)
            waiting.set_result(None)
            log.warning("%s: mutation claim %d not back within %.3g s; charged here alone",
                        self._what, claim_id, deadline_s)

    def charge(self, claim: MutationClaim, history: bool = False) -> None:
        """Charge one claim in the channel's order (`history`: sent before this instance joined)."""
        # An instance restarted under the same name finds its predecessor's claims in the history.
        mine = claim.instance == self.instance_id and not history
        if mine and claim.claim_id in self._charged_alone:
            self._charged_alone.discard(claim.claim_id)
            return
        # Charged at its sender's wall-clock time moved onto this engine's clock (ClaimClock), so the
        # gaps between claims, which the token bucket's refills depend on, are the same on every instance.
        at = self._clock.engine_time(claim)
        charges = RequestCharges(claim.api_key, claim.api_version, mutations=claim.topics)
        outcome = charge_request(self.engine, QuotaClient(claim.broker, claim.user, claim.client_id), charges, at)
        if mine:
            waiting = self._waiting.pop(claim.claim_id, None)
            if waiting is not None and not waiting.done():
                waiting.set_result(FleetCharge(outcome, at))

    def close(self) -> None:
        """Requests still waiting are charged here."""
        for claim_id in list(self._waiting):
            self.timed_out(claim_id)
