"""Learning the authenticated user from SASL exchanges that pass through, without altering them.

The proxy never takes part in authentication: it reads the user name a client presents
(PLAIN's authentication id, SCRAM's client-first `n=` attribute) and only trusts it once the
broker's SaslAuthenticate response reports success for the final round. Passwords and
proofs are never kept.
"""

from __future__ import annotations

from dataclasses import dataclass

ANONYMOUS = "ANONYMOUS"

# How many successful SaslAuthenticate rounds complete a login, per mechanism.
_ROUNDS = {"PLAIN": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}


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


@dataclass(slots=True)
class SaslObserver:
    """Per-connection state of a SASL login seen from the middle."""

    mechanism: str | None = None
    candidate: str | None = None
    rounds_succeeded: int = 0
    principal: str = ANONYMOUS
    authenticated: bool = False

    def handshake(self, mechanism: str) -> None:
        self.mechanism = mechanism.upper()

    def authenticate_request(self, auth_bytes: bytes) -> None:
        if self.candidate is not None or self.mechanism is None:
            return
        if self.mechanism == "PLAIN":
            self.candidate = plain_user(auth_bytes)
        elif self.mechanism.startswith("SCRAM-"):
            self.candidate = scram_user(auth_bytes)

    def authenticate_response(self, error_code: int) -> None:
        if error_code != 0:
            self.candidate = None
            return
        self.rounds_succeeded += 1
        needed = _ROUNDS.get(self.mechanism or "")
        if needed is not None and self.rounds_succeeded >= needed and self.candidate is not None:
            self.principal = self.candidate
            self.authenticated = True
