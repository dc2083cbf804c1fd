"""kqp.proxy.policies.kafka_charging, through the enforcement chain called directly (no
sockets): what it does to requests and responses. How a connection carries its verdicts out
(mutes, one request at a time) is tested with a proxy in front of a scripted broker:
test_throttled_pipelining, test_cluster_scope_holds, test_local_answer_throttle and
test_mutation_throttle_adjusted."""

from __future__ import annotations

import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.producer import ProduceResponse

from kqp.config.models import EnforcementSection
from kqp.protocol.apis import API_SPECS, FETCH_KEY, PRODUCE_KEY
from kqp.protocol.fast_path import parse_share_fetch_request
from kqp.protocol.headers import (
    encode_request_header,
    encode_response_header,
    parse_request_header,
    response_body_offset,
)
from kqp.protocol.throttle_field import throttle_field_offset
from kqp.protocol.throttled_fetch import throttled_fetch_response
from kqp.proxy.hook_chain import HookChain
from kqp.proxy.hooks import ClientView, Exchange, ResponseVerdict, TrafficHooks
from kqp.proxy.policies.chain import EnforcementPolicies
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import DEFAULT_ENTITY, QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings
from tests.unit.helpers.client_views import client_view
from tests.unit.helpers.exchanges import CLIENT, exchange_for, produce_pair, request_frame
from tests.unit.helpers.fetch import fetch_response_frame

# ---- Fetch and ShareFetch limits capped at the quota window ------------------------------
# A ShareFetch's MaxBytes (and MinBytes) are capped at the consumer quota's window, as Kafka's
# handleFetchFromShareFetchRequest does: min(MaxBytes, fetch.max.bytes, quota x (samples - 1) x window).

SHARE_FETCH = 78


def share_fetch_frame(version: int, min_bytes: int, max_bytes: int) -> bytes:
    message = API_SPECS[SHARE_FETCH].request_class[version](
        group_id="g", member_id="m", share_session_epoch=0, max_wait_ms=500, min_bytes=min_bytes,
        max_bytes=max_bytes, max_records=500, batch_size=500, share_acquire_mode=0, is_renew_ack=False,
        topics=[], forgotten_topics_data=[])
    return encode_request_header(SHARE_FETCH, version, 5, "consumer") + bytes(message.encode())


def capped(rate: float | None, version: int, min_bytes: int, max_bytes: int) -> tuple[int, int]:
    entries = () if rate is None else (QuotaEntry(QuotaEntity(client_id="consumer"), {"consumer_byte_rate": rate}),)
    enforcement = EnforcementPolicies(QuotaEngine(QuotaSettings(entries=entries)), EnforcementSection(),
                                   lambda: 1_000_000.0, TopicDirectory())
    frame = share_fetch_frame(version, min_bytes, max_bytes)
    header = parse_request_header(frame)
    exchange = Exchange(header=header, request_bytes=len(frame) + 4, received_at=0.0)
    verdict = enforcement.request(client_view(), exchange, frame)
    out = frame if verdict is None or verdict.frame is None else verdict.frame
    limits = parse_share_fetch_request(memoryview(out)[header.body_offset:], version)
    assert exchange.fetch_max_wait_ms == (500 if rate is not None else None)
    return limits.min_bytes, limits.max_bytes


def test_max_and_min_bytes_are_capped_at_the_quota_window() -> None:
    # 1000 B/s x 10 full samples x 1 s = 10,000 bytes; MinBytes follows MaxBytes down.
    for version in (1, 2):
        assert capped(1000.0, version, min_bytes=50_000, max_bytes=52_428_800) == (10_000, 10_000)
        assert capped(1000.0, version, min_bytes=1, max_bytes=52_428_800) == (1, 10_000)


def test_a_request_within_the_window_or_without_a_quota_is_unchanged() -> None:
    assert capped(1000.0, 1, min_bytes=1, max_bytes=4_000) == (1, 4_000)
    assert capped(None, 1, min_bytes=1, max_bytes=52_428_800) == (1, 52_428_800)


# ---- ThrottleTimeMs written where the session found it ----------------------------------
# Enforcement reuses where the session found a Produce response's ThrottleTimeMs, and only
# for the frame that offset describes.

VERSION = 9


def produce_throttling_enforcement() -> EnforcementPolicies:
    # 10 B/s: any Produce request is throttled, so the response's ThrottleTimeMs is patched.
    settings = QuotaSettings(entries=(QuotaEntry(QuotaEntity(None, DEFAULT_ENTITY), {"producer_byte_rate": 10}),))
    return EnforcementPolicies(QuotaEngine(settings), EnforcementSection(), lambda: 5_000.0, TopicDirectory())


def produce_response(partitions: int) -> bytes:
    _, response = produce_pair(VERSION, {"name": "orders"}, tuple([0] * partitions))  # type: ignore[arg-type]
    return encode_response_header(PRODUCE_KEY, VERSION, 7) + bytes(response.encode())


def throttle_of(frame: bytes) -> int:
    offset = response_body_offset(frame, PRODUCE_KEY, VERSION)
    return int(ProduceResponse.decode(frame[offset:], version=VERSION).throttle_time_ms)


def exchange_and_frame() -> tuple[Exchange, bytes]:
    request, _ = produce_pair(VERSION, {"name": "orders"}, (0, 0))
    frame = request_frame(PRODUCE_KEY, VERSION, request)
    return exchange_for(frame), frame


class GrowsTheResponse(TrafficHooks):
    """Replaces the response with one of more partitions: ThrottleTimeMs moves further in."""

    def response(self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int) -> ResponseVerdict:
        return ResponseVerdict(frame=produce_response(4))


