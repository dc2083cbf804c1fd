"""In a fleet, a mutation with a quota waits for the fleet to charge it in its order.

Mutations are rare and their verdict is all-or-nothing per topic, so proxies of a fleet
agree on one order (kqp.proxy.fleet) instead of each charging its own copy of the budget:
two proxies must not both accept the topic that exhausts it. The fleet's charge is kept on
the request's findings (`MutationFindings.claim`), where kafka_mutations records it instead
of charging again.
"""

from __future__ import annotations

import asyncio

from kqp.protocol.errors import ProtocolError
from kqp.protocol.mutations import MUTATION_APIS
from kqp.proxy.hooks import ClientView, Exchange, FleetCharge
from kqp.proxy.policies.charges import mutation_charges, quota_client
from kqp.proxy.policies.policy import Policy
from kqp.proxy.policies.registry import PolicyRegistry


class FleetMutationOrder(Policy):
    """Holds a mutation with a quota until the fleet has charged it (no-op outside a fleet)."""

    hold_apis = MUTATION_APIS

    def __init__(self, registry: PolicyRegistry) -> None:
        self._registry = registry

    def hold(self, client: ClientView, exchange: Exchange, frame: bytes) -> asyncio.Future[FleetCharge | None] | None:
        registry = self._registry
        order = registry.mutation_order
        if order is None:
            return None
        if registry.engine.quota("controller_mutation_rate", client.principal, exchange.header.client_id or "") is None:
            return None  # nothing limits this client's mutations: no verdict to agree on
        try:
            charges = mutation_charges(registry, exchange, frame)
        except ProtocolError:
            return None  # kafka_mutations reports it, as for any proxy
        if charges is None:
            return None
        assert exchange.mutation is not None  # read by mutation_charges
        claim = exchange.mutation.claim = order.claim(quota_client(client, exchange), charges)
        return claim
