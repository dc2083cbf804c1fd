"""DescribeClientQuotas and AlterClientQuotas answered by the proxy for its own quotas.

So `kafka-configs.sh --bootstrap-server <proxy> --describe/--alter --entity-type
users|clients` shows and changes the quotas the proxy enforces. The matching and the
validation are KRaft's (`kqp.quotas.admin`); an accepted alteration is written back to the
quota file and applied live through the normal reload path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kqp.protocol.apis import API_SPECS
from kqp.protocol.codec import build_response, decode_body, encode_body
from kqp.protocol.headers import encode_response_header
from kqp.proxy.connection import ProxiedConnection
from kqp.proxy.hooks import Exchange, RequestVerdict, TrafficHooks
from kqp.quotas.admin import (
    NONE,
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

DESCRIBE_CLIENT_QUOTAS_KEY = 48
ALTER_CLIENT_QUOTAS_KEY = 49
_UNKNOWN_SERVER_ERROR = -1


class QuotaAdminHooks(TrafficHooks):
    """Answers the two client-quota admin APIs locally instead of forwarding them."""

    def __init__(
        self,
        current: Callable[[], QuotaSettings],
        store: Callable[[QuotaSettings], None],
    ) -> None:
        # current(): the quota settings in force; store(settings): persist and apply them.
        self._current = current
        self._store = store

    def request(self, connection: ProxiedConnection, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        header = exchange.header
        if header.api_key == DESCRIBE_CLIENT_QUOTAS_KEY:
            body = self._describe(header.api_version, decode_body(
                header.api_key, header.api_version, memoryview(frame)[header.body_offset:], is_request=True))
        elif header.api_key == ALTER_CLIENT_QUOTAS_KEY:
            body = self._alter(header.api_version, decode_body(
                header.api_key, header.api_version, memoryview(frame)[header.body_offset:], is_request=True),
                connection)
        else:
            return None
        answer = encode_response_header(header.api_key, header.api_version, header.correlation_id) + body
        return RequestVerdict(answer=answer)

    def _describe(self, version: int, request: Any) -> bytes:
        components = [FilterComponent(c.entity_type, c.match_type, c.match) for c in request.components]
        response_class = API_SPECS[DESCRIBE_CLIENT_QUOTAS_KEY].response_class[version]
        entry_class = response_class.EntryData
        try:
            described = describe_quotas(self._current(), components, bool(request.strict))
        except QuotaRequestError as exc:
            response = build_response(DESCRIBE_CLIENT_QUOTAS_KEY, version, throttle_time_ms=0,
                                      error_code=exc.error_code, error_message=exc.message, entries=None)
            return encode_body(response, version)
        entries = [
            entry_class(
                entity=[entry_class.EntityData(entity_type=t, entity_name=n) for t, n in sorted(d.entity.items())],
                values=[entry_class.ValueData(key=k, value=v) for k, v in sorted(d.values.items())],
            )
            for d in described
        ]
        response = build_response(DESCRIBE_CLIENT_QUOTAS_KEY, version, throttle_time_ms=0, error_code=NONE,
                                  error_message=None, entries=entries)
        return encode_body(response, version)

    def _alter(self, version: int, request: Any, connection: ProxiedConnection) -> bytes:
        alterations = [
            QuotaAlteration(
                entity=[(e.entity_type, e.entity_name) for e in entry.entity],
                ops=[QuotaOp(op.key, op.value, bool(op.remove)) for op in entry.ops],
            )
            for entry in request.entries
        ]
        results = validate_alterations(alterations)
        failure: str | None = None
        if not request.validate_only and any(r.error_code == NONE for r in results):
            try:
                self._store(apply_alterations(self._current(), alterations))
            except Exception as exc:  # a write-back failure answers every entity, it doesn't kill the proxy
                log.error("AlterClientQuotas from %s: could not apply: %s", connection.peer, exc)
                failure = f"the proxy could not store the quotas: {exc}"
            else:
                log.info("AlterClientQuotas from %s (user %s): %d entities changed", connection.peer,
                         connection.principal, sum(r.error_code == NONE for r in results))
        response_class = API_SPECS[ALTER_CLIENT_QUOTAS_KEY].response_class[version]
        entry_class = response_class.EntryData
        entries = [
            entry_class(
                error_code=_UNKNOWN_SERVER_ERROR if failure and r.error_code == NONE else r.error_code,
                error_message=failure if failure and r.error_code == NONE else r.error_message,
                entity=[entry_class.EntityData(entity_type=t, entity_name=n) for t, n in r.entity],
            )
            for r in results
        ]
        response = build_response(ALTER_CLIENT_QUOTAS_KEY, version, throttle_time_ms=0, entries=entries)
        return encode_body(response, version)
