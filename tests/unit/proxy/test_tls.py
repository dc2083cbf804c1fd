"""TLS: Kafka's principal mapping rules, certificate subjects as Java prints them, and TLS
termination, mTLS principals and certificate reload against the scripted broker.

The rule vectors are the cases of Kafka's SslPrincipalMapperTest; the subject strings are
what Java 17's X500Principal.getName() printed for the same subjects.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import ssl
from pathlib import Path

import pytest

from harness.certificates import CertificateAuthority, IssuedCertificate
from kqp.config.models import ListenerTlsSection, UpstreamTlsSection
from kqp.protocol.headers import response_correlation_id
from kqp.protocol.sasl import ANONYMOUS
from kqp.proxy.options import ProxyOptions
from kqp.proxy.server import ProxyServer
from kqp.proxy.tls import (
    PrincipalMappingError,
    map_principal,
    parse_principal_mapping_rules,
    subject_dn,
    upstream_context,
)
from tests.unit.helpers.fake_broker import FakeBroker, RawClient
from tests.unit.helpers.proxy import heartbeat_request

# ---- principal mapping rules -------------------------------------------------------------


@pytest.mark.parametrize("rules", [
    "DEFAULT",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
    "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
    "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
    "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
    "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/",
])
def test_valid_rules_parse(rules: str) -> None:
    assert parse_principal_mapping_rules(rules)


@pytest.mark.parametrize("rules", [
    "default",
    "DEFAUL",
    "DEFAULT/L",
    "DEFAULT/U",
    "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
    "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
])
def test_invalid_rules_are_rejected(rules: str) -> None:
    with pytest.raises(PrincipalMappingError):
        parse_principal_mapping_rules(rules)


@pytest.mark.parametrize(("subject", "principal"), [
    ("CN=Duke,OU=ServiceUsers,O=Org,C=US", "duke"),
    ("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US", "duke@sme"),
    ("cn=duke,ou=sme,dc=mycp,dc=com", "DUKE@SME"),
    ("cN=duke,OU=JavaSoft,O=Sun Microsystems", "DUKE"),
    ("OU=JavaSoft,O=Sun Microsystems,C=US", "OU=JavaSoft,O=Sun Microsystems,C=US"),
])
def test_mapping_examples(subject: str, principal: str) -> None:
    rules = parse_principal_mapping_rules(", ".join([
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
        "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
        "DEFAULT",
    ]))
    assert map_principal(rules, subject) == principal


@pytest.mark.parametrize(("rules", "printed"), [
    ("", "[]"),
    ("DEFAULT", "[DEFAULT]"),
    ("RULE://", "[RULE:/]"),
    ("RULE:/.*/", "[RULE:/.*]"),
    ("RULE:/.*/L", "[RULE:/.*/L]"),
    ("RULE://,DEFAULT", "[RULE:/, DEFAULT]"),
    ("  RULE:// ,  DEFAULT  ", "[RULE:/, DEFAULT]"),
    ("  RULE:   /     / ,  DEFAULT  ", "[RULE:   /     , DEFAULT]"),
    ("  RULE:  /     /U   ,DEFAULT  ", "[RULE:  /     /U, DEFAULT]"),
    ("  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  ", "[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]"),
    (",   , , ,      , , ,   ", "[]"),
    (",,RULE://,,,DEFAULT,,", "[RULE:/, DEFAULT]"),
    (",  , RULE: /   /    ,,,   DEFAULT, ,   ", "[RULE: /   , DEFAULT]"),
    ("     ,  , RULE:   /  /U    ,,  ,DEFAULT, ,", "[RULE:   /  /U, DEFAULT]"),
    ("RULE:\\/\\\\\\(\\)\\n\\t/\\/\\//", "[RULE:\\/\\\\\\(\\)\\n\\t/\\/\\/]"),
    ("RULE:\\**\\/+/*/L,RULE:\\/*\\**/**/", "[RULE:\\**\\/+/*/L, RULE:\\/*\\**/**]"),
    ("RULE:,RULE:,/,RULE:,\\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, /DEFAULT/,DEFAULT",
     "[RULE:,RULE:,/,RULE:,\\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, RULE:, DEFAULT, /DEFAULT, DEFAULT]"),
])
def test_rules_split_as_kafka_splits_them(rules: str, printed: str) -> None:
    assert "[" + ", ".join(map(str, parse_principal_mapping_rules(rules))) + "]" == printed


def test_escaped_comma_in_a_subject() -> None:
    rules = parse_principal_mapping_rules("RULE:^CN=((\\\\, *|\\w)+)(,.*|$)/$1/,DEFAULT")
    assert map_principal(rules, "CN=Tkac\\, Adam,OU=ITZ,DC=geodis,DC=cz") == "Tkac\\, Adam"


def test_replacement_details() -> None:
    # A group that does not exist is literal text; ${name} and \\$ work as in Java.
    rule = parse_principal_mapping_rules("RULE:^CN=(?P<who>[a-z]+)$/$2-${who}-\\$1-$1/")
    assert map_principal(rule, "CN=bob") == "$2-bob-$1-bob"
    # Java's replaceAll also replaces the empty match at the end of the subject.
    assert map_principal(parse_principal_mapping_rules("RULE:[a-z]*/x/"), "abc") == "xx"


def test_a_subject_no_rule_maps_is_an_error() -> None:
    rules = parse_principal_mapping_rules("RULE:^CN=(.*),OU=kafka$/$1/")
    with pytest.raises(PrincipalMappingError, match="no principal mapping rule applies"):
        map_principal(rules, "CN=eve,OU=elsewhere")
    assert map_principal(parse_principal_mapping_rules(None), "CN=eve") == "CN=eve"


# ---- subjects ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority.create(tmp_path_factory.mktemp("ca"))


@pytest.mark.parametrize(("subject", "java_name"), [
    ("/C=US/ST=MD/L=Fulton/O=Org, Inc/OU=ServiceUsers/CN=Alice+UID=a1/emailAddress=alice@example.com",
     "1.2.840.113549.1.9.1=#1611616c696365406578616d706c652e636f6d,CN=Alice+UID=a1,OU=ServiceUsers,"
     "O=Org\\, Inc,L=Fulton,ST=MD,C=US"),
    ("/CN=  a#b=c  d/O=#x", "O=\\#x,CN=\\ \\ a\\#b\\=c  d"),
    ('/CN= #lead=x;y<z>"q"\\\\b trail /serialNumber=42/title=Boss',
     '2.5.4.12=#0c04426f7373,2.5.4.5=#13023432,CN=\\ \\#lead\\=x\\;y\\<z\\>\\"q\\"\\\\b trail\\ '),
    ("/DC=com/DC=example/OU=J\u00fcrgen  Smith  ", "OU=J\u00fcrgen  Smith\\ \\ ,DC=example,DC=com"),
])
def test_subject_as_java_prints_it(ca: CertificateAuthority, subject: str, java_name: str) -> None:
    issued = ca.issue(f"subject-{abs(hash(subject))}", subject)
    der = ssl.PEM_cert_to_DER_cert(issued.cert.read_text())
    assert subject_dn(der) == java_name


# ---- termination, mTLS and reload through the proxy ---------------------------------------


def client_context(ca: CertificateAuthority, client: IssuedCertificate | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca.cert))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    return context


async def tls_client(port: int, context: ssl.SSLContext) -> RawClient:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    return RawClient(reader, writer)


async def start_tls_proxy(broker: FakeBroker, tls: ListenerTlsSection, **overrides: object) -> ProxyServer:
    options = ProxyOptions(upstream_bootstrap=(("127.0.0.1", broker.port),), bootstrap_port=0,
                           node_ports={broker.node_id: 0}, tls=tls, **overrides)  # type: ignore[arg-type]
    proxy = ProxyServer(options)
    await proxy.start()
    return proxy


async def test_tls_termination_forwards_to_a_plaintext_broker(broker: FakeBroker, ca: CertificateAuthority) -> None:
    server = ca.issue("proxy", "/CN=proxy")
    proxy = await start_tls_proxy(broker, ListenerTlsSection(cert_file=str(server.cert), key_file=str(server.key)))
    client = await tls_client(proxy.bootstrap_port, client_context(ca))
    client.send(heartbeat_request(11))
    assert response_correlation_id(await client.receive()) == 11
    (connection,) = proxy.connections
    assert connection.principal == ANONYMOUS
    # A plaintext client on the TLS port gets nowhere.
    plain = await RawClient.connect(proxy.bootstrap_port)
    plain.send(heartbeat_request(12))
    assert await plain.closed_by_peer(timeout=15)
    client.close()
    await proxy.stop()


async def test_mtls_subject_becomes_the_mapped_principal(
    broker: FakeBroker, ca: CertificateAuthority, caplog: pytest.LogCaptureFixture
) -> None:
    server = ca.issue("proxy", "/CN=proxy")
    alice = ca.issue("alice", "/O=kqp/OU=clients/CN=Alice")
    tls = ListenerTlsSection(cert_file=str(server.cert), key_file=str(server.key), ca_file=str(ca.cert),
                             client_auth="required",
                             principal_mapping_rules="RULE:^CN=([^,]+),OU=clients,.*$/$1/L, RULE:^CN=admin$/$0/")
    proxy = await start_tls_proxy(broker, tls)
    client = await tls_client(proxy.bootstrap_port, client_context(ca, alice))
    client.send(heartbeat_request(1))
    assert response_correlation_id(await client.receive()) == 1
    (connection,) = proxy.connections
    assert connection.principal == "alice"
    # SASL, when a login succeeds, wins over the certificate as on a broker's SASL_SSL listener.
    connection.sasl.handshake("PLAIN")
    connection.sasl.authenticate_request(b"\x00bob\x00secret")
    connection.sasl.authenticate_response(0)
    assert connection.principal == "bob"

    # A certificate no rule maps fails the connection, as the broker fails the handshake.
    mallory = ca.issue("mallory", "/O=kqp/OU=strangers/CN=Mallory")
    with caplog.at_level(logging.WARNING):
        rejected = await tls_client(proxy.bootstrap_port, client_context(ca, mallory))
        assert await rejected.closed_by_peer()
    assert "no principal mapping rule applies to 'CN=Mallory,OU=strangers,O=kqp'" in caplog.text

    # Without a client certificate the handshake itself fails.
    with caplog.at_level(logging.WARNING), pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
        anonymous = await tls_client(proxy.bootstrap_port, client_context(ca))
        anonymous.send(heartbeat_request(2))
        await anonymous.receive()
    assert "TLS handshake failed" in caplog.text
    client.close()
    await proxy.stop()


async def test_changed_certificate_files_are_used_by_new_connections(
    broker: FakeBroker, ca: CertificateAuthority, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = ca.issue("proxy-a", "/CN=proxy-a"), ca.issue("proxy-b", "/CN=proxy-b")
    cert, key = tmp_path / "proxy.pem", tmp_path / "proxy.key"
    shutil.copy(first.cert, cert)
    shutil.copy(first.key, key)
    proxy = await start_tls_proxy(broker, ListenerTlsSection(cert_file=str(cert), key_file=str(key)),
                                  certificate_check_interval_seconds=0.05)
    listener_tls = proxy.listener_tls
    assert listener_tls is not None

    async def served_subject() -> str:
        client = await tls_client(proxy.bootstrap_port, client_context(ca))
        client.send(heartbeat_request(1))
        await client.receive()
        ssl_object = client.writer.get_extra_info("ssl_object")
        client.close()
        return subject_dn(ssl_object.getpeercert(binary_form=True))

    assert await served_subject() == "CN=proxy-a"
    old = await tls_client(proxy.bootstrap_port, client_context(ca))

    # Half-written or mismatched files are refused and the running certificate stays.
    with caplog.at_level(logging.ERROR):
        cert.write_text("-----BEGIN CERTIFICATE-----\nnot a certificate\n")
        while "cannot be loaded" not in caplog.text:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    assert await served_subject() == "CN=proxy-a"

    shutil.copy(second.key, key)
    shutil.copy(second.cert, cert)
    while listener_tls.reloading.reloads < 1:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    assert await served_subject() == "CN=proxy-b"
    # A connection made before the reload carries on.
    old.send(heartbeat_request(7))
    assert response_correlation_id(await old.receive()) == 7
    old.close()
    await proxy.stop()


async def test_upstream_context_verifies_the_broker_name(tmp_path: Path, ca: CertificateAuthority) -> None:
    elsewhere = ca.issue("elsewhere", "/CN=elsewhere", san="DNS:elsewhere.example")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(str(elsewhere.cert), str(elsewhere.key))

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hi")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    strict = upstream_context(UpstreamTlsSection(ca_file=str(ca.cert)))
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        await asyncio.open_connection("127.0.0.1", port, ssl=strict)
    lenient = upstream_context(UpstreamTlsSection(ca_file=str(ca.cert), check_hostname=False))
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=lenient)
    assert await reader.read() == b"hi"
    writer.close()
    # Another CA's certificate is refused whatever the name.
    other_ca = CertificateAuthority.create(tmp_path / "other", name="other CA")
    foreign = upstream_context(UpstreamTlsSection(ca_file=str(other_ca.cert), check_hostname=False))
    with pytest.raises(ssl.SSLCertVerificationError):
        await asyncio.open_connection("127.0.0.1", port, ssl=foreign)
    server.close()
    await server.wait_closed()
