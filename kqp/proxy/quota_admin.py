"""DescribeClientQuotas and AlterClientQuotas answered by the proxy for its own quotas.

So `kafka-configs.sh --bootstrap-server <proxy> --describe/--alter --entity-type
users|clients` shows and changes the quotas the proxy enforces. The matching and the
validation are KRaft's (`kqp.quotas.admin`); an accepted alteration is written back to the
quota file and applied live through the normal reload path.

Who may do it is decided by the brokers, so that ACLs live in one place: the request goes
upstream first, over the client's own (authenticated) connection, as a DescribeClientQuotas
or as an AlterClientQuotas with validate_only set, so the brokers change nothing. Kafka
checks DESCRIBE_CONFIGS / ALTER_CONFIGS on the CLUSTER resource before anything else; a
CLUSTER_AUTHORIZATION_FAILED answer goes back to the client unchanged (Kafka's own error code
and message) and the proxy's quotas are not touched. Only an authorized answer is replaced by
the proxy's own. On a SASL listener a broker closes a connection that sends such a request
before authenticating (SaslServerAuthenticator: "Unexpected Kafka request of type ... during
SASL handshake"), and the proxy closes the client's with it. Brokers without an authorizer
let everyone in; `enforcement.admin_principals` narrows that further.

An authorized AlterClientQuotas is answered only once its write-back is done (as KRaft's
controller answers once the change is committed), but the write-back (two fsyncs and a reload)
runs off the event loop: the hook starts it when the brokers' answer arrives and holds that
one response until it ends (`hold_response`); the app runs the write-backs one at a time, in
the order asked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kqp.protocol.api_keys import ApiKey
from kqp.protocol.apis import API_SPECS
from kqp.protocol.codec import build_response, decode_body, encode_body
from kqp.protocol.errors import ProtocolError
from kqp.proxy.hooks import ClientView, Exchange, RequestVerdict, ResponseVerdict, TrafficHooks
from kqp.quotas.admin import (
    INVALID_REQUEST,
    NONE,
    UNSUPPORTED_VERSION,
    FilterComponent,
    QuotaAlteration,
    QuotaOp,
    QuotaRequestError,
    apply_alterations,
    describe_quotas,
    validate_alterations,
)
from kqp.quotas.settings import QuotaSettings

log = logging.getLogger(__name__)

DESCRIBE_CLIENT_QUOTAS_KEY = ApiKey.DESCRIBE_CLIENT_QUOTAS
ALTER_CLIENT_QUOTAS_KEY = ApiKey.ALTER_CLIENT_QUOTAS
CLUSTER_AUTHORIZATION_FAILED = 31
# A SASL listener's answer to a request sent after SaslHandshake but before SaslAuthenticate.
ILLEGAL_SASL_STATE = 34
# Errors.CLUSTER_AUTHORIZATION_FAILED's default message, which brokers send with it.
CLUSTER_AUTHORIZATION_FAILED_MESSAGE = "Cluster authorization failed."
_UNKNOWN_SERVER_ERROR = -1
# Errors the brokers' own validation gives for a request the proxy also judges itself.
_VALIDATION_ERRORS = frozenset({NONE, INVALID_REQUEST, UNSUPPORTED_VERSION})

# refused(api name, reason): counted in kqp_quota_admin_refused_total.
RefusalCounter = Callable[[str, str], None]
# store(change, who): apply `change` to the quota settings in force when the write-back's turn
# comes (each on what the previous one left), persist the result and put it in force; done
# when the new quotas are in force, or with the error that stopped them.
QuotaStore = Callable[[Callable[[QuotaSettings], QuotaSettings], str], Awaitable[None]]


@dataclass(slots=True)
class _Judgement:
    """What the brokers' answer to a quota-admin request decided, taken once per exchange."""

    forward: bool  # the brokers' answer goes to the client unchanged
    throttle: int = 0  # the brokers' ThrottleTimeMs, which the proxy's answer keeps
    refused: bool = False  # refused by admin_principals: answered as a broker's authorizer would


@dataclass(slots=True)
class _AdminExchange:
    """What this hook keeps on its exchanges (`Exchange.quota_admin_request`): the request as
    the client sent it, the judgement of the brokers' answer, and an alteration's write-back."""

    request: Any
    judgement: _Judgement | None = None
    write: asyncio.Future[None] | None = None


