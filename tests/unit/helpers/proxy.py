"""A proxy on loopback in front of a FakeBroker, and the requests the IO tests send through it."""

from __future__ import annotations

import struct

from kafka.protocol.consumer import HeartbeatRequest, HeartbeatResponse
from kafka.protocol.metadata import MetadataRequest

from kqp.protocol.apis import METADATA_KEY, PRODUCE_KEY
from kqp.protocol.headers import encode_request_header
from kqp.proxy.hooks import ClientView, Exchange, RequestVerdict, ResponseVerdict, TrafficHooks
from kqp.proxy.options import ProxyOptions
from kqp.proxy.server import ProxyServer
from tests.unit.helpers.fake_broker import FakeBroker

HEARTBEAT_KEY = 12


def heartbeat_request(correlation_id: int) -> bytes:
    body = HeartbeatRequest[4](group_id="g", generation_id=1, member_id="m", group_instance_id=None).encode()
    return encode_request_header(HEARTBEAT_KEY, 4, correlation_id, "test") + bytes(body)


def metadata_request(correlation_id: int, version: int = 12) -> bytes:
    body = MetadataRequest[version](topics=[], allow_auto_topic_creation=False,
                                    include_topic_authorized_operations=False).encode()
    return encode_request_header(METADATA_KEY, version, correlation_id, "test") + bytes(body)


def answer_heartbeat(header: object, body: bytes) -> bytes:
    return bytes(HeartbeatResponse[4](throttle_time_ms=0, error_code=0).encode())


async def start_proxy(broker: FakeBroker, hooks: TrafficHooks | None = None, **overrides: object) -> ProxyServer:
    options = ProxyOptions(upstream_bootstrap=(("127.0.0.1", broker.port),), bootstrap_port=0,
                           node_ports={broker.node_id: 0}, **overrides)  # type: ignore[arg-type]
    proxy = ProxyServer(options, hooks)
    await proxy.start()
    return proxy


def produce_acks0_request(correlation_id: int) -> bytes:
    # Produce v9 body: null transactional id (compact), acks=0, timeout, empty topics, no tags.
    body = b"\x00" + struct.pack(">hi", 0, 30000) + b"\x01" + b"\x00"
    return encode_request_header(PRODUCE_KEY, 9, correlation_id, "test") + body


class EventLog(TrafficHooks):
    """Records when each request is forwarded and each response reaches the hooks; with
    `one_at_a_time` every request asks the connection to forward one at a time (a throttled client)."""

    def __init__(self, one_at_a_time: bool) -> None:
        self.one_at_a_time = one_at_a_time
        self.events: list[str] = []

    def request(self, client: ClientView, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        self.events.append(f"request {exchange.header.correlation_id}")
        return RequestVerdict(one_at_a_time_s=30.0) if self.one_at_a_time else None

    def response(
        self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int
    ) -> ResponseVerdict | None:
        self.events.append(f"response {exchange.header.correlation_id}")
        return None
