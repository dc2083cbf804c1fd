"""Which of a connection's policies take part in which phase, per API key.

A policy takes part in a phase when its class overrides it, declares the exchange's API
for it (`Policy.hold_apis`, `request_apis`, `response_apis`; `throttled` follows every API)
and is enabled under the live enforcement and quota settings (`Policy.enabled`). The tables are filled per
connection the first time an API is seen, and again after a reload, so that per request
the chain makes one dictionary lookup and calls only the policies that have a say.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kqp.config.models import EnforcementSection
from kqp.proxy.policies.policy import PHASES, Policy
from kqp.proxy.policies.registry import PolicyRegistry
from kqp.quotas import QuotaSettings

PolicyFactory = Callable[[PolicyRegistry], Policy]

@dataclass(frozen=True, slots=True)
class ApiCalls:
    """The bound calls of one connection's policies that take part in each phase for one API
    key, in `POLICIES` order."""

    hold: tuple[Callable[..., Any], ...]
    request: tuple[Callable[..., Any], ...]
    response: tuple[Callable[..., Any], ...]
    throttled: tuple[Callable[..., Any], ...]
    turn: tuple[Callable[..., Any], ...]


class ConnectionPolicies:
    """One connection's policy objects and, per API key, the calls of those that take part
    (filled the first time an API is seen, and again after a reload changed the enforcement
    or the quota settings: `settings` and `quotas` are what `by_api` was filled under)."""

    __slots__ = ("by_api", "policies", "quotas", "registry", "settings")

    def __init__(self, registry: PolicyRegistry, factories: tuple[PolicyFactory, ...]) -> None:
        self.registry = registry
        self.policies = tuple(factory(registry) for factory in factories)
        self.by_api: dict[int, ApiCalls] = {}
        self.settings = registry.settings
        self.quotas = registry.engine.settings

    def calls(self, api_key: int) -> ApiCalls:
        registry = self.registry
        settings, quotas = registry.settings, registry.engine.settings
        if settings is not self.settings or quotas is not self.quotas:  # reloaded
            self.settings, self.quotas = settings, quotas
            self.by_api.clear()
        calls = self.by_api.get(api_key)
        if calls is None:
            calls = self.by_api[api_key] = ApiCalls(*(
                tuple(getattr(policy, phase) for policy in self.policies
                      if _takes_part(policy, phase, api_key, settings, quotas))
                for phase in PHASES
            ))
        return calls


def _phase_apis(kind: type[Policy], phase: str) -> frozenset[int] | None:
    """The API keys a policy class declares for `phase` (None: every API)."""
    return {"hold": kind.hold_apis, "request": kind.request_apis, "throttled": None}.get(phase, kind.response_apis)


def _overrides(kind: type[Policy], phase: str) -> bool:
    return getattr(kind, phase) is not getattr(Policy, phase)


def _takes_part(policy: Policy, phase: str, api_key: int, settings: EnforcementSection,
                quotas: QuotaSettings) -> bool:
    kind = type(policy)
    if not _overrides(kind, phase) or not kind.enabled(settings, quotas):
        return False
    apis = _phase_apis(kind, phase)
    return apis is None or api_key in apis


def any_takes_part(factories: tuple[PolicyFactory, ...], call: str, api_key: int) -> bool:
    """Whether a policy of these factories could take part in the hook call `call` (a
    `TrafficHooks` method name) for `api_key`, whatever the settings."""
    phases = {"hold": ("hold",), "request": ("request",), "needs_whole_response": ()}.get(
        call, ("response", "throttled", "turn"))
    for factory in factories:
        if not isinstance(factory, type):
            return True  # a factory that is not a Policy class: ask it at every call
        for phase in phases:
            apis = _phase_apis(factory, phase)
            if _overrides(factory, phase) and (apis is None or api_key in apis):
                return True
    return False