class QuotaAdminHooks(TrafficHooks):
    """Asks the brokers whether the client may, then answers from the proxy's own quotas."""

    api_keys = frozenset({DESCRIBE_CLIENT_QUOTAS_KEY, ALTER_CLIENT_QUOTAS_KEY})

    def __init__(
        self,
        current: Callable[[], QuotaSettings],
        store: QuotaStore,
        admin_principals: Callable[[], frozenset[str] | None] = lambda: None,
        refused: RefusalCounter | None = None,
    ) -> None:
        # current(): the quota settings in force; store: see QuotaStore.
        self._current = current
        self._store = store
        self._admin_principals = admin_principals
        self._refused = refused

    def request(self, client: ClientView, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        header = exchange.header
        if header.api_key not in self.api_keys:
            return None  # called outside a HookChain, which gives it only the APIs it declared
        request = decode_body(header.api_key, header.api_version, memoryview(frame)[header.body_offset:],
                              is_request=True)
        exchange.quota_admin_request = _AdminExchange(request)
        if header.api_key == DESCRIBE_CLIENT_QUOTAS_KEY:
            return None  # the brokers' describe is harmless: forward it as it is
        # Re-encoded rather than patched: validate_only follows the entries, whose size varies.
        # validate_only: the brokers check authorization and the request's shape, but must not
        # store the quota themselves (the proxy's file is the one source of its quotas).
        asked = request.validate_only
        request.validate_only = True
        body = encode_body(request, header.api_version)
        request.validate_only = asked
        return RequestVerdict(frame=frame[: header.body_offset] + body)

    def hold_response(
        self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int
    ) -> asyncio.Future[None] | None:
        """An authorized AlterClientQuotas that changes something: start its write-back now, and
        hold the response until it is done (the answer says whether it was)."""
        admin = exchange.quota_admin_request
        if (not isinstance(admin, _AdminExchange) or exchange.local_response is not None
                or exchange.header.api_key != ALTER_CLIENT_QUOTAS_KEY):
            return None
        judgement = self._judged(client, exchange, admin, frame, body_offset)
        request = admin.request
        if judgement.forward or judgement.refused or request.validate_only:
            return None
        alterations = _alterations(request)
        if not any(r.error_code == NONE for r in validate_alterations(alterations)):
            return None
        # As KRaft's controller: each entity is validated on its own, and the valid ones are applied
        # together (one write of the quota file); apply_alterations leaves the invalid ones out.
        admin.write = asyncio.ensure_future(self._store(
            lambda current: apply_alterations(current, alterations),
            f"AlterClientQuotas from {client.principal} ({client.peer})",
        ))
        return admin.write

    def response(
        self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int
    ) -> ResponseVerdict | None:
        admin = exchange.quota_admin_request
        if not isinstance(admin, _AdminExchange) or exchange.local_response is not None:
            return None
        judgement = self._judged(client, exchange, admin, frame, body_offset)
        if judgement.forward:
            return None
        header = exchange.header
        if header.api_key == DESCRIBE_CLIENT_QUOTAS_KEY:
            body = self._describe(header.api_version, admin.request, judgement.throttle, judgement.refused)
        else:
            body = self._alter(header.api_version, admin, judgement.throttle, judgement.refused, client)
        return ResponseVerdict(frame=frame[:body_offset] + body)

    def _judged(
        self, client: ClientView, exchange: Exchange, admin: _AdminExchange, frame: bytes, body_offset: int
    ) -> _Judgement:
        """The brokers' answer judged (once per exchange: a refusal is logged and counted once)."""
        if admin.judgement is None:
            admin.judgement = self._judge(client, exchange, frame, body_offset)
        return admin.judgement

    def _judge(self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int) -> _Judgement:
        header = exchange.header
        api = API_SPECS[header.api_key].name
        try:
            upstream = decode_body(header.api_key, header.api_version, memoryview(frame)[body_offset:],
                                   is_request=False)
        except ProtocolError as exc:
            log.warning("%s from %s: undecodable broker answer, forwarded as it is: %s", api, client.peer, exc)
            return _Judgement(forward=True)
        if header.api_key == DESCRIBE_CLIENT_QUOTAS_KEY:
            codes = [upstream.error_code]
        else:
            codes = [entry.error_code for entry in upstream.entries]
        if CLUSTER_AUTHORIZATION_FAILED in codes:
            self._refuse(client, api, "broker authorizer")
            return _Judgement(forward=True)  # Kafka's own answer, unchanged
        if ILLEGAL_SASL_STATE in codes:
            self._refuse(client, api, "before authentication")
            return _Judgement(forward=True)  # the broker closes the connection right after it
        if any(code not in _VALIDATION_ERRORS for code in codes):
            # Not an answer about the request (controller unavailable, timeout...): the client retries.
            log.info("%s from %s: brokers answered %s, forwarded as it is", api, client.peer, codes)
            return _Judgement(forward=True)
        allowed = self._admin_principals()
        # Kafka names principals "User:<name>"; the quota entity (and client.principal) is the name.
        refused = allowed is not None and f"User:{client.principal}" not in allowed
        if refused:
            self._refuse(client, api, "admin_principals")
        # The brokers' ThrottleTimeMs is kept: the request counted against the client's
        # request quota there, and the client must back off as the broker told it.
        return _Judgement(forward=False, throttle=int(upstream.throttle_time_ms), refused=refused)

    def _refuse(self, client: ClientView, api: str, reason: str) -> None:
        log.warning("%s from %s (principal %s) refused (%s)", api, client.peer, client.principal, reason)
        if self._refused is not None:
            self._refused(api, reason)

    def _describe(self, version: int, request: Any, throttle: int, refused: bool) -> bytes:
        response_class = API_SPECS[DESCRIBE_CLIENT_QUOTAS_KEY].response_class[version]
        entry_class = response_class.EntryData
        if refused:
            response = build_response(DESCRIBE_CLIENT_QUOTAS_KEY, version, throttle_time_ms=throttle,
                                      error_code=CLUSTER_AUTHORIZATION_FAILED,
                                      error_message=CLUSTER_AUTHORIZATION_FAILED_MESSAGE, entries=None)
            return encode_body(response, version)
        components = [FilterComponent(c.entity_type, c.match_type, c.match) for c in request.components]
        try:
            described = describe_quotas(self._current(), components, bool(request.strict))
        except QuotaRequestError as exc:
            response = build_response(DESCRIBE_CLIENT_QUOTAS_KEY, version, throttle_time_ms=throttle,
                                      error_code=exc.error_code, error_message=exc.message, entries=None)
            return encode_body(response, version)
        # Sorted so the same quotas always describe the same way (tools diff their output).
        entries = [
            entry_class(
                entity=[entry_class.EntityData(entity_type=t, entity_name=n) for t, n in sorted(d.entity.items())],
                values=[entry_class.ValueData(key=k, value=v) for k, v in sorted(d.values.items())],
            )
            for d in described
        ]
        response = build_response(DESCRIBE_CLIENT_QUOTAS_KEY, version, throttle_time_ms=throttle, error_code=NONE,
                                  error_message=None, entries=entries)
        return encode_body(response, version)

    def _alter(self, version: int, admin: _AdminExchange, throttle: int, refused: bool,
               client: ClientView) -> bytes:
        alterations = _alterations(admin.request)
        response_class = API_SPECS[ALTER_CLIENT_QUOTAS_KEY].response_class[version]
        entry_class = response_class.EntryData
        if refused:
            # As a broker's authorizer refusal: every entity gets the error, nothing is changed.
            entries = [
                entry_class(error_code=CLUSTER_AUTHORIZATION_FAILED, error_message=CLUSTER_AUTHORIZATION_FAILED_MESSAGE,
                            entity=[entry_class.EntityData(entity_type=t, entity_name=n) for t, n in a.entity])
                for a in alterations
            ]
            response = build_response(ALTER_CLIENT_QUOTAS_KEY, version, throttle_time_ms=throttle, entries=entries)
            return encode_body(response, version)
        # The valid entities were applied by the write-back `hold_response` started (and waited
        # for); the invalid ones are answered with their error.
        results = validate_alterations(alterations)
        failure: str | None = None
        write = admin.write
        if write is None and not admin.request.validate_only and any(r.error_code == NONE for r in results):
            # hold_response starts every write-back; a connection that never asked it stored nothing.
            log.error("AlterClientQuotas from %s: no write-back was started; nothing applied", client.peer)
            failure = "the proxy could not store the quotas: the write-back did not start"
        elif write is not None:
            error = write.exception() if not write.cancelled() else asyncio.CancelledError()
            if error is not None:  # a write-back failure answers every entity, it doesn't kill the proxy
                log.error("AlterClientQuotas from %s: could not apply: %s", client.peer, error)
                failure = f"the proxy could not store the quotas: {error}"
            else:
                log.info("AlterClientQuotas from %s (user %s): %d entities changed", client.peer,
                         client.principal, sum(r.error_code == NONE for r in results))
        entries = [
            entry_class(
                error_code=_UNKNOWN_SERVER_ERROR if failure and r.error_code == NONE else r.error_code,
                error_message=failure if failure and r.error_code == NONE else r.error_message,
                entity=[entry_class.EntityData(entity_type=t, entity_name=n) for t, n in r.entity],
            )
            for r in results
        ]
        response = build_response(ALTER_CLIENT_QUOTAS_KEY, version, throttle_time_ms=throttle, entries=entries)
        return encode_body(response, version)


def _alterations(request: Any) -> list[QuotaAlteration]:
    return [
        QuotaAlteration(
            entity=[(e.entity_type, e.entity_name) for e in entry.entity],
            ops=[QuotaOp(op.key, op.value, bool(op.remove)) for op in entry.ops],
        )
        for entry in request.entries
    ]
