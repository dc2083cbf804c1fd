"""What a policy is: one object per connection, made by its factory, deciding by verdicts.

A policy's factory is called with the `PolicyRegistry` (the state every connection shares)
and returns the connection's own object; the chain (kqp.proxy.policies.chain) calls it in
phases, each only for the API keys it declares and only if its class overrides the phase:

  hold      -> a future the request waits for before it is decided (the fleet's order);
  request   -> its own verdict on the request;
  response  -> its own verdict on the response (whole, or the head of a streamed one);
  throttled -> told the throttle the verdicts folded to, when there is one (> 0);
  turn      -> the mute of a budget's turn, given the folded throttle (fair turns).

The first two and `response` see no other policy's verdict (`request` is given the frame as
the earlier policies replaced it); `throttled` and `turn` see the folded throttle and nothing
else. Adding a policy: docs/design.md, "Adding a policy". Time comes in as an argument (`now_ms`, the engine's ms):
the chain reads the clock once per call, so every policy of one call sees one instant.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from mypy_extensions import mypyc_attr

from kqp.config.models import EnforcementSection
from kqp.proxy.hooks import ClientView, Exchange, RequestVerdict, ResponseVerdict
from kqp.quotas import QuotaSettings

PHASES = ("hold", "request", "response", "throttled", "turn")


# Compiled (kqp/compiled_modules.py), a native class that interpreted classes may subclass (the
# policies not compiled, tests): the compiled policies that subclass it are native classes too.
@mypyc_attr(allow_interpreted_subclasses=True)
class Policy:
    """No-op phases; a policy overrides the ones it takes part in and declares their APIs."""

    # The API keys each phase is given (None: every API); `throttled` follows every API.
    hold_apis: ClassVar[frozenset[int] | None] = None
    request_apis: ClassVar[frozenset[int] | None] = None
    response_apis: ClassVar[frozenset[int] | None] = None  # and `turn`

    @classmethod
    def enabled(cls, settings: EnforcementSection, quotas: QuotaSettings) -> bool:
        """Whether the policy takes part under these (live) settings; asked again only when
        either changes (a reload), not per request."""
        return True

    def hold(self, client: ClientView, exchange: Exchange, frame: bytes) -> asyncio.Future[Any] | None:
        return None

    def request(self, client: ClientView, exchange: Exchange, frame: bytes, now_ms: float) -> RequestVerdict | None:
        return None

    def response(
        self, client: ClientView, exchange: Exchange, frame: bytes | bytearray, body_offset: int, body_size: int,
        now_ms: float,
    ) -> ResponseVerdict | None:
        """`frame` is the whole response, or the head of a streamed one (`body_size` holds either way)."""
        return None

    def throttled(self, client: ClientView, exchange: Exchange, throttle_ms: int, now_ms: float) -> None:
        return None

    def turn(self, client: ClientView, exchange: Exchange, body_size: int, throttle_ms: int,
             now_ms: float, delivered: bool = True) -> int | None:
        """The connection's mute instead of the folded one (None: no say). `body_size` is the
        broker's; `delivered` is False when the client got the empty throttled answer instead."""
        return None

    def closed(self, client: ClientView) -> None:
        return None
