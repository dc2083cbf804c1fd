"""The fleet's usage exchange: every instance's quota usage, through a topic of the Kafka
cluster the proxy fronts (no other infrastructure).

Every `report_interval` an instance sends what its sensors recorded since its last report
(kqp.quotas.fleet) to a one-partition topic, and reads every report back: the others' usage
goes into its own sensors, its own report coming back tells it the exchange works. When its
own reports stop coming back for `unreachable_after`, the instance enforces the configured
fallback (`local` or `share`) until they come back. docs/scaling.md has the design and the
error bound.

Partition mutations go through the same topic as claims (kqp.quotas.fleet.MutationClaim): the
instance that received one waits until its claim comes back, by then every instance has
charged, or will charge, the claims in the same order, and answers with the verdict its own
engine gave its claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import ssl
import time
from collections.abc import Callable
from typing import ClassVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from pydantic import ConfigDict

from kqp.config.models import FleetSection
from kqp.config.section import HostPort, NonEmptyText
from kqp.proxy.backoff import Backoff
from kqp.proxy.claims import ClaimBook
from kqp.proxy.hooks import FleetCharge
from kqp.proxy.metrics import ProxyMetrics
from kqp.quotas import QuotaEngine
from kqp.quotas.fleet import (
    ExchangeState,
    FleetView,
    MutationClaim,
    ReportError,
    ReportPacer,
    UsageReport,
    decode_record,
    encode_claim,
    encode_report,
    longest_silence_s,
    split_usage,
)
from kqp.quotas.recording import QuotaClient, RequestCharges

log = logging.getLogger(__name__)

# Kafka's TOPIC_ALREADY_EXISTS error code: every instance creates the topics at start, and all
# but the first find them there.
_TOPIC_ALREADY_EXISTS = 36
# Deltas per record: about 80 bytes each in JSON, so a record stays far below Kafka's 1 MB.
_DELTAS_PER_REPORT = 5_000
# Setting the exchange up again after a failure: soon at first (a cluster starting with the
# proxy), then less often, never longer than this apart; jittered so that the instances of a
# fleet that lost the cluster together do not come back in lock step (kqp.proxy.backoff).
_RECONNECT_BACKOFF = Backoff(initial_s=0.5, max_s=10.0)
_CLOSE_TIMEOUT_S = 5.0
_FETCH_MAX_WAIT_MS = 500
# A bucket emptied by a large mutation takes longer than a quota span to fill again: read a
# joining instance's claim history a little further back than one span.
_CLAIM_HISTORY_MARGIN_MS = 30_000.0


class FleetOptions(FleetSection):
    """The `fleet` section as the exchange runs it: every setting of the section (defaults
    there, once), with the brokers and the instance id resolved and the upstream's TLS."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    # The section's, or the upstream's when it names none.
    bootstrap_servers: tuple[HostPort, ...]
    # The section's, or `default_instance_id`.
    instance_id: NonEmptyText
    ssl_context: ssl.SSLContext | None = None

    # Usage reports matter for one quota window; a minute of them covers any window Kafka allows here.
    retention_ms: ClassVar[int] = 60_000

    @property
    def quota_topic(self) -> str:
        """The compacted topic holding the fleet's quota configuration."""
        return f"{self.topic}-quotas"


def default_instance_id(listener_port: int) -> str:
    """Unique per process on a host, and readable in the usage topic and the logs."""
    return f"{socket.gethostname()}:{listener_port}:{os.getpid()}"


def _log_unexpected_end(task: asyncio.Task[None]) -> None:
    # The loops only end when stopped; anything else would silently end the exchange.
    if not task.cancelled() and task.exception() is not None:
        log.error("fleet exchange: %s stopped", task.get_name(), exc_info=task.exception())


