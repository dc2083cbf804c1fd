"""What a quota engine is configured with, independent of where the configuration came from.

`kqp.config` turns YAML into these; the proxy and the Spark what-if both build a
`QuotaEngine` from them, so the two always run the same arithmetic on the same inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from kqp.frozen_value import FrozenValue

# Kafka's name for a default entity (ConfigEntityName.DEFAULT).
DEFAULT_ENTITY = "<default>"

QuotaType = Literal[
    "producer_byte_rate",
    "consumer_byte_rate",
    "request_percentage",
    "controller_mutation_rate",
]
QUOTA_TYPES: tuple[QuotaType, ...] = (
    "producer_byte_rate",
    "consumer_byte_rate",
    "request_percentage",
    "controller_mutation_rate",
)
Scope = Literal["broker", "cluster"]
# The byte-rate quota types (KIP-13), the ones the fair-share model and the cluster guard shape.
PRODUCE: Literal["producer_byte_rate"] = "producer_byte_rate"
FETCH: Literal["consumer_byte_rate"] = "consumer_byte_rate"
ByteRateType = Literal["producer_byte_rate", "consumer_byte_rate"]
BYTE_RATE_TYPES: tuple[ByteRateType, ...] = (PRODUCE, FETCH)


@dataclass(frozen=True, slots=True)
class QuotaEntity(FrozenValue):
    """A (user, client-id) entity as in KIP-55.

    None means the part is absent from the entity; DEFAULT_ENTITY means the default entity.
    """

    user: str | None = None
    client_id: str | None = None


def entity_text(entity: QuotaEntity) -> str:
    """The entity as operators write it: `user=alice, client-id=app` (a missing part left out)."""
    parts = []
    if entity.user is not None:
        parts.append(f"user={entity.user}")
    if entity.client_id is not None:
        parts.append(f"client-id={entity.client_id}")
    return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class QuotaEntry(FrozenValue):
    entity: QuotaEntity
    limits: Mapping[QuotaType, float]
    # Compute and report throttles for clients matched by this entry, but do not enforce them.
    dry_run: bool = False
    # Overrides QuotaSettings.scope for clients matched by this entry.
    scope: Scope | None = None


@dataclass(frozen=True, slots=True)
class IpQuotaEntry(FrozenValue):
    """KIP-612 connection_creation_rate for one IP address, or DEFAULT_ENTITY for every IP."""

    ip: str
    connection_creation_rate: float


@dataclass(frozen=True, slots=True)
class QuotaSettings(FrozenValue):
    entries: tuple[QuotaEntry, ...] = ()
    ip_entries: tuple[IpQuotaEntry, ...] = ()
    # "broker": a budget per upstream broker, exactly as Kafka; "cluster": one budget across brokers.
    scope: Scope = "broker"
    dry_run: bool = False
    window_num: int = 11  # quota.window.num
    window_size_s: int = 1  # quota.window.size.seconds
    controller_window_num: int = 11  # controller.quota.window.num
    controller_window_size_s: int = 1  # controller.quota.window.size.seconds
    # Kafka drops a client's quota sensors after an hour without traffic.
    sensor_expiry_s: float = 3600.0
    # KIP-257: "package.module:ClassName" of a ClientQuotaCallback, with its options.
    callback: str | None = None
    callback_options: Mapping[str, object] = field(default_factory=dict)
