"""Learning the authenticated user from SASL exchanges that pass through, without altering them.

Theory of operation. The proxy never takes part in authentication: the client and the broker
run the whole SASL exchange through it (SaslHandshake names the mechanism, then one or more
SaslAuthenticate rounds). The proxy reads the name the client presents in its first message
(a *candidate*) and trusts it only once the broker's SaslAuthenticate response reports that
the login succeeded; until then, and whenever the broker refuses, the connection's principal
stays ANONYMOUS. What each mechanism gives:

- PLAIN (RFC 4616): the authentication id; one round.
- SCRAM-SHA-256/512 (RFC 5802): the client-first `n=` attribute; two rounds.
- OAUTHBEARER (RFC 7628): the JWT's principal claim (`sub` unless configured otherwise, as
  Kafka's `sasl.oauthbearer.sub.claim.name` and the unsecured validator's
  `unsecuredValidatorPrincipalClaimName`), read from the token's payload without checking the
  signature: the broker validates the token, the proxy only waits for its verdict. One round,
  which succeeds only with an empty server message: a broker that rejects a token answers the
  first round *without* an error code but with a JSON error challenge, and fails the login
  only on the client's next (\\x01) message (OAuthBearerSaslServer).
- Anything else (GSSAPI, AWS_MSK_IAM, unknown mechanisms), and a login of a known mechanism
  whose name cannot be read (an OAUTHBEARER token that is not a JWT, such as MSK IAM's signed
  URLs, or a JWT without the claim): an *unreadable login*. The broker knows the principal,
  the proxy does not, so user quotas cannot apply; `take_unreadable_login` reports it once per
  connection so the caller can count and log it. The proxy cannot tell the last round of an
  unknown mechanism, so such a login is reported at its first accepted round (a GSSAPI login
  refused in a later round is counted too: rare, Kerberos checks the ticket in the first).

Re-authentication (KIP-368, `connections.max.reauth.ms`) repeats SaslHandshake and
SaslAuthenticate on the open connection. The broker refuses a different mechanism and fails a
re-authentication whose principal differs from the connection's ("Cannot change principals
during re-authentication"), then closes the connection; so a connection's principal never
changes after its first login, and the proxy keeps it whatever a re-authentication presents.

Passwords, proofs, tokens and signatures are never kept: only the name read from them.
"""

from __future__ import annotations

import base64
import binascii
import json

ANONYMOUS = "ANONYMOUS"

DEFAULT_OAUTHBEARER_SUB_CLAIM = "sub"  # Kafka's sasl.oauthbearer.sub.claim.name default

# How many successful SaslAuthenticate rounds complete a login, per mechanism whose principal
# the proxy can read.
_ROUNDS = {"PLAIN": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2, "OAUTHBEARER": 1}
READABLE_MECHANISMS = frozenset(_ROUNDS)

# RFC 7628 section 3.1: key/value pairs are separated by \x01 (kvsep).
_KVSEP = "\x01"


def plain_user(auth_bytes: bytes) -> str | None:
    """PLAIN (RFC 4616): authzid NUL authcid NUL passwd. Kafka's principal is the authcid."""
    parts = auth_bytes.split(b"\x00")
    if len(parts) != 3 or not parts[1]:
        return None
    try:
        return parts[1].decode("utf-8")
    except UnicodeDecodeError:
        return None


def scram_user(client_first: bytes) -> str | None:
    """SCRAM (RFC 5802) client-first message: gs2-header, then `n=saslname,r=nonce`."""
    try:
        text = client_first.decode("utf-8")
    except UnicodeDecodeError:
        return None
    # gs2-header is "n,," / "y,," / "p=...,," optionally with "a=authzid"; attributes follow.
    pieces = text.split(",")
    if len(pieces) < 4:
        return None
    for attribute in pieces[2:]:
        if attribute.startswith("n="):
            return attribute[2:].replace("=2C", ",").replace("=3D", "=")
    return None


def oauthbearer_token(initial_response: bytes) -> str | None:
    """The bearer token of an OAUTHBEARER client initial response (RFC 7628 section 3.1):
    gs2-header ("n,," or "n,a=authzid,"), then \\x01-separated key=value pairs, one of them
    `auth=Bearer <token>`, the others SASL extensions, ended by \\x01\\x01."""
    try:
        text = initial_response.decode("ascii")
    except UnicodeDecodeError:
        return None
    gs2_flag, _, rest = text.partition(",")
    _authzid, comma, pairs = rest.partition(",")
    if gs2_flag not in ("n", "y") or not comma:
        return None
    for pair in pairs.split(_KVSEP):
        key, equals, value = pair.partition("=")
        if key != "auth" or not equals:
            continue
        scheme, _, token = value.partition(" ")
        token = token.strip(" ")
        return token if scheme.lower() == "bearer" and token else None
    return None