class FleetExchange:
    """Publishes this instance's usage and applies the others', on the proxy's event loop."""

    def __init__(
        self,
        options: FleetOptions,
        engine: QuotaEngine,
        now_ms: Callable[[], float],
        quota_window_ms: Callable[[], float],
        metrics: ProxyMetrics | None = None,
        on_quotas: Callable[[bytes], None] | None = None,
        on_no_quotas: Callable[[], None] | None = None,
        same_host: Callable[[str], bool] | None = None,
    ) -> None:
        self.options = options
        # The instances whose usage reaches this one through its host's supervisor (the other
        # workers of `--workers N`): their reports on the topic mark them alive, but their usage
        # is already in this engine's sensors.
        self._same_host = same_host
        self.engine = engine
        self._now_ms = now_ms
        self._quota_window_ms = quota_window_ms
        self._metrics = metrics
        # The fleet's quota configuration: a snapshot read from the quota topic, and the
        # call made when that topic holds none yet (this instance's files are the seed).
        self._on_quotas = on_quotas
        self._on_no_quotas = on_no_quotas
        self._unsent_quotas: bytes | None = None
        self.view = FleetView(
            options.instance_id, options.on_unreachable, member_timeout_ms=quota_window_ms(),
            unreachable_after_ms=options.unreachable_after_seconds * 1000.0, started_ms=now_ms(),
        )
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._seq = 0
        # How long to wait between reports: the configured interval, or longer where the topic's
        # round trip is (kqp.quotas.fleet.ReportPacer); no longer than the heartbeat's bound.
        self.pacer = ReportPacer.for_settings(options.report_interval_seconds, options.unreachable_after_seconds)
        self._state: ExchangeState = "starting"
        # Running totals (bench/fleet_exchange.py reads them; /metrics has the report counts).
        self.records_sent = 0
        self.bytes_sent = 0
        self.bytes_received = 0
        self.deltas_applied = 0
        # Partition mutations (see the module's docstring): this instance's claims still to come
        # back, and the charging of every instance's in the topic's order.
        self._claims = ClaimBook(options.instance_id, engine, now_ms, metrics, "fleet exchange")
        # Records of the usage topic before this offset were written before this instance
        # joined: only their claims are charged (their usage is already in the others' windows).
        self._joined_at_offset = 0

    def _security(self) -> dict[str, object]:
        """aiokafka's security settings, named as Kafka's security.protocol: TLS from the upstream's (or
        the section's) context, SASL from the section's own credentials.
        """
        o = self.options
        protocol = ("SASL_SSL" if o.ssl_context else "SASL_PLAINTEXT") if o.sasl_mechanism else (
            "SSL" if o.ssl_context else "PLAINTEXT")
        settings: dict[str, object] = {"security_protocol": protocol, "ssl_context": o.ssl_context}
        if o.sasl_mechanism:
            settings.update(sasl_mechanism=o.sasl_mechanism, sasl_plain_username=o.sasl_username,
                            sasl_plain_password=o.sasl_password)
        return settings

    async def start(self) -> None:
        """Start in the background: a cluster that is not reachable yet delays the exchange,
        never the proxy (which enforces the fallback policy meanwhile)."""
        # From here the engine keeps what each sensor records for the next report, and partition
        # mutations (KIP-599's controller_mutation_rate) are shared as claims through the topic, not as usage.
        self.engine.share_usage(True, mutations_claimed=True)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(), name="kqp-fleet")]
        self._tasks[0].add_done_callback(_log_unexpected_end)

    def state(self) -> ExchangeState:
        return self._state

    def describe(self) -> str:
        """One line for /readyz and the log."""
        now = self._now_ms()
        instances = self.view.instances(now)
        if self._state == "share":
            return (f"fleet exchange unreachable: enforcing 1/{self.view.last_known_holders} of each quota "
                    f"(policy share)")
        if self._state == "local":
            return "fleet exchange unreachable: enforcing this instance's own budget (policy local)"
        return f"fleet exchange {self._state}, {instances} instance(s)"

    async def _run(self) -> None:
        o = self.options
        attempt = 0
        while True:
            try:
                await self._connect()
                break
            except Exception as exc:  # keep trying: the cluster may come up after the proxy
                delay = _RECONNECT_BACKOFF.delay_s(attempt, random.random())
                attempt += 1
                log.warning("fleet exchange: cannot reach %s yet (%s); retrying in %.1f s", o.topic, exc, delay)
                await self._close_clients()
                self._update_state()
                await asyncio.sleep(delay)
        loop = asyncio.get_running_loop()
        consume = loop.create_task(self._consume(), name="kqp-fleet-consume")
        consume.add_done_callback(_log_unexpected_end)
        self._tasks.append(consume)
        await self._publish()

    async def _connect(self) -> None:
        o = self.options
        servers = list(o.bootstrap_servers)
        admin = AIOKafkaAdminClient(bootstrap_servers=servers, client_id="kqp-fleet", **self._security())
        await admin.start()
        try:
            replication = o.replication_factor
            if replication < 0:
                # The brokers' default.replication.factor is not readable from a client: take
                # Kafka's usual 3, or fewer on a smaller cluster.
                brokers = (await admin.describe_cluster())["brokers"]
                replication = min(3, max(1, len(brokers)))
            response = await admin.create_topics([
                NewTopic(o.topic, num_partitions=1, replication_factor=replication,
                         topic_configs={"retention.ms": str(o.retention_ms), "cleanup.policy": "delete"}),
                # The last snapshot of the quota configuration, kept for good by compaction.
                NewTopic(o.quota_topic, num_partitions=1, replication_factor=replication,
                         topic_configs={"cleanup.policy": "compact"}),
            ])
            for _name, code, *_rest in response.topic_errors:
                if code not in (0, _TOPIC_ALREADY_EXISTS):
                    raise RuntimeError(f"creating {_name}: error code {code}")
        finally:
            await admin.close()
        self._producer = AIOKafkaProducer(
            bootstrap_servers=servers, client_id="kqp-fleet", acks=1, linger_ms=0,
            request_timeout_ms=max(1000, int(o.unreachable_after_seconds * 1000)), **self._security(),
        )
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=servers, client_id="kqp-fleet", group_id=None, enable_auto_commit=False,
            # A fetch returns as soon as a report arrives; a long wait only saves idle requests.
            fetch_max_wait_ms=_FETCH_MAX_WAIT_MS, **self._security(),
        )
        await self._consumer.start()
        # Both topics have one partition, so every instance reads every record in one order, the
        # log's: that order is what makes the claims' charges the same on every instance. Assigned,
        # not subscribed (group_id None): each instance must read everything, not a share of it.
        usage, quotas = TopicPartition(o.topic, 0), TopicPartition(o.quota_topic, 0)
        self._consumer.assign([usage, quotas])
        # Older usage is already in the others' windows, but the claims of the last quota span
        # are in their mutation buckets: charge those too, so that this instance's buckets are
        # the others' from the start.
        self._joined_at_offset = (await self._consumer.end_offsets([usage]))[usage]
        span_ms = self._quota_window_ms() + _CLAIM_HISTORY_MARGIN_MS
        since = (await self._consumer.offsets_for_times({usage: int(time.time() * 1000 - span_ms)}))[usage]
        if since is None:
            await self._consumer.seek_to_end(usage)
        else:
            self._consumer.seek(usage, since.offset)
        # The quota configuration is read from the start: its last record is the fleet's.
        await self._consumer.seek_to_beginning(quotas)
        if (await self._consumer.end_offsets([quotas]))[quotas] == 0 and self._on_no_quotas is not None:
            self._on_no_quotas()
        if self._unsent_quotas is not None:
            await self._send_quotas(self._unsent_quotas)
        log.info("fleet exchange: instance %s on topics %s and %s", o.instance_id, o.topic, o.quota_topic)

    async def _publish(self) -> None:
        o = self.options
        producer = self._producer
        assert producer is not None
        # An empty report still says "alive" (membership) and "the topic works" (own echo), but
        # an idle instance need not say it ten times a second.
        heartbeat_s = longest_silence_s(o.unreachable_after_seconds)
        last_sent = 0.0
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.pacer.interval_ms / 1000.0)
            now = self._now_ms()
            # Fewer instances than there are would loosen the bound: count the most seen lately.
            instances = max(self.view.instances(now), self.view.last_known_instances, 1)
            quiet_before = self.engine.deltas_kept_quiet
            # A client whose rate is below max_unreported_share / instances of its quota is left out of
            # this report: the fleet under-counts any client by less than that share of its quota.
            usage = self.engine.take_local_usage(now, o.max_unreported_share / instances)
            # The cluster guard's deltas (guard.fleet_wide; none otherwise): one per guarded entity and
            # broker, so a few, all in the first record.
            guard = tuple(self.engine.take_guard_usage()) if self.engine.fleet.records_guard else ()
            if self._metrics is not None:
                self._metrics.fleet_usage_deltas(len(usage), self.engine.deltas_kept_quiet - quiet_before)
            if not usage and not guard and loop.time() - last_sent < heartbeat_s:
                self._update_state()
                continue
            last_sent = loop.time()
            # An empty usage still sends one empty report: the heartbeat.
            for index, chunk in enumerate(split_usage(usage, _DELTAS_PER_REPORT) or [()]):
                self._seq += 1
                self.pacer.sent(self._seq, now)
                report = encode_report(UsageReport(o.instance_id, self._seq, chunk, guard if index == 0 else ()))
                self.records_sent += 1
                self.bytes_sent += len(report)
                try:
                    # The first await only queues the record (aiokafka returns a delivery future); the delivery
                    # is judged in _sent, so a slow broker never holds up the next report interval.
                    future = await asyncio.wait_for(
                        producer.send(o.topic, report, key=o.instance_id.encode()), o.unreachable_after_seconds)
                    future.add_done_callback(self._sent)
                except Exception as exc:  # the state machine turns lasting failures into the fallback
                    self._send_failed(exc)
            self._update_state()

    def _sent(self, future: asyncio.Future[object]) -> None:
        exc = future.exception() if not future.cancelled() else None
        if exc is not None:
            self._send_failed(exc)
        elif self._metrics is not None:
            self._metrics.fleet_report_sent()

    def _send_failed(self, exc: BaseException) -> None:
        if self._metrics is not None:
            self._metrics.fleet_report_failed()
        log.debug("fleet exchange: a usage report was not written: %r", exc)

    async def _consume(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        own = self.options.instance_id
        while True:
            try:
                batches = await consumer.getmany(timeout_ms=_FETCH_MAX_WAIT_MS)
            except Exception as exc:  # the topic's outage shows as own reports missing: keep reading
                log.warning("fleet exchange: reading %s failed: %r", self.options.topic, exc)
                self._update_state()
                await asyncio.sleep(self.options.report_interval_seconds)
                continue
            now = self._now_ms()
            for partition, records in batches.items():
                if partition.topic == self.options.quota_topic:
                    for record in records:
                        if self._on_quotas is not None and record.value is not None:
                            try:
                                self._on_quotas(record.value)
                            except Exception:  # the exchange must outlive one bad quota change
                                log.exception("fleet exchange: applying the fleet's quotas failed")
                    continue
                for record in records:
                    self._apply(record.value, own, now, history=record.offset < self._joined_at_offset)
            self._update_state()

    def _apply(self, value: bytes | None, own: str, now: float, *, history: bool = False) -> None:
        """Apply one usage-topic record: a claim is charged (history included), a report marks its
        instance alive and, if another instance's, adds its usage to this engine's sensors. Our own
        report adds nothing (already counted locally) but is the echo that proves the topic works.
        """
        self.bytes_received += len(value or b"")
        try:
            report = decode_record(value or b"")
        except ReportError as exc:
            if self._metrics is not None:
                self._metrics.fleet_report_received(accepted=False)
            log.warning("fleet exchange: a record of %s is not a usage report kqp reads: %s",
                        self.options.topic, exc)
            return
        if isinstance(report, MutationClaim):
            self._claims.charge(report, history)
            return
        if history:
            return
        self.view.report_seen(report.instance, now)
        if report.instance == own:
            self.pacer.echoed(report.seq, now)
        if report.instance != own and not (self._same_host is not None and self._same_host(report.instance)):
            self.engine.record_remote_usage(report.usage, now, report.instance,
                                            round_trip_ms=self.pacer.least_round_trip_ms,
                                            interval_ms=self.pacer.interval_ms)
            self.deltas_applied += len(report.usage)
        if report.instance != own and report.guard:
            # A sibling's too: the host's relay carries quota usage, not the guard's.
            self.engine.record_remote_guard(report.guard, now)
            self.deltas_applied += len(report.guard)
        if self._metrics is not None:
            self._metrics.fleet_report_received(accepted=True)

    def _update_state(self) -> None:
        """Re-derive ok / local / share from the view and hand the engine its budget share.

        The member timeout follows the quota window, which a reload may change: an instance silent
        for a whole window no longer has usage in anyone's sensors, so it no longer counts.
        """
        now = self._now_ms()
        view = self.view
        view.member_timeout_ms = self._quota_window_ms()
        instances = view.instances(now)
        for departure in view.take_departures():
            # Its usage has left every window by now; an operator sees here when and why the
            # fleet stopped counting it (tests/integration/test_fleet_balancer.py reads it).
            log.info("fleet exchange: instance %s left the fleet: no report for %.3f s, over the member timeout "
                     "of %.3f s (one quota window); the previous membership check was %.3f s before",
                     departure.instance, departure.silent_ms / 1000, view.member_timeout_ms / 1000,
                     departure.since_previous_check_ms / 1000)
        state = view.state(now)
        if state != self._state:
            previous, self._state = self._state, state
            if state in ("local", "share"):
                log.error("fleet exchange: own usage reports not seen back for %.1f s; %s",
                          self.options.unreachable_after_seconds, self.describe())
            elif previous in ("local", "share"):
                log.warning("fleet exchange: reachable again; %s", self.describe())
        self.engine.set_budget_share(view.budget_share(now))
        if self._metrics is not None:
            self._metrics.fleet_status(state, instances, self.engine.budget_share)

    # ---- partition mutations ----------------------------------------------------------

    def claim(self, client: QuotaClient, charges: RequestCharges) -> asyncio.Future[FleetCharge | None] | None:
        """Send a mutation request's claim; the future gets the charge once the claim is back
        (None if it is not back within `unreachable_after`). None: charge it here at once, as
        while the exchange is down (the fallback policy covers mutations too)."""
        producer = self._producer
        if producer is None or self._state != "ok" or charges.mutations is None:
            return None
        return self._claims.open(client, charges, self.options.unreachable_after_seconds, self._send_claim)

    def _send_claim(self, claim: MutationClaim) -> None:
        task = asyncio.get_running_loop().create_task(self._write_claim(claim))
        self._tasks.append(task)
        task.add_done_callback(self._tasks.remove)

    async def _write_claim(self, claim: MutationClaim) -> None:
        producer = self._producer
        assert producer is not None
        record = encode_claim(claim)
        self.records_sent += 1
        self.bytes_sent += len(record)
        try:
            await producer.send(self.options.topic, record, key=self.options.instance_id.encode())
        except Exception as exc:  # the claim will not come back: charge it here instead
            log.warning("fleet exchange: a mutation claim was not written (%r); charging it here", exc)
            self._claims.timed_out(claim.claim_id)

    def publish_quotas(self, snapshot: bytes) -> None:
        """Make `snapshot` the fleet's quota configuration (every instance reads it back)."""
        if self._producer is None:
            self._unsent_quotas = snapshot  # sent once the exchange is connected
            return
        task = asyncio.get_running_loop().create_task(self._send_quotas(snapshot))
        self._tasks.append(task)
        task.add_done_callback(self._tasks.remove)

    async def _send_quotas(self, snapshot: bytes) -> None:
        producer = self._producer
        assert producer is not None
        try:
            await (await producer.send(self.options.quota_topic, snapshot, key=b"quotas"))
            self._unsent_quotas = None
        except Exception as exc:  # kept, and sent again at the next change or reconnection
            self._unsent_quotas = snapshot
            log.error("fleet exchange: the quota change was applied here but not shared with the fleet: %r", exc)

    async def _close_clients(self) -> None:
        # Reports still queued for an unreachable topic are not worth a hung shutdown. Both
        # clients close at once under one time limit: one after the other, a slow exchange
        # took twice the limit, and with the connections' drain grace after it a stopping
        # instance outlasted a 20 s termination (found by test_fleet_balancer's teardown).
        closing = [client.stop() for client in (self._producer, self._consumer) if client is not None]
        if closing:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.gather(*closing, return_exceptions=True), _CLOSE_TIMEOUT_S)
        self._producer = self._consumer = None

    async def stop(self) -> None:
        self._claims.close()  # requests still waiting are charged here
        tasks = list(self._tasks)  # a quota send removes itself from the list when done
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._close_clients()
        self.engine.share_usage(False)
