"""Principals from SASL logins seen by the sans-IO session, and logins the proxy cannot read
(issue 24): OAUTHBEARER's JWT claim, GSSAPI and opaque tokens counted and logged once,
failures and KIP-368 re-authentication as the broker handles them."""

from __future__ import annotations

import base64
import json
import logging
import struct
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from kqp.protocol.apis import API_SPECS, SASL_AUTHENTICATE_KEY, SASL_HANDSHAKE_KEY
from kqp.protocol.codec import build_response, encode_body
from kqp.protocol.framing import frame
from kqp.protocol.headers import RequestHeader, encode_request_header
from kqp.protocol.sasl import ANONYMOUS, jwt_claim, oauthbearer_token, oauthbearer_user
from kqp.protocol.session import KafkaSession
from kqp.proxy.app import load_serve_setup
from kqp.proxy.hooks import ClientView, Exchange, RequestVerdict, TrafficHooks
from kqp.proxy.logins import UnreadableLogins
from kqp.proxy.metrics import ProxyMetrics
from kqp.proxy.options import ProxyOptions
from kqp.proxy.server import ProxyServer
from tests.unit.helpers.fake_broker import FakeBroker, RawClient
from tests.unit.helpers.proxy import HEARTBEAT_KEY, answer_heartbeat, heartbeat_request

SASL_AUTHENTICATION_FAILED = 58
HANDSHAKE_VERSION = 1
AUTHENTICATE_VERSION = 2  # flexible: response header v1


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt(claims: dict[str, object], signature: str = "") -> str:
    """A compact JWS; Kafka's unsecured tokens have alg none and an empty signature."""
    header = _b64url(json.dumps({"alg": "none"}).encode())
    return f"{header}.{_b64url(json.dumps(claims).encode())}.{signature}"


def initial_response(token: str, authzid: str = "", extensions: str = "") -> bytes:
    """RFC 7628 client initial response, as Kafka's and librdkafka's clients write it."""
    gs2 = f"n,a={authzid}," if authzid else "n,,"
    return f"{gs2}\x01auth=Bearer {token}\x01{extensions}\x01".encode()


class Login:
    """One client connection's session, fed SASL requests and the broker's answers."""

    def __init__(self, **session_options: str) -> None:
        self.session: KafkaSession[int] = KafkaSession(1 << 20, lambda node, host, port: (host, port),
                                                        **session_options)  # type: ignore[arg-type]
        self._correlation = 0

    def _request(self, api_key: int, version: int, message: object) -> None:
        self._correlation += 1
        body = bytes(message.encode())  # type: ignore[attr-defined]
        self.session.client_bytes(frame(encode_request_header(api_key, version, self._correlation, "c") + body))
        request = self.session.next_request()
        self.session.send_request(request, self._correlation)

    def handshake(self, mechanism: str) -> None:
        self._request(SASL_HANDSHAKE_KEY, HANDSHAKE_VERSION,
                      API_SPECS[SASL_HANDSHAKE_KEY].request_class[HANDSHAKE_VERSION](mechanism=mechanism))
        answer = struct.pack(">i", self._correlation) + struct.pack(">hi", 0, 0)  # NONE, no mechanisms listed
        list(self.session.broker_bytes(frame(answer)))

    def authenticate(self, auth_bytes: bytes, error_code: int = 0, server_message: bytes = b"") -> None:
        self._request(SASL_AUTHENTICATE_KEY, AUTHENTICATE_VERSION,
                      API_SPECS[SASL_AUTHENTICATE_KEY].request_class[AUTHENTICATE_VERSION](auth_bytes=auth_bytes))
        answer = encode_body(build_response(
            SASL_AUTHENTICATE_KEY, AUTHENTICATE_VERSION, error_code=error_code,
            error_message="refused" if error_code else None, auth_bytes=server_message, session_lifetime_ms=0,
        ), AUTHENTICATE_VERSION)
        list(self.session.broker_bytes(frame(struct.pack(">i", self._correlation) + b"\x00" + answer)))

    @property
    def principal(self) -> str:
        sasl = self.session.sasl
        return sasl.principal if sasl.authenticated else ANONYMOUS


