"""Metrics and capture: the hooks that watch the traffic without changing it.

They run last in the hook chain, so they see the throttle enforcement's verdicts folded to
(`Exchange.proxy_throttle_ms`, recorded by its chain, kqp.proxy.policies.chain) and the
response exactly as the client gets it.

Cost is the constraint here: these hooks run inline on the data path for every request.
Metrics read only what the header and the exchange already hold, plus the error codes of
small control-plane responses (walked by a compiled skipper, kqp.protocol.error_codes, not
decoded). The capture reads more (partitions, acks, fetch limits, group ids), but only for
the connections it samples (`sampling_one_in`, chosen per connection so a sampled client's
whole conversation is kept), and hands the record to a writer thread without blocking.
SASL requests are never captured: their bodies hold credentials.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kqp.protocol.api_keys import ApiKey
from kqp.protocol.apis import (
    FETCH_KEY,
    PRODUCE_KEY,
    SASL_AUTHENTICATE_KEY,
    SASL_HANDSHAKE_KEY,
)
from kqp.protocol.close_reason import CloseReason
from kqp.protocol.codec import decode_body
from kqp.protocol.error_codes import response_error_codes
from kqp.protocol.errors import ProtocolError
from kqp.protocol.fast_path import (
    PartitionSummary,
    parse_fetch_response,
    parse_produce_request,
)
from kqp.proxy.hooks import (
    CaptureFindings,
    ClientView,
    Exchange,
    PartitionColumns,
    RequestColumns,
    ResponseVerdict,
    TrafficHooks,
    read_fetch_request,
)
from kqp.proxy.metrics import ProxyMetrics
from kqp.proxy.topics import TopicDirectory
from kqp.quotas.recording import QuotaTrace, broker_label

if TYPE_CHECKING:
    # Named only: the app builds the writer (and loads pyarrow) when capture is on.
    from kqp.capture.writer import CaptureWriter

log = logging.getLogger(__name__)

_SASL_APIS = frozenset({SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY})
_DATA_APIS = frozenset({PRODUCE_KEY, FETCH_KEY})
# Responses whose error codes are not worth a full decode for metrics: the data APIs (their
# partitions are read by the fast path when captured), and the share-group data APIs, whose
# bodies are mostly records.
_NO_ERROR_DECODE = _DATA_APIS | {ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE}
# Requests that name a consumer group (FindCoordinator calls it `key`).
_GROUP_FIELDS = ("group_id", "key")


def _node_label(client: ClientView) -> str:
    # The same broker label the quota budgets use, so metrics and quota state line up.
    return broker_label(client.broker)


class ObservationHooks(TrafficHooks):
    """Metrics (if `metrics`) and capture (if `capture`) of every exchange."""

    def __init__(
        self, metrics: ProxyMetrics | None, capture: CaptureWriter | None, sampling_one_in: int = 1, *,
        clock: Callable[[], float], topics: TopicDirectory,
    ) -> None:
        self.metrics = metrics
        self.capture = capture
        self.sampling_one_in = sampling_one_in
        self._clock = clock  # the event loop's, which exchanges' times are read from
        self._topics = topics
        # Exchanges carry event-loop (monotonic) times; captures want wall-clock instants.
        self._wall_offset_us: int | None = None

    def _wall_us(self, loop_time: float) -> int:
        # One offset for the process, taken at the first record: the timestamps of a capture
        # stay ordered as the loop saw them even if the wall clock is stepped later. The offset
        # is whole microseconds and the loop time is rounded on its own, so two stamps differ
        # by exactly the loop times' difference: truncating (loop_time + offset) * 1e6, a float
        # near 1.8e15, put one stamp in 25 a microsecond early, and a request forwarded as its
        # connection's mute ended then read as forwarded 1 us inside the mute.
        if self._wall_offset_us is None:
            self._wall_offset_us = round((time.time() - self._clock()) * 1_000_000)
        return round(loop_time * 1_000_000) + self._wall_offset_us

    def takes(self, call: str, api_key: int) -> bool:
        """Without a capture, a request holds nothing for observation and every response may
        stream: `request` and `needs_whole_response` are left out of the hook chain's calls
        (the capture is set when the proxy starts, not on a reload)."""
        if self.capture is None and call in ("request", "needs_whole_response"):
            return False
        return TrafficHooks.takes(self, call, api_key)

    def connection_opened(self, client: ClientView) -> None:
        self._captured(client)  # decided now, for enforcement too (ConnectionHookState.captured)
        if self.metrics is not None:
            self.metrics.connection_opened(client.listener, _node_label(client))

    def connection_closed(self, client: ClientView, reason: CloseReason) -> None:
        if self.metrics is not None:
            self.metrics.connection_closed(client.listener, _node_label(client), reason.label)

    def _captured(self, client: ClientView) -> bool:
        """Whether the capture keeps this connection's exchanges (asked once per connection)."""
        state = client.state
        captured = state.captured
        if captured is None:
            captured = state.captured = self.capture is not None and self.capture.sampled(client.connection_id)
        return captured

    def request(self, client: ClientView, exchange: Exchange, frame: bytes) -> None:
        # Reads what only the request holds while it is at hand; the record itself is built
        # when the exchange ends (`_observe`), with the response.
        if not self._captured(client) or exchange.header.api_key in _SASL_APIS:
            return None
        exchange.capture = CaptureFindings(RequestColumns())
        exchange.capture.details = self._request_details(exchange, frame)
        return None

    def _request_details(self, exchange: Exchange, frame: bytes) -> RequestColumns:
        header = exchange.header
        body = memoryview(frame)[header.body_offset:]
        if header.api_key == PRODUCE_KEY:
            try:
                produce = parse_produce_request(body, header.api_version)
            except ProtocolError:
                return {}
            assert exchange.capture is not None  # made by `request` before reading the request
            exchange.capture.produce_partitions = [self._partition_entry(p) for p in produce.partitions]
            return {"acks": produce.acks}
        if header.api_key == FETCH_KEY:
            # The request as forwarded: its limits may have been capped by quota enforcement,
            # which read the request first (read once, kept on the exchange).
            try:
                fetch = read_fetch_request(exchange, frame)
            except ProtocolError:
                return {}
            return {"fetch_max_wait_ms": fetch.request.max_wait_ms, "fetch_min_bytes": fetch.forwarded_min_bytes,
                    "fetch_max_bytes": fetch.forwarded_max_bytes}
        # Other APIs: decoded only to find a consumer group, which the analysis groups by.
        try:
            message = decode_body(header.api_key, header.api_version, memoryview(frame)[header.body_offset:],
                                  is_request=True)
        except ProtocolError:
            return {}
        for name in _GROUP_FIELDS:
            group = getattr(message, name, None)
            if isinstance(group, str):
                return {"group_id": group}
        return {}

    def response(
        self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int
    ) -> ResponseVerdict | None:
        self._observe(client, exchange, frame, body_offset)
        return None

    def unanswered(self, client: ClientView, exchange: Exchange) -> None:
        self._observe(client, exchange, None, -1)

    def needs_whole_response(self, client: ClientView, exchange: Exchange) -> bool:
        # A captured Fetch records its partitions, read from the whole response.
        return self._captured(client)

    def response_streamed(
        self, client: ClientView, exchange: Exchange, frame_size: int, body_offset: int
    ) -> None:
        # Only unsampled connections stream (see needs_whole_response), so only metrics here;
        # the error codes of a Fetch are per partition and not counted by metrics anyway.
        if self.metrics is not None:
            self._record_metrics(client, exchange, frame_size + 4, [], answered=True)

    def _observe(
        self, client: ClientView, exchange: Exchange, frame: bytes | None, body_offset: int
    ) -> None:
        header = exchange.header
        api_key = header.api_key
        loop_now = self._clock()  # the response is being written to the client now
        error_codes: tuple[int, ...] = ()
        if frame is not None and api_key not in _NO_ERROR_DECODE and exchange.header.known:
            with contextlib.suppress(ProtocolError):
                error_codes = response_error_codes(api_key, header.api_version, memoryview(frame)[body_offset:])
        response_bytes = len(frame) + 4 if frame is not None else 0  # with the size prefix
        if self.metrics is not None:
            self._record_metrics(client, exchange, response_bytes, error_codes, answered=frame is not None)
        if self.capture is None or api_key in _SASL_APIS or not self._captured(client):
            return
        record: dict[str, Any] = {
            "ts_request_received_us": self._wall_us(exchange.received_at),
            "ts_request_sent_us": self._wall_us(exchange.sent_at) if exchange.sent_at else None,
            "ts_response_received_us": (self._wall_us(exchange.response_received_at)
                                        if exchange.response_received_at else None),
            "ts_response_sent_us": self._wall_us(loop_now) if frame is not None else None,
            "connection_id": client.connection_id,
            "listener": client.listener,
            "upstream_node_id": client.broker,
            "client_address": client.peer,
            "principal": client.principal,
            "client_id": header.client_id,
            "api_key": api_key,
            "api_version": header.api_version,
            "correlation_id": header.correlation_id,
            "request_bytes": exchange.request_bytes,
            "response_bytes": response_bytes if frame is not None else None,
            "error_code": error_codes[0] if error_codes else 0,
            "broker_throttle_ms": exchange.broker_throttle_ms,
            "proxy_throttle_ms": exchange.proxy_throttle_ms,
            "sampling_one_in": self.sampling_one_in,
        }
        if exchange.capture is not None:
            record.update(exchange.capture.details)
        if exchange.quota is not None:
            record.update(_quota_fields(exchange.quota))
        if api_key in _DATA_APIS:
            partitions, top_error = self._data_partitions(exchange, frame, body_offset)
            if partitions is not None:
                record["partitions"] = partitions
                first_partition_error = next((p["error_code"] for p in partitions if p["error_code"]), 0)
                record["error_code"] = top_error or first_partition_error
        notes = exchange.mutation.notes if exchange.mutation is not None else None
        if notes:
            record["mutations"] = [
                {"topic": m.topic, "partitions": m.partitions, "error_code": m.error_code} for m in notes
            ]
        # A full queue drops the record; the writer counts drops and the server exports them.
        self.capture.submit(record)

    def _record_metrics(
        self, client: ClientView, exchange: Exchange, response_bytes: int, error_codes: Sequence[int],
        answered: bool,
    ) -> None:
        assert self.metrics is not None
        header = exchange.header
        # Two latencies: the broker's (request written upstream to response back) and the
        # proxy's own (the rest: reading, hooks, writing), which is what the proxy adds.
        broker_seconds = None
        if exchange.local_response is None and answered:
            broker_seconds = max(exchange.response_received_at - exchange.sent_at, 0.0)
        proxy_seconds = max(exchange.sent_at - exchange.received_at, 0.0)
        if answered and exchange.response_received_at:
            proxy_seconds += max(self._clock() - exchange.response_received_at, 0.0)
        user, client_id = client.principal, header.client_id or ""
        self.metrics.request_completed(
            header.api_key, header.api_version, exchange.request_bytes, response_bytes, broker_seconds,
            proxy_seconds, error_codes, user=user, client_id=client_id,
        )
        if exchange.broker_throttle_ms:
            # Which of its quotas the broker applied is not in the response.
            self.metrics.throttled("broker", user, client_id, exchange.broker_throttle_ms, True, "broker")

    def _data_partitions(
        self, exchange: Exchange, frame: bytes | None, body_offset: int
    ) -> tuple[list[PartitionColumns] | None, int]:
        """Per topic-partition figures (Produce from its request, Fetch from its response) and
        the response's top-level error code."""
        header = exchange.header
        if header.api_key == PRODUCE_KEY:
            partitions = exchange.capture.produce_partitions if exchange.capture is not None else None
            if partitions is not None and frame is not None and exchange.local_response is None:
                _add_produce_errors(partitions, frame, body_offset, header.api_version)
            return partitions, 0
        if frame is None or exchange.local_response is not None:
            return None, 0
        try:
            fetch = parse_fetch_response(memoryview(frame)[body_offset:], header.api_version)
        except ProtocolError:
            return None, 0
        return [self._partition_entry(p) for p in fetch.partitions], fetch.error_code

    def _topic_name(self, topic: str | None, topic_id: uuid.UUID | None) -> str | None:
        if topic is not None or topic_id is None:
            return topic
        # Produce v13 / Fetch v13+ name topics by id; the proxy learned the names from Metadata.
        # An id it has not seen stays visible as its UUID rather than vanishing.
        return self._topics.name_of(topic_id) or str(topic_id)

    def _partition_entry(self, summary: PartitionSummary) -> PartitionColumns:
        return {
            "topic": self._topic_name(summary.topic, summary.topic_id),
            "partition": summary.partition,
            "bytes": summary.bytes,
            "records": summary.records,
            "batches": summary.batches,
            "compression": summary.compression,
            "error_code": summary.error_code,
        }


