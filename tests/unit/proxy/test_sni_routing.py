"""SNI routing through a real proxy listener: one TLS port, connections routed to the node
their server name is for, rewritten addresses made from the pattern, and clients without a
name, or with a name that is not ours, refused with a log line that names what they sent.

Run on asyncio's loop and on uvloop's (what `kqp serve` runs): the SNI callback runs inside
each loop's own TLS layer.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path

import pytest
import uvloop

from harness.certificates import CertificateAuthority
from kqp.config.models import ListenerTlsSection, SniRoutingSection
from kqp.protocol.apis import METADATA_KEY
from kqp.protocol.codec import decode_body
from kqp.protocol.headers import response_body_offset, response_correlation_id
from kqp.proxy.cluster import BOOTSTRAP
from kqp.proxy.options import ProxyOptions
from kqp.proxy.server import ProxyServer
from tests.unit.helpers.fake_broker import FakeBroker, RawClient
from tests.unit.helpers.proxy import HEARTBEAT_KEY, answer_heartbeat, heartbeat_request, metadata_request

ROUTES = SniRoutingSection(bootstrap_host="bootstrap.kqp.test", broker_host_pattern="broker-$(nodeId).kqp.test")
NAMES = ("bootstrap.kqp.test", "broker-1.kqp.test", "broker-7.kqp.test", "kafka.kqp.test")


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority.create(tmp_path_factory.mktemp("sni-ca"))


@pytest.fixture(scope="module")
def listener_tls(ca: CertificateAuthority) -> ListenerTlsSection:
    # The certificate names every name the test sends, so only the proxy's routing can refuse.
    server = ca.issue("proxy-sni", "/CN=proxy", san=",".join(f"DNS:{name}" for name in NAMES) + ",IP:127.0.0.1")
    return ListenerTlsSection(cert_file=str(server.cert), key_file=str(server.key))


async def sni_client(port: int, ca: Path, server_name: str | None) -> RawClient:
    """A TLS client on 127.0.0.1 that sends `server_name` as SNI (none when None)."""
    context = ssl.create_default_context(cafile=str(ca))
    if server_name is None:
        context.check_hostname = False  # an IP address: no SNI is sent
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                   server_hostname=server_name or "127.0.0.1")
    return RawClient(reader, writer)


async def routing_scenario(listener_tls: ListenerTlsSection, ca: Path, caplog: pytest.LogCaptureFixture) -> None:
    broker = FakeBroker(handlers={HEARTBEAT_KEY: answer_heartbeat})
    await broker.start()
    options = ProxyOptions(upstream_bootstrap=(("127.0.0.1", broker.port),), bootstrap_port=0, tls=listener_tls,
                           sni_routing=ROUTES)
    proxy = ProxyServer(options)
    await proxy.start()
    try:
        # One listener only: discovery learned node 1 without opening a port for it.
        assert set(proxy.directory.listeners) == {BOOTSTRAP}
        assert proxy.directory.known_nodes() == [1]
        port = proxy.bootstrap_port

        bootstrap = await sni_client(port, ca, "bootstrap.kqp.test")
        bootstrap.send(metadata_request(7))
        response = await bootstrap.receive()
        assert response_correlation_id(response) == 7
        message = decode_body(METADATA_KEY, 12, response[response_body_offset(response, METADATA_KEY, 12):],
                              is_request=False)
        assert [(b.node_id, b.host, b.port) for b in message.brokers] == [(1, "broker-1.kqp.test", port)]

        # The broker's name, in any case, reaches that broker through the same port.
        node = await sni_client(port, ca, "BROKER-1.kqp.test")
        node.send(heartbeat_request(3))
        assert response_correlation_id(await node.receive()) == 3
        assert sorted(c.listener.name for c in proxy.connections) == ["bootstrap", "node-1"]
        assert {c.upstream_node_id for c in proxy.connections} == {None, 1}

        # No name, a name that is not ours, a node the cluster does not have: refused in the
        # handshake, one warning each naming the client and what it sent.
        refusals = {
            None: "it sent no TLS server name (SNI)",
            "kafka.kqp.test": "TLS server name 'kafka.kqp.test' is neither the bootstrap name bootstrap.kqp.test "
                              "nor a broker name of the pattern broker-$(nodeId).kqp.test",
            "broker-7.kqp.test": "TLS server name 'broker-7.kqp.test' is for node 7, which the proxy does not know",
        }
        for name, reason in refusals.items():
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                with pytest.raises((ssl.SSLError, ConnectionError)):
                    refused = await sni_client(port, ca, name)
                    refused.send(heartbeat_request(4))
                    await refused.receive()
                for _ in range(100):
                    if "refused" in caplog.text:
                        break
                    await asyncio.sleep(0.01)
            warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(warnings) == 1, warnings
            assert warnings[0].startswith("connection from 127.0.0.1:"), warnings
            assert reason in warnings[0], warnings
        assert len(proxy.connections) == 2
        bootstrap.close()
        node.close()
    finally:
        await proxy.stop()
        await broker.stop()


async def test_sni_routing_on_asyncio(listener_tls: ListenerTlsSection, ca: CertificateAuthority,
                                      caplog: pytest.LogCaptureFixture) -> None:
    await routing_scenario(listener_tls, ca.cert, caplog)


def test_sni_routing_on_uvloop(listener_tls: ListenerTlsSection, ca: CertificateAuthority,
                               caplog: pytest.LogCaptureFixture) -> None:
    uvloop.run(routing_scenario(listener_tls, ca.cert, caplog))
