"""The proxy's hooks in order, as one hook (kqp.proxy.hooks' seam: its docstring gives the
order they run in and why).

Compiled with the per-request modules (kqp/compiled_modules.py): the connection calls the
chain four times for every request and response. Its class subclasses the interpreted
TrafficHooks, so mypyc makes it an ordinary class whose methods run compiled; nothing may
subclass it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from kqp.protocol.close_reason import CloseReason
from kqp.proxy.hooks import ClientView, Exchange, RequestVerdict, ResponseVerdict, TrafficHooks

_PER_API_CALLS = (
    "hold", "request", "hold_response", "response", "unanswered", "needs_whole_response", "response_started",
    "response_streamed",
)


class HookChain(TrafficHooks):
    """Several hooks in order; the first to answer a request wins, later ones see its changes.

    The app chains quota administration, then enforcement, then observation (see "The order
    hooks run in" in kqp.proxy.hooks). Verdicts fold by `RequestVerdict.fold`/`ResponseVerdict.fold`:
    mutes and throttles by max, not sum: two hooks throttling the same response mean one
    wait, as a broker returns the largest of its quotas' throttles rather than their total.

    Each per-API call goes only to the hooks that declared the exchange's API and override
    that call: `_calls[name][api_key]` holds their bound methods, in chain order, filled the
    first time an API is seen (API keys are few, and an unknown one costs one entry). The
    lookup is two dict lookups in a compiled function: it runs for every request and response.
    """

    def __init__(self, hooks: list[TrafficHooks]) -> None:
        self.hooks = hooks
        self._calls: dict[str, dict[int, tuple[Callable[..., Any], ...]]] = {name: {} for name in _PER_API_CALLS}

    def calls_for(self, name: str, api_key: int) -> tuple[Callable[..., Any], ...]:
        """The bound `name` methods of the hooks that want `api_key`, in chain order."""
        return _calls_for(self, name, api_key)

    def connection_opened(self, client: ClientView) -> None:
        for hook in self.hooks:
            hook.connection_opened(client)

    def hold(self, client: ClientView, exchange: Exchange, frame: bytes) -> asyncio.Future[Any] | None:
        for hold in _calls_for(self, "hold", exchange.header.api_key):
            wait: asyncio.Future[Any] | None = hold(client, exchange, frame)
            if wait is not None:
                return wait
        return None

    def request(self, client: ClientView, exchange: Exchange, frame: bytes) -> RequestVerdict | None:
        combined: RequestVerdict | None = None
        for request in _calls_for(self, "request", exchange.header.api_key):
            verdict: RequestVerdict | None = request(client, exchange, frame)
            if verdict is None:
                continue
            if combined is None:
                combined = verdict
            else:
                combined.fold(verdict)
            if combined.frame is not None:
                frame = combined.frame  # later hooks see the request as it will be sent
            if combined.answer is not None:
                break  # answered here: nothing is forwarded, so later hooks have no say
        return combined

    def hold_response(
        self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int
    ) -> asyncio.Future[Any] | None:
        for hold in _calls_for(self, "hold_response", exchange.header.api_key):
            wait: asyncio.Future[Any] | None = hold(client, exchange, frame, body_offset)
            if wait is not None:
                return wait
        return None

    def response(
        self, client: ClientView, exchange: Exchange, frame: bytes, body_offset: int
    ) -> ResponseVerdict | None:
        combined: ResponseVerdict | None = None
        for response in _calls_for(self, "response", exchange.header.api_key):
            verdict: ResponseVerdict | None = response(client, exchange, frame, body_offset)
            if verdict is None:
                continue
            if combined is None:
                combined = ResponseVerdict()
            combined.fold(verdict)
            if verdict.frame is not None:
                frame = combined.frame = bytes(verdict.frame)  # later hooks see it as the client will
                exchange.response_throttle_offset = None  # it described the frame replaced
        return combined

    def unanswered(self, client: ClientView, exchange: Exchange) -> None:
        for unanswered in _calls_for(self, "unanswered", exchange.header.api_key):
            unanswered(client, exchange)

    def needs_whole_response(self, client: ClientView, exchange: Exchange) -> bool:
        needs_calls = _calls_for(self, "needs_whole_response", exchange.header.api_key)
        return any(needs(client, exchange) for needs in needs_calls)

    def response_started(
        self, client: ClientView, exchange: Exchange, head: bytearray, body_offset: int, frame_size: int
    ) -> ResponseVerdict | None:
        combined: ResponseVerdict | None = None
        for started in _calls_for(self, "response_started", exchange.header.api_key):
            verdict: ResponseVerdict | None = started(client, exchange, head, body_offset, frame_size)
            if verdict is not None:
                combined = combined or ResponseVerdict()
                combined.fold(verdict)
                if not combined.empty:
                    combined.frame = None  # a streamed head is patched in place, never replaced
        return combined

    def response_streamed(
        self, client: ClientView, exchange: Exchange, frame_size: int, body_offset: int
    ) -> None:
        for streamed in _calls_for(self, "response_streamed", exchange.header.api_key):
            streamed(client, exchange, frame_size, body_offset)

    def connection_closed(self, client: ClientView, reason: CloseReason) -> None:
        for hook in self.hooks:
            hook.connection_closed(client, reason)


def _calls_for(chain: HookChain, name: str, api_key: int) -> tuple[Callable[..., Any], ...]:
    """`HookChain.calls_for`: a call's bound methods for an API, from the hooks that override
    the call and take part in it for that API, found the first time the API is seen."""
    by_api = chain._calls[name]
    calls = by_api.get(api_key)
    if calls is None:
        base = getattr(TrafficHooks, name)
        calls = by_api[api_key] = tuple(
            getattr(hook, name) for hook in chain.hooks
            if getattr(type(hook), name) is not base and hook.takes(name, api_key)
        )
    return calls