def _quota_fields(trace: QuotaTrace) -> dict[str, Any]:
    """The engine's exact inputs (capture schema v2), so a what-if replays the proxy's decisions."""
    fields: dict[str, Any] = {
        "quota_broker": trace.broker,
        "quota_request_seq": trace.request_seq,
        "quota_request_now_ms": trace.request_now_ms,
        "quota_response_seq": trace.response_seq,
        "quota_response_now_ms": trace.response_now_ms,
    }
    if trace.request is not None and trace.request.produce_bytes is not None:
        fields["quota_produce_bytes"] = trace.request.produce_bytes
    if trace.response is not None:
        fields["quota_produce_bytes"] = trace.response.produce_bytes
        fields["quota_fetch_bytes"] = trace.response.fetch_bytes
        fields["quota_request_time_ms"] = trace.response.request_time_ms
    return fields


def _add_produce_errors(partitions: list[PartitionColumns], frame: bytes, body_offset: int, api_version: int) -> None:
    """Copy the per-partition error codes of a Produce response onto the request's entries.

    The partition figures (bytes, records, compression) come from the request, since a
    Produce response carries none; only the outcome comes from the response. A full decode
    is affordable here: the response is small and only sampled connections get this far."""
    try:
        message = decode_body(PRODUCE_KEY, api_version, memoryview(frame)[body_offset:], is_request=False)
    except ProtocolError:
        return
    codes: dict[tuple[str | uuid.UUID | None, int], int] = {}
    for topic in message.responses:
        key = getattr(topic, "name", None) if api_version < 13 else getattr(topic, "topic_id", None)
        for partition in topic.partition_responses:
            codes[(key, partition.index)] = partition.error_code
    by_position = list(codes.values())
    for position, entry in enumerate(partitions):
        code = codes.get((entry["topic"], entry["partition"]))
        if code is None and len(by_position) == len(partitions):
            # Topic ids (v13) resolved to names no longer match the response's keys; the
            # broker answers partitions in the order they were asked.
            code = by_position[position]
        if code is not None:
            entry["error_code"] = code
