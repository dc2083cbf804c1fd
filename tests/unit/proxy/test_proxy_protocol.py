"""The PROXY protocol on real proxy listeners, against the scripted broker: the header's client
is the connection's client for max_connections_per_ip, KIP-612's connection rate, the logs
and the metrics; a header from an untrusted source, none where one is required, a wrong
version, a malformed, truncated or late header each close that connection alone, logged and
counted; the bytes after the header (a Kafka request, a TLS ClientHello) reach the
connection intact however the header arrives. The main scenario runs on asyncio's loop and
on uvloop's (what `kqp serve` runs): the header is read from the raw socket on each.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
import uvloop

from harness.certificates import CertificateAuthority
from kqp.config.models import ListenerTlsSection, ProxyProtocolSection
from kqp.protocol.headers import response_correlation_id
from kqp.proxy.metrics import ProxyMetrics
from kqp.proxy.observation import ObservationHooks
from kqp.proxy.options import ProxyOptions
from kqp.proxy.server import ProxyServer
from kqp.proxy.topics import TopicDirectory
from kqp.quotas import QuotaEngine
from kqp.quotas.settings import IpQuotaEntry, QuotaSettings
from tests.unit.helpers.fake_broker import FakeBroker, RawClient
from tests.unit.helpers.proxy import HEARTBEAT_KEY, answer_heartbeat, heartbeat_request
from tests.unit.helpers.proxy_header import LOCAL, tlv, v1, v2

LOOPBACK = ("127.0.0.0/8",)


@dataclass
class Proxied:
    proxy: ProxyServer
    metrics: ProxyMetrics

    def refused(self, reason: str) -> float:
        return self.metrics.registry.get_sample_value("kqp_proxy_protocol_refused_total", {"reason": reason}) or 0.0

    def closed(self, reason: str) -> float:
        labels = {"listener": "bootstrap", "upstream_node": "bootstrap", "reason": reason}
        return self.metrics.registry.get_sample_value("kqp_connections_closed_total", labels) or 0.0

    async def client(self, header: bytes = b"") -> RawClient:
        client = await RawClient.connect(self.proxy.bootstrap_port)
        client.writer.write(header)
        return client

    def peers(self) -> list[str]:
        return sorted(connection.peer_ip for connection in self.proxy.connections)


async def serves(client: RawClient, correlation_id: int) -> None:
    client.send(heartbeat_request(correlation_id))
    assert response_correlation_id(await client.receive()) == correlation_id


async def closed(client: RawClient) -> bool:
    """Closed by the proxy; a socket closed with unread input is reset rather than shut down."""
    try:
        return await client.closed_by_peer(timeout=5)
    except ConnectionResetError:
        return True


async def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def start_proxied(broker: FakeBroker, accept_throttle: Callable[[str], int] | None = None,
                        **overrides: object) -> Proxied:
    options = ProxyOptions(upstream_bootstrap=(("127.0.0.1", broker.port),), bootstrap_port=0,
                           node_ports={broker.node_id: 0}, **overrides)  # type: ignore[arg-type]
    metrics = ProxyMetrics()
    topics = TopicDirectory()
    observation = ObservationHooks(metrics, None, clock=asyncio.get_running_loop().time, topics=topics)
    proxy = ProxyServer(options, observation, topics=topics, accept_throttle=accept_throttle,
                        on_proxy_header_refused=metrics.proxy_header_refused)
    await proxy.start()
    return Proxied(proxy, metrics)


@pytest.fixture
async def start(broker: FakeBroker) -> AsyncIterator[Callable[..., asyncio.Future[Proxied]]]:
    started: list[ProxyServer] = []

    async def start_proxy(accept_throttle: Callable[[str], int] | None = None, **overrides: object) -> Proxied:
        proxied = await start_proxied(broker, accept_throttle, **overrides)
        started.append(proxied.proxy)
        return proxied

    yield start_proxy  # type: ignore[misc]
    for proxy in started:
        await proxy.stop(grace_s=1)


def pp(mode: str, trusted: tuple[str, ...] = LOOPBACK, **more: object) -> ProxyProtocolSection:
    return ProxyProtocolSection(mode=mode, trusted_networks=trusted, **more)  # type: ignore[arg-type]


async def per_ip_scenario(broker: FakeBroker, caplog: pytest.LogCaptureFixture) -> None:
    """Two clients behind one balancer address, each its own IP to max_connections_per_ip."""
    proxied = await start_proxied(broker, max_connections_per_ip=1, proxy_protocol=pp("v2"))
    try:
        first = await proxied.client(v2(("192.0.2.7", 40001)) + b"")
        await serves(first, 1)
        second = await proxied.client(v2(("192.0.2.8", 40002), tlvs=tlv(0x01, b"kafka")))
        await serves(second, 2)
        assert proxied.peers() == ["192.0.2.7", "192.0.2.8"]
        assert {c.peer for c in proxied.proxy.connections} == {"192.0.2.7:40001", "192.0.2.8:40002"}
        # A second connection of 192.0.2.7 is over its own limit; 192.0.2.8's is untouched.
        with caplog.at_level(logging.WARNING, logger="kqp.proxy.connection"):
            again = await proxied.client(v2(("192.0.2.7", 40003)))
            assert await again.closed_by_peer()
        assert "from 192.0.2.7:40003 via bootstrap closed: too many connections from one IP (192.0.2.7, " \
               "max_connections_per_ip=1)" in caplog.text
        assert proxied.closed("too many connections from one IP") == 1
        await serves(second, 3)
        first.close()
        second.close()
    finally:
        await proxied.proxy.stop(grace_s=1)


async def test_each_client_is_its_own_ip(broker: FakeBroker, caplog: pytest.LogCaptureFixture) -> None:
    await per_ip_scenario(broker, caplog)


def test_each_client_is_its_own_ip_on_uvloop(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        broker = FakeBroker(handlers={HEARTBEAT_KEY: answer_heartbeat})
        await broker.start()
        try:
            await per_ip_scenario(broker, caplog)
        finally:
            await broker.stop()

    uvloop.run(scenario())


async def test_v1_names_the_client(start: Callable[..., asyncio.Future[Proxied]]) -> None:
    proxied = await start(proxy_protocol=pp("v1"))
    client = await proxied.client(v1("2001:db8::7", "::1", 50000, 9092))
    await serves(client, 1)
    assert proxied.peers() == ["2001:db8::7"]


async def test_the_connection_rate_quota_counts_the_headers_ip(start: Callable[..., asyncio.Future[Proxied]]) -> None:
    # KIP-612 per IP: 192.0.2.7 may open one connection a second, 192.0.2.8 is not limited.
    def engine() -> QuotaEngine:
        return QuotaEngine(QuotaSettings(ip_entries=(IpQuotaEntry(ip="192.0.2.7", connection_creation_rate=1.0),)))

    quota = engine()
    now_ms = time.time() * 1000
    seen: list[str] = []

    def throttle(ip: str) -> int:
        seen.append(ip)
        return quota.connection_created(ip, now_ms)

    # What the same quota admits of 14 connections at once from one IP (Kafka measures the
    # rate over its sample windows, so a burst of about ten passes).
    alone = engine()
    admitted_at_once = sum(alone.connection_created("192.0.2.7", now_ms) == 0 for _ in range(14))
    assert 0 < admitted_at_once < 14
    proxied = await start(accept_throttle=throttle, proxy_protocol=pp("auto"))
    bursting = [await proxied.client(v2(("192.0.2.7", 40000 + i))) for i in range(14)]
    others = [await proxied.client(v1("192.0.2.8", "10.0.0.1", 40100 + i, 9092)) for i in range(3)]
    for i, client in enumerate(others):
        await serves(client, i)
    await wait_for(lambda: len(seen) == 17)
    assert sorted(seen) == ["192.0.2.7"] * 14 + ["192.0.2.8"] * 3
    # The rest of 192.0.2.7's are held, then closed, not served; 192.0.2.8's are untouched.
    served = [c.peer_ip for c in proxied.proxy.connections if c.counted_per_ip]
    assert served.count("192.0.2.7") == admitted_at_once
    assert served.count("192.0.2.8") == 3
    assert len(bursting) == len([c for c in proxied.proxy.connections if c.peer_ip == "192.0.2.7"])


@pytest.mark.parametrize("header", [
    pytest.param(v2(command=LOCAL), id="v2-local"),  # a balancer's health check
    pytest.param(v2(), id="v2-unspec"),
    pytest.param(b"PROXY UNKNOWN\r\n", id="v1-unknown"),
])
async def test_a_header_without_a_client_keeps_the_sockets_address(
    start: Callable[..., asyncio.Future[Proxied]], header: bytes,
) -> None:
    proxied = await start(proxy_protocol=pp("auto"))
    client = await proxied.client(header)
    await serves(client, 1)
    assert proxied.peers() == ["127.0.0.1"]


async def test_auto_takes_a_trusted_connection_without_a_header(start: Callable[..., asyncio.Future[Proxied]]) -> None:
    proxied = await start(proxy_protocol=pp("auto"))
    client = await proxied.client()
    await serves(client, 1)
    assert proxied.peers() == ["127.0.0.1"]


async def test_an_untrusted_source_without_a_header_is_served(start: Callable[..., asyncio.Future[Proxied]]) -> None:
    proxied = await start(proxy_protocol=pp("v2", ("10.0.0.0/8",)))
    client = await proxied.client()
    await serves(client, 1)
    assert proxied.peers() == ["127.0.0.1"]


# (mode, trusted networks, what the client sends, the reason label, what the log says)
REFUSED = [
    pytest.param("v2", ("10.0.0.0/8",), v2(("192.0.2.7", 1)), "header from untrusted source",
                 "does not come from proxy_protocol.trusted_networks", id="untrusted-v2"),
    pytest.param("auto", ("10.0.0.0/8",), v1("192.0.2.7", "10.0.0.1", 1, 2), "header from untrusted source",
                 "does not come from proxy_protocol.trusted_networks", id="untrusted-v1"),
    pytest.param("v2", LOOPBACK, heartbeat_request(1), "no header from trusted source",
                 "sent no PROXY header; this listener requires v2", id="missing"),
    pytest.param("v1", LOOPBACK, v2(("192.0.2.7", 1)), "wrong header version",
                 "sent a PROXY v2 header; this listener expects v1", id="wrong-version"),
    pytest.param("auto", LOOPBACK, b"PROXY TCP4 192.0.2.999 10.0.0.1 1 2\r\n", "malformed header",
                 "'192.0.2.999' is not an 4 address", id="malformed-v1"),
    pytest.param("auto", LOOPBACK, v2(("192.0.2.7", 1), tlvs=b"\x01\x00\x09ab"), "malformed header",
                 "a TLV runs past", id="malformed-v2"),
    pytest.param("v2", LOOPBACK, b"\r\n\r\n\x00\r\nQU", "truncated header", "closed 9 bytes into its PROXY header",
                 id="truncated"),
]


@pytest.mark.parametrize(("mode", "trusted", "sent", "reason", "logged"), REFUSED)
async def test_refused_closes_that_connection_only(
    start: Callable[..., asyncio.Future[Proxied]], caplog: pytest.LogCaptureFixture,
    mode: str, trusted: tuple[str, ...], sent: bytes, reason: str, logged: str,
) -> None:
    proxied = await start(proxy_protocol=pp(mode, trusted))
    good = await proxied.client(v2(("192.0.2.9", 1)) if mode != "v1" and trusted == LOOPBACK else
                                v1("192.0.2.9", "10.0.0.1", 1, 2) if mode == "v1" else b"")
    await serves(good, 1)
    with caplog.at_level(logging.WARNING, logger="kqp.proxy.server"):
        bad = await proxied.client(sent)
        if reason == "truncated header":
            bad.writer.write_eof()
        assert await closed(bad)
        await wait_for(lambda: proxied.refused(reason) == 1)
    assert f"via bootstrap refused: {reason}: " in caplog.text
    assert logged in caplog.text
    await serves(good, 2)
    assert len(proxied.proxy.connections) == 1


async def test_a_header_that_comes_too_late_is_refused(start: Callable[..., asyncio.Future[Proxied]],
                                                       caplog: pytest.LogCaptureFixture) -> None:
    proxied = await start(proxy_protocol=pp("v2", header_timeout_seconds=0.2))
    with caplog.at_level(logging.WARNING, logger="kqp.proxy.server"):
        silent = await proxied.client(v2(("192.0.2.7", 1))[:20])
        assert await silent.closed_by_peer()
    assert proxied.refused("header timeout") == 1
    assert "no whole PROXY header or first byte within 0.2 s" in caplog.text


async def test_a_balancers_tcp_check_is_no_refusal(start: Callable[..., asyncio.Future[Proxied]]) -> None:
    proxied = await start(proxy_protocol=pp("v2"))
    check = await proxied.client()
    check.writer.write_eof()
    assert await check.closed_by_peer()
    await asyncio.sleep(0.05)
    assert proxied.metrics.registry.get_sample_value("kqp_proxy_protocol_refused_total", {"reason": "header timeout"}) \
        is None
    assert not proxied.proxy.connections


async def test_the_bytes_after_a_header_arriving_piecemeal_are_the_connections(
    start: Callable[..., asyncio.Future[Proxied]],
) -> None:
    # A long v2 header (past one peek) sent a few bytes at a time, the first request in the
    # same writes: the proxy must take the header's bytes and not one more.
    proxied = await start(proxy_protocol=pp("v2"))
    stream = v2(("192.0.2.7", 1), tlvs=tlv(0x04, b"\0" * 700)) + heartbeat_request(5).__len__().to_bytes(4, "big") \
        + heartbeat_request(5)
    client = await proxied.client()
    for start_at in range(0, len(stream), 97):
        client.writer.write(stream[start_at:start_at + 97])
        await client.writer.drain()
        await asyncio.sleep(0.001)
    assert response_correlation_id(await client.receive()) == 5
    assert proxied.peers() == ["192.0.2.7"]


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority.create(tmp_path_factory.mktemp("proxy-protocol-ca"))


async def test_tls_after_the_header(start: Callable[..., asyncio.Future[Proxied]], ca: CertificateAuthority,
                                    caplog: pytest.LogCaptureFixture) -> None:
    server = ca.issue("proxy-pp", "/CN=proxy", san="DNS:kqp.test,IP:127.0.0.1")
    proxied = await start(tls=ListenerTlsSection(cert_file=str(server.cert), key_file=str(server.key)),
                          proxy_protocol=pp("v2"))
    context = ssl.create_default_context(cafile=str(ca.cert))
    client = await proxied.client(v2(("192.0.2.7", 40001)))
    await client.writer.start_tls(context, server_hostname="kqp.test")
    await serves(client, 1)
    assert proxied.peers() == ["192.0.2.7"]
    # A failed handshake names the header's client, not the balancer.
    with caplog.at_level(logging.WARNING, logger="kqp.proxy.server"):
        plain = await proxied.client(v2(("192.0.2.8", 40002)) + heartbeat_request(1))
        assert await closed(plain)
    assert "connection from 192.0.2.8:40002 via bootstrap: TLS handshake failed" in caplog.text
