"""Kafka's byte-rate and request quotas charged on the wire, where a broker charges them (KIP-219).

For each request the policy works out the client's quota entity (principal from the SASL
exchange, client-id from the header), records what Kafka records, and gives the throttle
as its verdict. The chain writes the folded throttle into the response's ThrottleTimeMs
(max of the broker's and the proxy's) and the connection is muted for it once the response
is sent: clients that honour the field back off, and those that don't (librdkafka, acks=0
producers) find their next requests unread until the throttle ends.

Where each quota is charged, following Kafka's KafkaApis:

* produce_byte_rate (KIP-13): the request's size, when its response comes back (the broker
  records it in the produce response callback); at arrival for acks=0, which has no response.
* fetch_byte_rate (KIP-13): the response's size, when it comes back; a Fetch's MaxBytes is
  first capped at what the quota window allows (`_cap_fetch`), as the broker caps it with
  ClientQuotaManager.getMaxValueInQuotaWindow, so one fetch cannot take a window's worth
  many times over. A Fetch throttled by this quota or the request quota is answered empty
  and its bytes unrecorded, as KafkaApis.handleFetchRequest does (the verdict is `empty`;
  the chain writes the answer): the consumer fetches the same offsets again after the mute.
* request_percentage (KIP-124): the request's time on the broker, which the proxy cannot see;
  it charges the round trip it measured (less a Fetch's MaxWaitMs, time the broker spent
  waiting, not working), see kqp.quotas.recording.

controller_mutation_rate (KIP-599) is kafka_mutations'. The arithmetic (rates, windows,
throttle times) is kqp.quotas; this policy only decides when to call it. The same charging
rules are used by the Spark replay (kqp.spark_jobs.quota_replay), through kqp.quotas.recording.
"""

from __future__ import annotations

from kqp.protocol.api_keys import ApiKey
from kqp.protocol.errors import ProtocolError
from kqp.protocol.fast_path import patch_fetch_max_bytes
from kqp.proxy.hooks import ClientView, Exchange, RequestVerdict, ResponseVerdict, read_fetch_request
from kqp.proxy.policies.charges import charge_request_now, keep_trace, numbered_and_traced
from kqp.proxy.policies.policy import Policy
from kqp.proxy.policies.registry import PolicyRegistry
from kqp.quotas.recording import (
    QuotaClient,
    ResponseCharges,
    answered_empty,
    broker_label,
    charge_response_of,
    request_charged_at_arrival,
    request_charges,
    response_amounts,
)


