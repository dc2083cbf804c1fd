"""What the hooks record about one exchange (a request and its response) and read from it:
the records of kqp.proxy.hooks' seam, which re-exports them (its docstring says who writes
and who reads each field).

Compiled with the per-request modules (kqp/compiled_modules.py): an `Exchange` is made for
every request and its fields are read by every hook, so a native class with its own
`__init__` makes and reads them without the interpreter.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TypedDict

from kqp.protocol.api_keys import ApiKey
from kqp.protocol.fast_path import FetchRequestSummary, parse_fetch_request, parse_share_fetch_request
from kqp.protocol.headers import RequestHeader
from kqp.protocol.mutations import MutationRequest, TopicMutation
from kqp.quotas.recording import QuotaTrace, RequestOutcome


@dataclass(slots=True)
class MutationNote:
    """A topic of a CreateTopics/CreatePartitions/DeleteTopics request and what it got."""

    topic: str
    partitions: int
    error_code: int


@dataclass(slots=True)
class FetchFindings:
    """A Fetch or ShareFetch request's limits as read (once, by the first hook that needs
    them: `read_fetch_request`), and MinBytes and MaxBytes as forwarded."""

    request: FetchRequestSummary
    # Written by kafka_charging alone (the quota's cap of the request sent upstream), read by
    # observation for the capture; the request's own until capped.
    forwarded_min_bytes: int
    forwarded_max_bytes: int | None


@dataclass(slots=True)
class MutationFindings:
    """A CreateTopics/CreatePartitions/DeleteTopics request as read (once, by whichever policy
    reads it first: kqp.proxy.policies.charges.mutation_charges), and what the policies that
    act on it recorded. Each field after `request` has one writer, named with it."""

    request: MutationRequest
    # Written by fleet_mutation_order (its hold), read by kafka_mutations, which records this
    # charge instead of charging again: the charge the fleet makes in its own order
    # (kqp.proxy.fleet), made before the request hooks run; its result is None when the fleet
    # did not answer in time.
    claim: asyncio.Future[FleetCharge | None] | None = None
    # Written and read by kafka_mutations: its charge's outcome when it throttled, combined
    # with the response's own throttle, as a broker returns the larger of its quotas'.
    outcome: RequestOutcome | None = None
    # Written and read by kafka_mutations: the topics refused here (THROTTLING_QUOTA_EXCEEDED)
    # before the rest was forwarded, merged into the broker's answer.
    rejected: list[TopicMutation] = field(default_factory=list)
    # Written by kafka_mutations, read by observation (metrics and capture): per topic, what
    # the client got; None until decided.
    notes: list[MutationNote] | None = None


class RequestColumns(TypedDict, total=False):
    """The capture record's columns read from a request (kqp.capture's schema names them)."""

    acks: int
    fetch_max_wait_ms: int
    fetch_min_bytes: int
    fetch_max_bytes: int | None
    group_id: str


class PartitionColumns(TypedDict):
    """One topic-partition of a captured Produce or Fetch (an entry of the `partitions` column)."""

    topic: str | None
    partition: int
    bytes: int
    records: int
    batches: int
    compression: int
    error_code: int


@dataclass(slots=True)
class CaptureFindings:
    """What the capture reads from a request while it is at hand (sampled connections only)."""

    # Columns of the record (acks, fetch limits, group id).
    details: RequestColumns
    # Produce partitions as read from the request, completed with the response's error codes.
    produce_partitions: list[PartitionColumns] | None = None


class Exchange:
    """One request and, later, its response, as the proxy saw them. The fields up to
    `response_throttle_offset` hold for every API; the ones after it are what a hook found in
    one API's request (None for every other API), so an exchange costs the same whatever
    features exist for APIs it is not.

    A plain class with its own `__init__`, not a dataclass: one is made for every request, and
    compiled (kqp/compiled_modules.py) both its making and its fields are native, where a
    dataclass's generated `__init__` stays interpreted and its fields are looked up by name."""

    def __init__(
        self,
        header: RequestHeader,
        request_bytes: int,
        received_at: float,
        expects_response: bool = True,
        sent_at: float = 0.0,
        response_received_at: float = 0.0,
        local_response: bytes | None = None,
        quota: QuotaTrace | None = None,
        proxy_throttle_ms: int = 0,
        broker_throttle_ms: int = 0,
        response_throttle_offset: int | None = None,
        fetch: FetchFindings | None = None,
        mutation: MutationFindings | None = None,
        quota_admin_request: object = None,
        capture: CaptureFindings | None = None,
    ) -> None:
        self.header = header
        self.request_bytes = request_bytes
        self.received_at = received_at  # event-loop clock, seconds
        self.expects_response = expects_response
        self.sent_at = sent_at
        self.response_received_at = response_received_at
        # Set when the proxy answers the request itself instead of forwarding it.
        self.local_response = local_response
        # What the quota engine was given for this exchange (enforcement writes, capture reads).
        self.quota = quota
        # The throttle the proxy's own quotas gave the exchange: the largest throttle of its folded
        # verdicts, request and response, written by the policy chain alone (kqp.proxy.policies.chain)
        # for observation to read; and the one the broker put in its response (ms).
        self.proxy_throttle_ms = proxy_throttle_ms
        self.broker_throttle_ms = broker_throttle_ms
        # Where ThrottleTimeMs sits in the response frame the hooks are given, when the session
        # already found it (None: not known; read it from the frame's layout).
        self.response_throttle_offset = response_throttle_offset
        # Fetch and ShareFetch: the request's limits, read once (`read_fetch_request`).
        self.fetch = fetch
        # Partition mutations (enforcement).
        self.mutation = mutation
        # A quota-admin request the proxy applies once the brokers have authorized it (the quota
        # admin hook's own record, kqp.proxy.quota_admin, which checks its type: it sits above).
        self.quota_admin_request = quota_admin_request
        # Sampled connections: what the capture read from the request.
        self.capture = capture

    @property
    def fetch_max_wait_ms(self) -> int | None:
        """A Fetch's MaxWaitMs as asked, when read (a fetch that waits is not charged as
        request time for its wait)."""
        return self.fetch.request.max_wait_ms if self.fetch is not None else None


def read_fetch_request(exchange: Exchange, frame: bytes) -> FetchFindings:
    """The Fetch or ShareFetch request's limits, parsed on the first call and kept on the
    exchange for every later hook. Raises ProtocolError on a body that does not read."""
    findings = exchange.fetch
    if findings is None:
        header = exchange.header
        parse = parse_fetch_request if header.api_key == ApiKey.FETCH else parse_share_fetch_request
        request = parse(memoryview(frame)[header.body_offset:], header.api_version)
        findings = exchange.fetch = FetchFindings(request, request.min_bytes, request.max_bytes)
    return findings


@dataclass(frozen=True, slots=True)
class FleetCharge:
    """What a request's charges gave when the fleet applied them, and the engine time it did."""

    outcome: RequestOutcome
    charged_at_ms: float
