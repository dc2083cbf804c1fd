"""KIP-257 client quota callbacks, and the default one implementing KIP-55's eight levels.

A callback decides which metric tags a (user, client-id) is metered under (clients with the
same tags share one sensor, so one rate and one limit) and which limit applies to a set of
tags. The engine tells it about every quota added or removed, as Kafka's managers do.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable
from urllib.parse import quote, unquote

from kqp.quotas.settings import DEFAULT_ENTITY, QUOTA_TYPES, QuotaEntity, QuotaType

USER_TAG = "user"
CLIENT_ID_TAG = "client-id"

# ClientQuotaManager.QuotaTypes: which kinds of entity ever had a quota (bits never cleared).
CLIENT_ID_QUOTAS = 1
USER_QUOTAS = 2
USER_CLIENT_ID_QUOTAS = 4


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    """What a callback may learn about the cluster: partition counts and leaders per topic."""

    partitions: Mapping[str, int]
    # topic -> {partition: leader broker id}
    leaders: Mapping[str, Mapping[int, int]]


@runtime_checkable
class ClientQuotaCallback(Protocol):
    """Kafka's `org.apache.kafka.server.quota.ClientQuotaCallback`, in Python."""

    def quota_metric_tags(self, quota_type: QuotaType, user: str, client_id: str) -> Mapping[str, str]:
        """Tags of the sensor the client is metered under; equal tags share one quota."""
        ...

    def quota_limit(self, quota_type: QuotaType, tags: Mapping[str, str]) -> float | None:
        """The limit for a sensor with these tags, or None for no quota."""
        ...

    def update_quota(self, quota_type: QuotaType, entity: QuotaEntity, value: float) -> None: ...

    def remove_quota(self, quota_type: QuotaType, entity: QuotaEntity) -> None: ...

    def quota_reset_required(self, quota_type: QuotaType) -> bool:
        """True when every sensor's limit must be looked up again (polled on each lookup)."""
        ...

    def update_cluster_metadata(self, metadata: ClusterMetadata) -> bool:
        """True when limits changed because of the new metadata."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class EntityResolvingCallback(Protocol):
    """Optional: the configured entity whose limit a sensor uses.

    The engine uses it to apply that entry's `dry_run` and `scope`; callbacks without it get
    the global settings.
    """

    def quota_entity(self, quota_type: QuotaType, tags: Mapping[str, str]) -> QuotaEntity | None: ...


def sanitize_user(name: str) -> str:
    """Kafka's Sanitizer.sanitize: URL-encode (UTF-8) with space as %20 and '*' as %2A.

    Java's URLEncoder keeps letters, digits and `.-*_`; quote() keeps `~` too, which Java encodes.
    """
    return quote(name, safe="").replace("~", "%7E")


def entity_kind(entity: QuotaEntity) -> int:
    if entity.user is not None:
        return USER_CLIENT_ID_QUOTAS if entity.client_id is not None else USER_QUOTAS
    return CLIENT_ID_QUOTAS if entity.client_id is not None else 0


def precedence_entities(user: str, client_id: str) -> tuple[QuotaEntity, ...]:
    """The eight KIP-55 levels for a (user, client-id), most specific first."""
    return (
        QuotaEntity(user, client_id),
        QuotaEntity(user, DEFAULT_ENTITY),
        QuotaEntity(user, None),
        QuotaEntity(DEFAULT_ENTITY, client_id),
        QuotaEntity(DEFAULT_ENTITY, DEFAULT_ENTITY),
        QuotaEntity(DEFAULT_ENTITY, None),
        QuotaEntity(None, client_id),
        QuotaEntity(None, DEFAULT_ENTITY),
    )


class DefaultQuotaCallback:
    """ClientQuotaManager.DefaultQuotaCallback: KIP-55 precedence over configured entities.

    One store per quota type, like the one-callback-per-manager arrangement in Kafka. Entity
    names are kept as configured (raw); the user tag is sanitized like Kafka's metric tag and
    desanitized again for lookups.
    """

    def __init__(self) -> None:
        self._quotas: dict[QuotaType, dict[QuotaEntity, float]] = {t: {} for t in QUOTA_TYPES}
        self._kinds: dict[QuotaType, int] = dict.fromkeys(QUOTA_TYPES, 0)
        # Entities with a quota, per quota type and kind bit.
        self._kind_counts: dict[QuotaType, dict[int, int]] = {t: {} for t in QUOTA_TYPES}

    # -- what the engine asks ------------------------------------------------------------------

    def kinds_enabled(self, quota_type: QuotaType) -> int:
        return self._kinds[quota_type]

    def quota_metric_tags(self, quota_type: QuotaType, user: str, client_id: str) -> Mapping[str, str]:
        user_tag, client_tag = self.metric_tags(quota_type, user, client_id)
        return {USER_TAG: user_tag, CLIENT_ID_TAG: client_tag}

    def metric_tags(self, quota_type: QuotaType, user: str, client_id: str) -> tuple[str, str]:
        """Step A of the resolution (§2.2): which tags the client is metered under."""
        kinds = self._kinds[quota_type]
        sanitized = sanitize_user(user)
        if kinds in (0, CLIENT_ID_QUOTAS):
            return "", client_id
        if kinds == USER_QUOTAS:
            return sanitized, ""
        if kinds == USER_CLIENT_ID_QUOTAS:
            return sanitized, client_id
        quotas = self._quotas[quota_type]
        for level, entity in enumerate(precedence_entities(user, client_id), start=1):
            if entity in quotas:
                if level in (3, 6):
                    return sanitized, ""
                if level in (7, 8):
                    return "", client_id
                return sanitized, client_id
        return "", client_id

    def quota_limit(self, quota_type: QuotaType, tags: Mapping[str, str]) -> float | None:
        entity = self.quota_entity(quota_type, tags)
        return None if entity is None else self._quotas[quota_type][entity]

    def quota_entity(self, quota_type: QuotaType, tags: Mapping[str, str]) -> QuotaEntity | None:
        """Step B (§2.2): the configured entity a sensor with these tags takes its limit from."""
        user_tag = tags.get(USER_TAG)
        client_id = tags.get(CLIENT_ID_TAG)
        if user_tag is None or client_id is None:
            return None
        quotas = self._quotas[quota_type]
        user = unquote(user_tag)
        if user_tag and client_id:
            levels = precedence_entities(user, client_id)
            candidates: tuple[QuotaEntity, ...] = (levels[0], levels[1], levels[3], levels[4])
        elif user_tag:
            candidates = (QuotaEntity(user, None), QuotaEntity(DEFAULT_ENTITY, None))
        elif client_id:
            candidates = (QuotaEntity(None, client_id), QuotaEntity(None, DEFAULT_ENTITY))
        else:
            return None
        for entity in candidates:
            if entity in quotas:
                return entity
        return None

    # -- what the engine tells it --------------------------------------------------------------

    def update_quota(self, quota_type: QuotaType, entity: QuotaEntity, value: float) -> None:
        # Kafka 4.1+ (KAFKA-19282, ClientQuotaManager.updateQuotaTypes): each kind counts its
        # entities with a quota, and a kind is on while its count is positive.
        quotas = self._quotas[quota_type]
        if entity not in quotas:
            kind = entity_kind(entity)
            counts = self._kind_counts[quota_type]
            counts[kind] = counts.get(kind, 0) + 1
            self._kinds[quota_type] |= kind
        quotas[entity] = value

    def remove_quota(self, quota_type: QuotaType, entity: QuotaEntity) -> None:
        # The last entity of a kind switches it off; with no kind on, nothing is recorded
        # (quotasEnabled() is false). Kafka <= 4.0 left the bit set forever.
        quotas = self._quotas[quota_type]
        if entity in quotas:
            del quotas[entity]
            kind = entity_kind(entity)
            counts = self._kind_counts[quota_type]
            counts[kind] = counts.get(kind, 0) - 1
            if counts[kind] <= 0:
                del counts[kind]
                self._kinds[quota_type] &= ~kind

    def quota_reset_required(self, quota_type: QuotaType) -> bool:
        return False

    def update_cluster_metadata(self, metadata: ClusterMetadata) -> bool:
        return False

    def close(self) -> None:
        pass


def load_callback(spec: str, options: Mapping[str, object]) -> ClientQuotaCallback:
    """Construct the callback class named "package.module:ClassName" with `options` as keywords."""
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise ValueError(f"quota callback {spec!r} must be 'package.module:ClassName'")
    module = importlib.import_module(module_name)
    factory = getattr(module, class_name, None)
    if factory is None:
        raise ValueError(f"quota callback {spec!r}: {module_name} has no {class_name}")
    instance = factory(**options)
    if not isinstance(instance, ClientQuotaCallback):
        raise TypeError(f"quota callback {spec!r} does not implement ClientQuotaCallback")
    return instance
