"""An AlterClientQuotas' write-back (two fsyncs and a reload) runs off the event loop: while it
is held in a slow fsync, the proxy goes on serving its other connections, and the admin client
gets its answer, Kafka's, once the new quotas are in force.

A real ProxyApp with a quota file, in front of a scripted broker whose authorizer allows
everyone; only `os.fsync` is slowed, behind a gate the test opens (or a timer, at the latest).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from kqp.config import writeback
from kqp.config.models import CommandLine
from kqp.protocol.apis import API_SPECS, PRODUCE_KEY
from kqp.protocol.codec import decode_body, encode_body
from kqp.protocol.headers import RequestHeader, encode_request_header, response_body_offset
from kqp.proxy.app import ProxyApp, load_serve_setup
from kqp.proxy.quota_admin import ALTER_CLIENT_QUOTAS_KEY
from kqp.quotas import QuotaEngine, QuotaEntity
from tests.unit.helpers.fake_broker import FakeBroker, RawClient

# The gate opens by itself after this long: code that fsyncs on the event loop then shows as a
# produce answered only after the gate, instead of hanging the test.
GATE_OPENS_BY_ITSELF_S = 3.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _answer_alter(header: RequestHeader, body: bytes) -> bytes:
    """A broker whose authorizer allows everyone, asked with validate_only (as the proxy asks)."""
    request = decode_body(ALTER_CLIENT_QUOTAS_KEY, header.api_version, body, is_request=True)
    response_class = API_SPECS[ALTER_CLIENT_QUOTAS_KEY].response_class[header.api_version]
    entry = response_class.EntryData
    entries = [entry(error_code=0, error_message=None,
                     entity=[entry.EntityData(entity_type=e.entity_type, entity_name=e.entity_name)
                             for e in item.entity])
               for item in request.entries]
    return encode_body(response_class(throttle_time_ms=0, entries=entries), header.api_version)


def _answer_produce(header: RequestHeader, body: bytes) -> bytes:
    reply = ProduceResponse.TopicProduceResponse
    partition = reply.PartitionProduceResponse(
        index=0, error_code=0, base_offset=0, log_append_time_ms=-1, log_start_offset=0, record_errors=[],
        error_message=None, current_leader=None)
    return bytes(ProduceResponse[9](throttle_time_ms=0, responses=[reply(name="t", partition_responses=[partition])],
                                    node_endpoints=[]).encode())


def produce_request(correlation_id: int) -> bytes:
    topic = ProduceRequest.TopicProduceData
    body = ProduceRequest[9](transactional_id=None, acks=1, timeout_ms=30_000, topic_data=[
        topic(name="t", partition_data=[topic.PartitionProduceData(index=0, records=None)])]).encode()
    return encode_request_header(PRODUCE_KEY, 9, correlation_id, "producer") + bytes(body)


def alter_request(correlation_id: int, user: str, rate: float) -> bytes:
    request_class = API_SPECS[ALTER_CLIENT_QUOTAS_KEY].request_class[1]
    entry = request_class.EntryData
    request = request_class(entries=[entry(entity=[entry.EntityData(entity_type="user", entity_name=user)],
                                           ops=[entry.OpData(key="producer_byte_rate", value=rate, remove=False)])],
                            validate_only=False)
    return encode_request_header(ALTER_CLIENT_QUOTAS_KEY, 1, correlation_id, "admin") + encode_body(request, 1)


def alter_errors(response: bytes) -> list[int]:
    body = response[response_body_offset(response, ALTER_CLIENT_QUOTAS_KEY, 1):]
    return [e.error_code for e in decode_body(ALTER_CLIENT_QUOTAS_KEY, 1, body, is_request=False).entries]


class FsyncGate:
    """os.fsync held until the gate opens: a disk that takes its time."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.open = threading.Event()
        self._fsync = os.fsync

    def __call__(self, fd: int) -> None:
        self.entered.set()
        self.open.wait(GATE_OPENS_BY_ITSELF_S)
        self.open.set()  # the timer's doing when the test could not open it (a blocked loop)
        self._fsync(fd)


@dataclass
class Running:
    app: ProxyApp
    quota_file: Path
    port: int


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    broker = FakeBroker(handlers={ALTER_CLIENT_QUOTAS_KEY: _answer_alter, PRODUCE_KEY: _answer_produce})
    await broker.start()
    quota_file = tmp_path / "kqp.yaml"
    quota_file.write_text("quotas:\n  entries:\n    - entity: {user: alice}\n      producer_byte_rate: 1000\n")
    port = _free_port()
    setup = load_serve_setup([str(quota_file)], CommandLine(
        upstream=[f"127.0.0.1:{broker.port}"], bind_host="127.0.0.1", bootstrap_port=port,
        node_port_base=_free_port(), metrics_port=_free_port()))
    assert setup is not None
    app = ProxyApp(setup.settings, QuotaEngine(setup.config.quota_settings()), config=setup.config,
                   files=setup.files, command_line=setup.command_line)
    await app.start()
    yield Running(app, quota_file, port)
    await app.stop()
    await broker.stop()


def producer_byte_rate(app: ProxyApp, user: str) -> float | None:
    assert app.engine is not None
    return app.engine.quota("producer_byte_rate", user, "any")


async def test_other_connections_are_served_while_a_write_back_is_held_in_fsync(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    producer, admin = await RawClient.connect(running.port), await RawClient.connect(running.port)
    started = loop.time()
    producer.send(produce_request(1))
    await producer.receive()
    normal_s = loop.time() - started

    gate = FsyncGate()
    monkeypatch.setattr(writeback.os, "fsync", gate)
    admin.send(alter_request(2, "alice", 5000.0))
    assert await asyncio.to_thread(gate.entered.wait, 5.0)  # the write-back is now in its first fsync

    started = loop.time()
    producer.send(produce_request(3))
    await producer.receive()
    held_s = loop.time() - started
    # Answered while the fsync is still held, in about the time a produce takes anyway.
    assert not gate.open.is_set()
    assert held_s < normal_s + 0.5, (held_s, normal_s)
    # The admin client has no answer yet: it gets one when its quotas are in force.
    with pytest.raises(TimeoutError):
        await admin.receive(timeout=0.1)
    assert producer_byte_rate(running.app, "alice") == 1000.0

    gate.open.set()
    assert alter_errors(await admin.receive()) == [0]
    assert producer_byte_rate(running.app, "alice") == 5000.0
    assert "producer_byte_rate: 5000" in running.quota_file.read_text()
    producer.close()
    admin.close()


async def test_write_backs_from_two_connections_each_apply_on_what_the_other_left(running: Running) -> None:
    first, second = await RawClient.connect(running.port), await RawClient.connect(running.port)
    first.send(alter_request(1, "alice", 5000.0))
    second.send(alter_request(1, "bob", 7000.0))
    assert alter_errors(await first.receive()) == [0]
    assert alter_errors(await second.receive()) == [0]
    assert producer_byte_rate(running.app, "alice") == 5000.0
    assert producer_byte_rate(running.app, "bob") == 7000.0
    text = running.quota_file.read_text()
    assert "producer_byte_rate: 5000" in text and "producer_byte_rate: 7000" in text
    assert running.app.engine is not None
    assert {e.entity for e in running.app.engine.settings.entries} == {QuotaEntity(user="alice"),
                                                                        QuotaEntity(user="bob")}
    first.close()
    second.close()
