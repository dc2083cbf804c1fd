"""Enforcement as a chain of policies, one object of each per connection, deciding by verdicts.

`EnforcementPolicies` is the hook the app installs (kqp.proxy.hooks' seam). When a
connection opens it has every policy's factory make that connection's object (kept in
`ClientView.state`, as Kroxylicious' FilterFactory makes a filter per connection), handing
each the `PolicyRegistry`, the one place for state shared across connections. Each call
then runs, in `POLICIES` order, the policies that declared the exchange's API and are
enabled under the live settings (kqp.proxy.policies.tables), in phases
(kqp.proxy.policies.policy), and folds their verdicts by one written rule:

  1. decide: every policy's `request` or `response` verdict, folded by
     `RequestVerdict.fold` / `ResponseVerdict.fold`: the largest throttle, mute and
     one-at-a-time span (a broker returns the largest of its quotas' throttles, never the
     sum), the later frame or answer; a policy is given the request frame as the earlier
     ones replaced it, so the later frame is made from theirs;
  2. follow: if the folded throttle is > 0, every policy's `throttled` is told it
     (one_at_a_time notes it, cluster_hold mutes the client's other connections);
  3. pace (responses): a policy's `turn` replaces the folded mute with its budget's turn
     (fair_turns); without one the connection is muted for the folded throttle (KIP-219).

A throttled Fetch (a verdict that is `empty`: kafka_charging's, which has unrecorded its
bytes) goes to the client as Kafka's empty throttled response instead of the broker's data,
built here from the broker's response head (kqp.protocol.throttled_fetch); a streamed one is
replaced whole (kqp.proxy.connection drops the rest of the broker's frame).

Then Kafka's rule for the client's view of it: the response's ThrottleTimeMs carries the
larger of the broker's and the folded throttle (the client waits once, for the longer), and
`Exchange.proxy_throttle_ms` records the folded throttle, the largest of the exchange's
request and response verdicts, which observation reads. No policy writes it.

Policies talk only through verdicts and the registry: an import contract (pyproject.toml)
keeps each policy module from importing another. Time is read here, once per call, and
handed down (`now_ms`, the engine's clock).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from kqp.config.models import EnforcementSection
from kqp.protocol.close_reason import CloseReason
from kqp.protocol.errors import ProtocolError
from kqp.protocol.throttle_field import (
    patch_throttle_time,
    read_throttle_time,
    read_throttle_time_at,
    write_throttle_time,
)
from kqp.protocol.throttled_fetch import throttled_fetch_response
from kqp.proxy.hooks import ClientView, Exchange, RequestVerdict, ResponseVerdict, TrafficHooks
from kqp.proxy.policies.cluster_hold import ClusterHold
from kqp.proxy.policies.fair_turns import FairTurns
from kqp.proxy.policies.fleet_mutation_order import FleetMutationOrder
from kqp.proxy.policies.kafka_charging import KafkaCharging
from kqp.proxy.policies.kafka_mutations import KafkaMutations
from kqp.proxy.policies.one_at_a_time import OneAtATime
from kqp.proxy.policies.registry import MutationOrder, PolicyRegistry
from kqp.proxy.policies.tables import ApiCalls, ConnectionPolicies, PolicyFactory, any_takes_part
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import QuotaEngine

# The order verdicts are asked for and followers told, within each phase. Kafka's own
# charging comes first; the followers are told in this order too (one_at_a_time before
# cluster_hold), then fair turns, as the single hook that preceded this chain did.
POLICIES: tuple[PolicyFactory, ...] = (
    FleetMutationOrder, KafkaCharging, KafkaMutations, OneAtATime, ClusterHold, FairTurns,
)


class EnforcementPolicies(TrafficHooks):
    """The enforcement hook: one per proxy (or worker); its policies are per connection."""

    def __init__(
        self,
        engine: QuotaEngine,
        settings: EnforcementSection,
        clock_ms: Callable[[], float],
        topics: TopicDirectory,
        factories: tuple[PolicyFactory, ...] = POLICIES,
    ) -> None:
        self.registry = PolicyRegistry(engine, settings, topics)
        self._now_ms = clock_ms
        self._factories = factories

    @property
    def engine(self) -> QuotaEngine:
        return self.registry.engine

    @property
    def settings(self) -> EnforcementSection:
        return self.registry.settings

    @settings.setter
    def settings(self, settings: EnforcementSection) -> None:
        self.registry.settings = settings  # live: every connection's tables follow

    @property
    def mutation_order(self) -> MutationOrder | None:
        return self.registry.mutation_order

    @mutation_order.setter
    def mutation_order(self, order: MutationOrder | None) -> None:
        self.registry.mutation_order = order

    def forget_expired_throttles(self, now_ms: float) -> None:
        """Housekeeping off the data path (the app calls it periodically)."""
        self.registry.forget_expired(now_ms)

    def _policies(self, client: ClientView) -> ConnectionPolicies:
        """The connection's policy objects, made on first use (or anew for another registry)."""
        policies = client.state.policies
        if not isinstance(policies, ConnectionPolicies) or policies.registry is not self.registry:
            policies = client.state.policies = ConnectionPolicies(self.registry, self._factories)
        return policies

    def _calls(self, client: ClientView, api_key: int) -> ApiCalls:
        """The connection's calls for `api_key` under the live settings: the table it holds
        while that is current (one lookup, the per-request case), else its policies made or
        the table refilled (kqp.proxy.policies.tables)."""
        registry = self.registry
        policies = client.state.policies
        # `__class__ is`, not isinstance: the same test without a call, on every request and response.
        if (policies.__class__ is ConnectionPolicies and policies.registry is registry
                and policies.settings is registry.settings and policies.quotas is registry.engine.settings
                and (calls := policies.by_api.get(api_key)) is not None):
            return calls
        return self._policies(client).calls(api_key)

    def takes(self, call: str, api_key: int) -> bool:
        """Whether any policy could take part in the hook call `call` for `api_key` (asked
        once per API by the hook chain): a Produce never reaches `hold`, held for mutations."""
        return any_takes_part(self._factories, call, api_key)

    def connection_opened(self, client: ClientView) -> None:
        self._policies(client)

    def connection_closed(self, client: ClientView, reason: CloseReason) -> None:
        policies = client.state.policies
        if isinstance(policies, ConnectionPolicies) and policies.registry is self.registry:
            for policy in policies.policies:
                policy.closed(client)

    def hold(self, client: ClientView, exchange: Exchange, frame: bytes) -> asyncio.Future[Any] | None:
        for hold in self._calls(client, exchange.header.api_key).hold:
            wait: asyncio.Future[Any] | None = hold(client, exchange, frame)
            if wait is not None:
                return wait
        return None

    def request(self, client: ClientView, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        calls = self._calls(client, exchange.header.api_key)
        now_ms = self._now_ms()
        folded: RequestVerdict | None = None
        for request in calls.request:
            verdict: RequestVerdict | None = request(client, exchange, frame, now_ms)
            if verdict is not None:
                if folded is None:
                    folded = verdict
                else:
                    folded.fold(verdict)
                if verdict.frame is not None:
                    frame = verdict.frame  # later policies see the request as it will be sent
        if folded is not None and folded.throttle_ms > 0:
            exchange.proxy_throttle_ms = max(exchange.proxy_throttle_ms, folded.throttle_ms)
            for throttled in calls.throttled:
                throttled(client, exchange, folded.throttle_ms, now_ms)
        return folded

    def response(
        self, client: ClientView, exchange: Exchange, frame: bytes | bytearray, body_offset: int,
        frame_size: int | None = None,
    ) -> ResponseVerdict | None:
        """A whole response, or with `frame_size` the head of a streamed one: the phases,
        then the folded throttle into ThrottleTimeMs (a copy of a whole frame, the head in
        place) and on the exchange."""
        calls = self._calls(client, exchange.header.api_key)
        now_ms = self._now_ms()
        body_size = (len(frame) if frame_size is None else frame_size) - body_offset
        folded: ResponseVerdict | None = None
        for response in calls.response:
            verdict: ResponseVerdict | None = response(client, exchange, frame, body_offset, body_size, now_ms)
            if verdict is not None:
                if folded is None:
                    folded = verdict
                else:
                    folded.fold(verdict)
        throttle = folded.throttle_ms if folded is not None else 0
        exchange.proxy_throttle_ms = max(exchange.proxy_throttle_ms, throttle)
        if throttle > 0:
            for throttled in calls.throttled:
                throttled(client, exchange, throttle, now_ms)
        if exchange.local_response is not None:
            return folded  # answered by the proxy: the throttle is already in the answer
        delivered = True
        if folded is not None and folded.empty:
            empty = self._empty_answer(exchange, frame, body_offset, throttle)
            if empty is not None:
                folded.frame = empty
                delivered = False
            else:
                folded.empty = False
        for turn in calls.turn:
            mute_ms: int | None = turn(client, exchange, body_size, throttle, now_ms, delivered)
            if mute_ms is not None and (folded is not None or mute_ms):
                folded = folded or ResponseVerdict()
                folded.mute_ms = mute_ms
        if folded is not None and folded.empty:
            return folded  # its ThrottleTimeMs is already the larger of the two
        out = frame if folded is None or folded.frame is None else folded.frame
        # The session may have found ThrottleTimeMs already (Produce); that holds for `frame` only.
        known_offset = exchange.response_throttle_offset if out is frame and frame_size is None else None
        broker_throttle = _broker_throttle(exchange, out, body_offset, known_offset)
        # ThrottleTimeMs carries the larger of the broker's and the proxy's throttle: the
        # client waits once, for the longer; the mute applies the proxy's own in any case.
        if folded is None or throttle <= 0 or broker_throttle is None or throttle <= broker_throttle:
            return folded
        header = exchange.header
        if frame_size is not None:
            assert isinstance(frame, bytearray)  # a streamed head, patched in place
            patch_throttle_time(frame, body_offset, header.api_key, header.api_version, throttle)
            return folded
        patched = bytearray(out)
        if known_offset is not None:
            write_throttle_time(patched, known_offset, throttle)
        else:
            patch_throttle_time(patched, body_offset, header.api_key, header.api_version, throttle)
        folded.frame = patched
        return folded

    def response_started(
        self, client: ClientView, exchange: Exchange, head: bytearray, body_offset: int, frame_size: int
    ) -> ResponseVerdict | None:
        """A streamed (cut-through) response: charged by the size its frame header gives, its
        ThrottleTimeMs (in the head) patched in place, as `response` does for a whole frame;
        or, throttled, replaced whole by the empty answer (`ResponseVerdict.empty`)."""
        return self.response(client, exchange, head, body_offset, frame_size)

    @staticmethod
    def _empty_answer(exchange: Exchange, frame: bytes | bytearray, body_offset: int, throttle: int) -> bytes | None:
        """Kafka's answer to a throttled Fetch, with the larger of the broker's and the proxy's
        throttle (None: the broker's response is too short to read, and goes on as it is)."""
        header = exchange.header
        if not header.known:
            return None  # a version the definitions do not describe (never advertised: ApiVersions is capped)
        broker_throttle = _broker_throttle(exchange, frame, body_offset)
        # The request's fetch context picks the session id Kafka answers with. The fetch quota
        # that throttled it had the request read (KafkaCharging._cap_fetch); if it was not
        # (a quota enabled between request and response), the request is taken as a full fetch.
        session_epoch = exchange.fetch.request.session_epoch if exchange.fetch is not None else -1
        try:
            return throttled_fetch_response(frame, body_offset, header.api_version,
                                            max(throttle, broker_throttle or 0), session_epoch)
        except ProtocolError:
            return None


def _broker_throttle(
    exchange: Exchange, frame: bytes | bytearray, body_offset: int, known_offset: int | None = None
) -> int | None:
    """The broker's own ThrottleTimeMs in the response (None: the version has no such field,
    or the bytes do not read), noted on the exchange for metrics and capture."""
    header = exchange.header
    try:
        if known_offset is not None:
            broker_throttle: int | None = read_throttle_time_at(frame, known_offset)
        else:
            broker_throttle = read_throttle_time(frame, body_offset, header.api_key, header.api_version)
    except ProtocolError:
        return None
    if broker_throttle:
        exchange.broker_throttle_ms = broker_throttle
    return broker_throttle