# ---- reading OAUTHBEARER -----------------------------------------------------------------

def test_the_token_is_read_from_the_initial_response_with_or_without_authzid_and_extensions() -> None:
    token = jwt({"sub": "alice"})
    assert oauthbearer_token(initial_response(token)) == token
    assert oauthbearer_token(initial_response(token, authzid="alice", extensions="traceId=123\x01")) == token
    assert oauthbearer_token(b"n,,\x01auth=bearer  tok\x01\x01") == "tok"  # the scheme is case-insensitive
    assert oauthbearer_token(b"n,,\x01auth=Basic abc\x01\x01") is None
    assert oauthbearer_token(b"n,,\x01host=x\x01\x01") is None
    assert oauthbearer_token(b"\x01") is None  # the client's answer to an error challenge
    assert oauthbearer_token(b"\xff\xfe") is None


def test_the_principal_is_the_claim_kafka_uses_and_only_a_string_claim_counts() -> None:
    token = jwt({"sub": "alice", "preferred_username": "Alice A.", "exp": 2_000_000_000})
    assert jwt_claim(token, "sub") == "alice"
    assert jwt_claim(token, "preferred_username") == "Alice A."
    assert jwt_claim(token, "email") is None
    assert jwt_claim(jwt({"sub": 42}), "sub") is None
    assert jwt_claim(jwt({"sub": ""}), "sub") is None
    assert jwt_claim("not-a-jwt", "sub") is None
    assert jwt_claim("a.%%%.c", "sub") is None
    assert jwt_claim(f"a.{_b64url(b'[1, 2]')}.c", "sub") is None
    # A signature is never looked at: the broker validates it.
    assert oauthbearer_user(initial_response(jwt({"sub": "bob"}, signature="c2lnbmF0dXJl"))) == "bob"


# ---- the session ---------------------------------------------------------------------------

def test_an_oauthbearer_login_names_the_principal_once_the_broker_accepts() -> None:
    login = Login()
    login.handshake("OAUTHBEARER")
    login._request(SASL_AUTHENTICATE_KEY, AUTHENTICATE_VERSION,
                   API_SPECS[SASL_AUTHENTICATE_KEY].request_class[AUTHENTICATE_VERSION](
                       auth_bytes=initial_response(jwt({"sub": "alice"}))))
    assert login.principal == ANONYMOUS  # read, not yet trusted
    answer = encode_body(build_response(SASL_AUTHENTICATE_KEY, AUTHENTICATE_VERSION, error_code=0, error_message=None,
                                        auth_bytes=b"", session_lifetime_ms=3_600_000), AUTHENTICATE_VERSION)
    list(login.session.broker_bytes(frame(struct.pack(">i", 2) + b"\x00" + answer)))
    assert login.principal == "alice"
    assert login.session.sasl.take_unreadable_login() is None


def test_a_configured_claim_name_is_used_as_the_broker_is_configured() -> None:
    login = Login(oauthbearer_sub_claim="client_id")
    login.handshake("OAUTHBEARER")
    login.authenticate(initial_response(jwt({"sub": "5d1f-uuid", "client_id": "billing"})))
    assert login.principal == "billing"


def test_a_rejected_token_never_names_anyone() -> None:
    # Kafka's OAuthBearerSaslServer answers an invalid token with error code 0 and a JSON error
    # challenge; the client sends \x01 and only then the login fails.
    login = Login()
    login.handshake("OAUTHBEARER")
    login.authenticate(initial_response(jwt({"sub": "mallory"})), server_message=b'{"status":"invalid_token"}')
    assert login.principal == ANONYMOUS
    login.authenticate(b"\x01", error_code=SASL_AUTHENTICATION_FAILED)
    assert login.principal == ANONYMOUS
    assert login.session.sasl.take_unreadable_login() is None


