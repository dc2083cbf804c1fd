"""Enforcement reuses where the session found a Produce response's ThrottleTimeMs, and only
for the frame that offset describes."""

from __future__ import annotations

from kafka.protocol.producer import ProduceResponse

from kqp.config.models import EnforcementSection
from kqp.protocol.apis import PRODUCE_KEY
from kqp.protocol.headers import encode_response_header, response_body_offset
from kqp.protocol.throttle_field import throttle_field_offset
from kqp.proxy.enforcement import QuotaEnforcement
from kqp.proxy.hooks import ClientView, Exchange, HookChain, ResponseVerdict, TrafficHooks
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import DEFAULT_ENTITY, QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings
from tests.unit.capture.test_observation_records import CLIENT, exchange_for, produce_pair, request_frame

VERSION = 9


def enforcement() -> QuotaEnforcement:
    # 10 B/s: any Produce request is throttled, so the response's ThrottleTimeMs is patched.
    settings = QuotaSettings(entries=(QuotaEntry(QuotaEntity(None, DEFAULT_ENTITY), {"producer_byte_rate": 10}),))
    return QuotaEnforcement(QuotaEngine(settings), EnforcementSection(), lambda: 5_000.0, TopicDirectory())


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
    exchange, out = respond_through(enforcement())
    assert throttle_of(out) == exchange.proxy_throttle_ms > 0


def test_an_offset_that_described_a_replaced_frame_is_not_used() -> None:
    exchange, out = respond_through(HookChain([GrowsTheResponse(), enforcement()]))
    # Written where the replaced frame has it: the frame still decodes, with the throttle in it.
    assert throttle_of(out) == exchange.proxy_throttle_ms > 0
    assert len(out) == len(produce_response(4))
