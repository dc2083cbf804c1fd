"""Logins whose principal the proxy cannot read: counted, and said once per mechanism.

A broker accepted the login (GSSAPI, AWS_MSK_IAM, an unknown mechanism, an OAUTHBEARER token
that is not a JWT; see kqp.protocol.sasl), so the connection works, but the proxy does not
know who it is: it counts as ANONYMOUS, and quotas keyed on a user do not reach it. Nothing of
the login (token, ticket, signature) is logged: only its mechanism and the connection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


class UnreadableLogins:
    """Reports each unreadable login to `count` (a metric) and logs the first of each mechanism.

    One instance per process: with `kqp serve --workers N` each worker logs once.
    """

    def __init__(self, count: Callable[[str], None] | None = None) -> None:
        self._count = count
        self._logged: set[str] = set()

    def __call__(self, mechanism: str, connection_id: int, peer: str) -> None:
        if self._count is not None:
            self._count(mechanism)
        if mechanism in self._logged:
            return
        self._logged.add(mechanism)
        log.warning(
            "connection %d from %s logged in with SASL %s, whose principal the proxy cannot read: the broker "
            "knows the user, the proxy does not, so user quotas (entities with `user`) do not apply to such "
            "connections; they count as ANONYMOUS (one shared user for every such login). Key their quotas on "
            "client-id instead (docs/quotas.md). Said once per mechanism; kqp_unreadable_logins_total counts "
            "them.", connection_id, peer, mechanism,
        )