@pytest.mark.parametrize("mechanism", ["PLAIN", "OAUTHBEARER"])
def test_failed_authentication_gives_no_principal(mechanism: str) -> None:
    login = Login()
    login.handshake(mechanism)
    auth = b"\x00alice\x00wrong" if mechanism == "PLAIN" else initial_response(jwt({"sub": "alice"}))
    login.authenticate(auth, error_code=SASL_AUTHENTICATION_FAILED)
    assert login.principal == ANONYMOUS
    assert not login.session.sasl.unreadable
    assert login.session.sasl.take_unreadable_login() is None


def _gssapi_login() -> Login:
    login = Login()
    login.handshake("GSSAPI")
    for token in (b"\x60\x82\x02\x10opaque-kerberos-ap-req", b"", b"\x05\x04\x01\xffwrapped-security-layer"):
        login.authenticate(token, server_message=b"\x05\x04opaque-server-token")
    return login


def test_unreadable_logins_are_counted_with_their_mechanism_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    metrics = ProxyMetrics(CollectorRegistry())
    report = UnreadableLogins(metrics.unreadable_login)
    not_a_jwt = initial_response("AWS4-HMAC-SHA256-signed-url-token")  # MSK IAM style: opaque to the proxy
    logins = [_gssapi_login(), _gssapi_login()]
    for _ in range(2):
        login = Login()
        login.handshake("OAUTHBEARER")
        login.authenticate(not_a_jwt)
        logins.append(login)
    no_claim = Login()
    no_claim.handshake("OAUTHBEARER")
    no_claim.authenticate(initial_response(jwt({"client_id": "svc"})))  # a JWT without `sub`
    logins.append(no_claim)

    with caplog.at_level(logging.WARNING, logger="kqp.proxy.logins"):
        for connection_id, login in enumerate(logins, 1):
            assert login.principal == ANONYMOUS
            assert login.session.sasl.unreadable
            mechanism = login.session.sasl.take_unreadable_login()
            assert mechanism is not None
            report(mechanism, connection_id, "127.0.0.1:5000")
            assert login.session.sasl.take_unreadable_login() is None  # once per connection

    def count(mechanism: str) -> float | None:
        return metrics.registry.get_sample_value("kqp_unreadable_logins_total", {"mechanism": mechanism})

    assert count("GSSAPI") == 2
    assert count("OAUTHBEARER") == 3
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2, messages
    assert "SASL GSSAPI" in messages[0] and "SASL OAUTHBEARER" in messages[1]
    assert all("user quotas" in m and "client-id" in m for m in messages)
    # Nothing of the token reaches the log.
    assert not any("AWS4" in m or "eyJ" in m for m in messages)


def test_an_unknown_mechanism_is_unreadable_too() -> None:
    login = Login()
    login.handshake("AWS_MSK_IAM")
    login.authenticate(b'{"version":"2020_10_22","x-amz-signature":"abc"}', server_message=b'{"version":"2020_10_22"}')
    assert login.session.sasl.take_unreadable_login() == "AWS_MSK_IAM"
    assert login.principal == ANONYMOUS


# ---- re-authentication (KIP-368) -------------------------------------------------------------

def test_reauthentication_as_the_same_user_keeps_the_principal() -> None:
    login = Login()
    for _ in range(3):
        login.handshake("OAUTHBEARER")
        login.authenticate(initial_response(jwt({"sub": "alice"})))
        assert login.principal == "alice"


def test_reauthentication_never_changes_the_principal() -> None:
    # The broker fails it ("Cannot change principals during re-authentication") and closes the
    # connection; until then, and even if a broker accepted it, the connection stays alice's.
    login = Login()
    login.handshake("OAUTHBEARER")
    login.authenticate(initial_response(jwt({"sub": "alice"})))
    login.handshake("OAUTHBEARER")
    login.authenticate(initial_response(jwt({"sub": "bob"})), error_code=SASL_AUTHENTICATION_FAILED)
    assert login.principal == "alice"
    login.handshake("OAUTHBEARER")
    login.authenticate(initial_response(jwt({"sub": "bob"})))
    assert login.principal == "alice"