class KafkaCharging(Policy):
    """Produce, Fetch and request time as KafkaApis charges them, for one connection."""

    request_apis = frozenset({ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.SHARE_FETCH})

    def __init__(self, registry: PolicyRegistry) -> None:
        self._registry = registry
        # The quota client of the connection's latest client id, so that it is not rebuilt
        # for every request (kept while its principal and client id stay the same).
        self._quota_client: QuotaClient | None = None

    def _client(self, client: ClientView, exchange: Exchange) -> QuotaClient:
        client_id = exchange.header.client_id or ""
        known = self._quota_client
        if known is not None and known.client_id == client_id and known.principal == client.principal:
            return known
        self._quota_client = quota_client = QuotaClient(broker_label(client.broker), client.principal, client_id)
        return quota_client

    # ---- requests --------------------------------------------------------------------

    def request(self, client: ClientView, exchange: Exchange, frame: bytes, now_ms: float) -> RequestVerdict | None:
        if exchange.header.api_key != ApiKey.PRODUCE:
            return self._cap_fetch(client, exchange, frame, now_ms)
        # Produce: charged when its response comes back, as the broker does; but acks=0 has
        # no response to carry a throttle, so it is recorded now and muted at once.
        return None if exchange.expects_response else self._produce_acks0(client, exchange, now_ms)

    def _produce_acks0(self, client: ClientView, exchange: Exchange, now_ms: float) -> RequestVerdict | None:
        header = exchange.header
        charges = request_charges(header.api_key, header.api_version, exchange.request_bytes - 4,
                                  expects_response=False)
        throttle = charge_request_now(self._registry, client, exchange, self._client(client, exchange), charges,
                                      now_ms).throttle_ms
        if not throttle:
            return None
        return RequestVerdict(mute_ms=throttle, throttle_ms=throttle)

    def _cap_fetch(self, client: ClientView, exchange: Exchange, frame: bytes, now_ms: float) -> RequestVerdict | None:
        header = exchange.header
        if not header.known:
            return None  # a ShareFetch version newer than the definitions may lay its limits out differently
        # request_bytes includes the 4-byte size prefix; Kafka's request size does not.
        charges = request_charges(header.api_key, header.api_version, exchange.request_bytes - 4, True)
        registry = self._registry
        if not request_charged_at_arrival(registry.engine, charges):
            return None  # nothing needs the request's limits: skip parsing it
        try:
            findings = read_fetch_request(exchange, frame)
        except ProtocolError:
            return None  # forwarded unchanged: the broker, not the proxy, rejects a bad Fetch
        fetch = findings.request
        cap = charge_request_now(registry, client, exchange, self._client(client, exchange), charges,
                                 now_ms).fetch_max_bytes_cap
        offset = fetch.max_bytes_offset
        if cap is None or offset is None or fetch.max_bytes is None or cap >= fetch.max_bytes:
            return None
        # As KafkaApis: max_bytes = min(max_bytes, quota window), min_bytes = min(min_bytes, max_bytes).
        # MinBytes is the int32 right before MaxBytes in every version that has MaxBytes.
        # At least one byte: the broker always returns the first batch whole anyway (KIP-74),
        # and MaxBytes 0 would read as "nothing wanted".
        cap = max(cap, 1)
        patched = bytearray(frame)
        patch_fetch_max_bytes(patched, header.body_offset + offset, cap)
        if fetch.min_bytes > cap:
            patch_fetch_max_bytes(patched, header.body_offset + offset - 4, cap)
            findings.forwarded_min_bytes = cap
        findings.forwarded_max_bytes = cap
        return RequestVerdict(frame=bytes(patched))

    # ---- responses -------------------------------------------------------------------

    def response(
        self, client: ClientView, exchange: Exchange, frame: bytes | bytearray, body_offset: int, body_size: int,
        now_ms: float,
    ) -> ResponseVerdict | None:
        """Charge what a response costs (bytes, request time): its throttle is the verdict.
        A response the proxy answered itself costs nothing: the broker never saw it."""
        if exchange.local_response is not None:
            return None
        api_key = exchange.header.api_key
        # The proxy's stand-in for the broker's request handling time (KIP-124): from when
        # the request was written upstream to when its response (or its head) arrived.
        round_trip_ms = (exchange.response_received_at - exchange.sent_at) * 1000.0
        # The charges as amounts: a ResponseCharges is built only for the trace (compiled, its
        # frozen dataclass `__init__` cost more than the rest of this call).
        produce_bytes, fetch_bytes, request_time_ms = response_amounts(
            api_key, exchange.request_bytes - 4, body_size, round_trip_ms, exchange.fetch_max_wait_ms)
        registry = self._registry
        if numbered_and_traced(registry, client):
            keep_trace(client, exchange, registry.engine_calls, now_ms,
                       response=ResponseCharges(api_key, produce_bytes, fetch_bytes, request_time_ms))
        who = self._client(client, exchange)
        throttle = charge_response_of(registry.engine, who.broker, who.principal, who.client_id, api_key,
                                      produce_bytes, fetch_bytes, request_time_ms, now_ms)
        if throttle <= 0:
            return None
        # A throttled Fetch's bytes were unrecorded: the client must get Kafka's empty answer.
        return ResponseVerdict(mute_ms=throttle, throttle_ms=throttle, empty=answered_empty(api_key, throttle))