def respond_through(hooks: TrafficHooks) -> tuple[Exchange, bytes]:
    """A Produce request and its 2-partition response through `hooks`, with the offset the
    session would have found in that response; returns the exchange and what the client gets."""
    exchange, request = exchange_and_frame()
    hooks.request(CLIENT, exchange, request)
    answer = produce_response(2)
    body_offset = response_body_offset(answer, PRODUCE_KEY, VERSION)
    exchange.response_throttle_offset = throttle_field_offset(answer, body_offset, PRODUCE_KEY, VERSION)
    verdict = hooks.response(CLIENT, exchange, answer, body_offset)
    assert verdict is not None and verdict.frame is not None
    return exchange, bytes(verdict.frame)


def test_the_offset_the_session_found_is_where_the_throttle_is_written() -> None:
    exchange, out = respond_through(produce_throttling_enforcement())
    assert throttle_of(out) == exchange.proxy_throttle_ms > 0


def test_an_offset_that_described_a_replaced_frame_is_not_used() -> None:
    exchange, out = respond_through(HookChain([GrowsTheResponse(), produce_throttling_enforcement()]))
    # Written where the replaced frame has it: the frame still decodes, with the throttle in it.
    assert throttle_of(out) == exchange.proxy_throttle_ms > 0
    assert len(out) == len(produce_response(4))


# ---- a throttled Fetch is answered empty, in every version ---------------------------------


@pytest.mark.parametrize("version", [4, 6, 7, 11, 12, 16, 18])
def test_a_throttled_fetch_response_is_replaced_by_kafkas_empty_answer(version: int) -> None:
    # 100 B/s: the ~5 kB response over a fresh 10 s window is 5x over (throttle 40 s).
    engine = QuotaEngine(QuotaSettings(entries=(
        QuotaEntry(QuotaEntity(client_id="consumer"), {"consumer_byte_rate": 100.0}),)))
    enforcement = EnforcementPolicies(engine, EnforcementSection(), lambda: 0.0, TopicDirectory())
    header = parse_request_header(encode_request_header(FETCH_KEY, version, 7, "consumer"))
    exchange = Exchange(header=header, request_bytes=100, received_at=0.0)
    frame = fetch_response_frame(version, correlation_id=7, session_id=555)
    offset = response_body_offset(frame, FETCH_KEY, version)
    verdict = enforcement.response(client_view(), exchange, frame, offset)
    assert verdict is not None and verdict.empty and verdict.throttle_ms > 0
    assert verdict.frame == throttled_fetch_response(frame, offset, version, verdict.throttle_ms)
    assert verdict.mute_ms == verdict.throttle_ms == exchange.proxy_throttle_ms
    fetched = [s.value for s in engine.snapshot(0) if s.quota_type == "consumer_byte_rate"]
    assert fetched == [0]  # recorded, then unrecorded: the consumer got none of it


def fetch_request_frame(version: int, session_id: int, session_epoch: int) -> bytes:
    request_cls = FetchRequest[version]
    fields = {"replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 50 << 20, "isolation_level": 0,
              "session_id": session_id, "session_epoch": session_epoch, "topics": [], "forgotten_topics_data": [],
              "rack_id": ""}
    message = request_cls(**{name: value for name, value in fields.items() if name in request_cls.fields})
    return encode_request_header(FETCH_KEY, version, 7, "consumer") + bytes(message.encode())


@pytest.mark.parametrize(("session_epoch", "answered_session"), [(0, 0), (-1, 0), (3, 555)])
def test_a_throttled_fetch_answers_with_the_session_its_fetch_context_has(
    session_epoch: int, answered_session: int,
) -> None:
    # FetchContext.getThrottledResponse: a full (epoch 0) or sessionless (-1) fetch gets no
    # session, though the broker made one for its full answer; an incremental one keeps its own.
    engine = QuotaEngine(QuotaSettings(entries=(
        QuotaEntry(QuotaEntity(client_id="consumer"), {"consumer_byte_rate": 100.0}),)))
    enforcement = EnforcementPolicies(engine, EnforcementSection(), lambda: 0.0, TopicDirectory())
    request = fetch_request_frame(12, 555 if session_epoch > 0 else 0, session_epoch)
    exchange = Exchange(header=parse_request_header(request), request_bytes=len(request) + 4, received_at=0.0)
    enforcement.request(client_view(), exchange, request)  # reads the request's limits and session
    frame = fetch_response_frame(12, correlation_id=7, session_id=555)
    offset = response_body_offset(frame, FETCH_KEY, 12)
    verdict = enforcement.response(client_view(), exchange, frame, offset)
    assert verdict is not None and verdict.empty and verdict.frame is not None
    message = FetchResponse[12].decode(verdict.frame[offset:])
    assert (message.error_code, message.session_id, message.responses) == (0, answered_session, [])
    assert message.throttle_time_ms == verdict.throttle_ms > 0


def test_a_fetch_within_the_quota_is_left_as_the_broker_sent_it() -> None:
    engine = QuotaEngine(QuotaSettings(entries=(
        QuotaEntry(QuotaEntity(client_id="consumer"), {"consumer_byte_rate": 1_000_000.0}),)))
    enforcement = EnforcementPolicies(engine, EnforcementSection(), lambda: 0.0, TopicDirectory())
    header = parse_request_header(encode_request_header(FETCH_KEY, 12, 7, "consumer"))
    frame = fetch_response_frame(12, correlation_id=7, session_id=555)
    verdict = enforcement.response(client_view(), Exchange(header=header, request_bytes=100, received_at=0.0),
                                   frame, response_body_offset(frame, FETCH_KEY, 12))
    assert verdict is None