def test_scram_reauthentication_reads_its_own_rounds() -> None:
    login = Login()
    for first_login in (True, False):
        login.handshake("SCRAM-SHA-512")
        login.authenticate(b"n,,n=alice,r=nonce", server_message=b"r=nonce-server,s=salt,i=4096")
        assert login.principal == (ANONYMOUS if first_login else "alice")  # trusted after the second round
        login.authenticate(b"c=biws,r=nonce-server,p=proof", server_message=b"v=signature")
        assert login.principal == "alice"


def test_an_unreadable_login_is_reported_once_even_when_it_reauthenticates() -> None:
    login = _gssapi_login()
    assert login.session.sasl.take_unreadable_login() == "GSSAPI"
    login.handshake("GSSAPI")
    login.authenticate(b"\x60\x82opaque", server_message=b"\x05\x04opaque")
    assert login.session.sasl.take_unreadable_login() is None
    assert login.principal == ANONYMOUS


def test_the_startup_log_warns_about_user_quotas_where_logins_may_be_unreadable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "kqp.yaml"
    path.write_text("upstream:\n  bootstrap_servers: ['127.0.0.1:9092']\n"
                    "proxy:\n  sasl:\n    mechanisms: [GSSAPI]\n"
                    "quotas:\n  entries:\n    - entity: {user: alice}\n      producer_byte_rate: 1048576\n")
    with caplog.at_level(logging.WARNING, logger="kqp.proxy.app"):
        assert load_serve_setup([str(path)]) is not None
    assert [r.getMessage() for r in caplog.records if "user-level quotas (alice)" in r.getMessage()]


# ---- through the proxy's IO layer --------------------------------------------------------------

class _Principals(TrafficHooks):
    """The principal each request was charged to."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def request(self, client: ClientView, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        self.seen.append(client.principal)
        return None


def _answer_sasl(header: RequestHeader, body: bytes) -> bytes:
    if header.api_key == SASL_HANDSHAKE_KEY:
        return struct.pack(">hi", 0, 0)
    return encode_body(build_response(SASL_AUTHENTICATE_KEY, header.api_version, error_code=0, error_message=None,
                                      auth_bytes=b"\x05\x04opaque", session_lifetime_ms=0), header.api_version)


async def test_a_gssapi_connection_through_the_proxy_is_anonymous_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture
) -> None:
    broker = FakeBroker(handlers={SASL_HANDSHAKE_KEY: _answer_sasl, SASL_AUTHENTICATE_KEY: _answer_sasl,
                                  HEARTBEAT_KEY: answer_heartbeat})
    await broker.start()
    metrics = ProxyMetrics(CollectorRegistry())
    principals = _Principals()
    options = ProxyOptions(upstream_bootstrap=(("127.0.0.1", broker.port),), bootstrap_port=0,
                           node_ports={broker.node_id: 0})
    proxy = ProxyServer(options, principals, on_unreadable_login=metrics.unreadable_login)
    await proxy.start()
    handshake = API_SPECS[SASL_HANDSHAKE_KEY].request_class[HANDSHAKE_VERSION](mechanism="GSSAPI")
    authenticate = API_SPECS[SASL_AUTHENTICATE_KEY].request_class[AUTHENTICATE_VERSION]
    with caplog.at_level(logging.WARNING, logger="kqp.proxy.logins"):
        for _ in range(2):
            client = await RawClient.connect(proxy.bootstrap_port)
            client.send(encode_request_header(SASL_HANDSHAKE_KEY, HANDSHAKE_VERSION, 1, "c")
                        + bytes(handshake.encode()))
            await client.receive()
            for correlation_id, token in ((2, b"\x60\x82kerberos"), (3, b"")):
                client.send(encode_request_header(SASL_AUTHENTICATE_KEY, AUTHENTICATE_VERSION, correlation_id, "c")
                            + bytes(authenticate(auth_bytes=token).encode()))
                await client.receive()
            client.send(heartbeat_request(4))
            await client.receive()
            client.close()
    await proxy.stop()
    await broker.stop()
    assert metrics.registry.get_sample_value("kqp_unreadable_logins_total", {"mechanism": "GSSAPI"}) == 2
    assert len([r for r in caplog.records if "SASL GSSAPI" in r.getMessage()]) == 1
    assert principals.seen[-1] == ANONYMOUS