def jwt_claim(token: str, claim: str) -> str | None:
    """The string value of `claim` in a JWT's payload (RFC 7519), unverified; None when the
    token is not a JWS compact serialization or the claim is missing or not a string.

    Only the payload is decoded; the header and signature are not looked at. Kafka's
    validators, too, take the principal only from a string claim.
    """
    parts = token.split(".")
    if len(parts) != 3 or not parts[1]:
        return None
    payload = parts[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (binascii.Error, ValueError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
    value = claims.get(claim) if isinstance(claims, dict) else None
    return value if isinstance(value, str) and value else None


def oauthbearer_user(initial_response: bytes, claim: str = DEFAULT_OAUTHBEARER_SUB_CLAIM) -> str | None:
    """The principal Kafka gives an OAUTHBEARER login: the token's principal claim."""
    token = oauthbearer_token(initial_response)
    return jwt_claim(token, claim) if token is not None else None


class SaslObserver:
    """Per-connection state of a SASL login seen from the middle.

    Args:
        oauthbearer_sub_claim: the JWT claim that names an OAUTHBEARER principal.
    """

    __slots__ = ("_attempt_mechanism", "_candidate", "_reported", "_rounds", "_sub_claim", "_unreadable",
                 "authenticated", "mechanism", "principal")

    def __init__(self, oauthbearer_sub_claim: str = DEFAULT_OAUTHBEARER_SUB_CLAIM) -> None:
        self._sub_claim = oauthbearer_sub_claim
        # The connection's: the mechanism and principal of its first completed login.
        self.mechanism: str | None = None
        self.principal = ANONYMOUS
        self.authenticated = False  # the principal was read and the broker accepted the login
        # The login (or re-authentication) in progress.
        self._attempt_mechanism: str | None = None
        self._candidate: str | None = None
        self._rounds = 0
        # The broker accepted a login whose principal the proxy could not read.
        self._unreadable = False
        self._reported = False

    @property
    def unreadable(self) -> bool:
        """Logged in with a principal the proxy cannot know (user quotas do not apply)."""
        return self._unreadable

    def handshake(self, mechanism: str) -> None:
        """SaslHandshake: a login, or a re-authentication, begins."""
        self._attempt_mechanism = mechanism.upper()
        self._candidate = None
        self._rounds = 0

    def authenticate_request(self, auth_bytes: bytes) -> None:
        """A client SaslAuthenticate message; the name is read from the first round only."""
        mechanism = self._attempt_mechanism
        if self._rounds or self._candidate is not None or mechanism is None:
            return
        if mechanism == "PLAIN":
            self._candidate = plain_user(auth_bytes)
        elif mechanism.startswith("SCRAM-"):
            self._candidate = scram_user(auth_bytes)
        elif mechanism == "OAUTHBEARER":
            self._candidate = oauthbearer_user(auth_bytes, self._sub_claim)

    def authenticate_response(self, error_code: int, server_message: bytes = b"") -> None:
        """The broker's SaslAuthenticate response to the round in progress."""
        mechanism = self._attempt_mechanism
        if mechanism is None:
            return
        if error_code != 0:
            # The broker closes the connection after a failed (re-)authentication.
            self._candidate = None
            self._attempt_mechanism = None
            return
        self._rounds += 1
        needed = _ROUNDS.get(mechanism)
        if needed is not None and self._rounds < needed:
            return
        if mechanism == "OAUTHBEARER" and server_message:
            return  # an error challenge: the token was rejected; the failure comes next round
        if self.mechanism is not None:
            return  # a re-authentication: the connection's principal stays what it is
        self.mechanism = mechanism
        if needed is not None and self._candidate is not None:
            self.principal = self._candidate
            self.authenticated = True
        else:
            self._unreadable = True

    def take_unreadable_login(self) -> str | None:
        """The mechanism of this connection's unreadable login, the first time it is asked."""
        if not self._unreadable or self._reported:
            return None
        self._reported = True
        return self.mechanism
