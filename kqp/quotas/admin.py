"""DescribeClientQuotas matching and AlterClientQuotas validation, as KRaft does them (KIP-546).

Pure functions over `QuotaSettings`, for answering those two APIs from the proxy's own
configuration: `describe_quotas` mirrors ClientQuotasImage.describe, `validate_alterations`
mirrors ClientQuotaControlManager's checks (same error codes and messages), and
`apply_alterations` returns the settings with the valid alterations applied.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from kqp.quotas.settings import DEFAULT_ENTITY, IpQuotaEntry, QuotaEntity, QuotaEntry, QuotaSettings, QuotaType

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"

MATCH_EXACT = 0
MATCH_DEFAULT = 1
MATCH_SPECIFIED = 2

NONE = 0
UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42

_LONG_KEYS = frozenset({"producer_byte_rate", "consumer_byte_rate"})
_DOUBLE_KEYS = frozenset({"request_percentage", "controller_mutation_rate"})
_IP_KEYS = frozenset({"connection_creation_rate"})  # an INT
_JAVA_LONG_MAX = float(2**63 - 1)
_JAVA_INT_MAX = 2**31 - 1

# An entity as the protocol carries it: entity type -> name, None meaning the default entity.
EntityMap = Mapping[str, str | None]


class QuotaRequestError(Exception):
    """A DescribeClientQuotas request Kafka refuses as a whole (top-level error code)."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message


@dataclass(frozen=True, slots=True)
class FilterComponent:
    entity_type: str
    match_type: int
    match: str | None = None


@dataclass(frozen=True, slots=True)
class DescribedEntity:
    entity: EntityMap
    values: Mapping[str, float]


def configured_entities(settings: QuotaSettings) -> list[DescribedEntity]:
    """Every configured entity with its values, in protocol form (default = None)."""
    described: list[DescribedEntity] = []
    for entry in settings.entries:
        if not entry.limits:
            continue
        entity: dict[str, str | None] = {}
        if entry.entity.user is not None:
            entity[USER] = _protocol_name(entry.entity.user)
        if entry.entity.client_id is not None:
            entity[CLIENT_ID] = _protocol_name(entry.entity.client_id)
        described.append(DescribedEntity(entity, {key: float(value) for key, value in entry.limits.items()}))
    for ip_entry in settings.ip_entries:
        described.append(
            DescribedEntity(
                {IP: _protocol_name(ip_entry.ip)},
                {"connection_creation_rate": float(ip_entry.connection_creation_rate)},
            )
        )
    return described


def _protocol_name(name: str) -> str | None:
    return None if name == DEFAULT_ENTITY else name


def describe_quotas(
    settings: QuotaSettings, components: Sequence[FilterComponent], strict: bool
) -> list[DescribedEntity]:
    """The configured entities matching a DescribeClientQuotas filter.

    Raises QuotaRequestError for a filter Kafka rejects (INVALID_REQUEST or UNSUPPORTED_VERSION).
    """
    exact: dict[str, str | None] = {}
    typed: set[str] = set()
    for component in components:
        entity_type = component.entity_type
        if not entity_type:
            raise QuotaRequestError(INVALID_REQUEST, "Invalid empty entity type.")
        if entity_type in exact or entity_type in typed:
            raise QuotaRequestError(
                INVALID_REQUEST, f"Entity type {entity_type} cannot appear more than once in the filter."
            )
        if entity_type not in (IP, USER, CLIENT_ID):
            raise QuotaRequestError(UNSUPPORTED_VERSION, f"Unsupported entity type {entity_type}")
        if component.match_type == MATCH_EXACT:
            if component.match is None:
                raise QuotaRequestError(
                    INVALID_REQUEST, "Request specified MATCH_TYPE_EXACT, but set match string to null."
                )
            exact[entity_type] = component.match
        elif component.match_type == MATCH_DEFAULT:
            if component.match is not None:
                raise QuotaRequestError(
                    INVALID_REQUEST, "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."
                )
            exact[entity_type] = None
        elif component.match_type == MATCH_SPECIFIED:
            if component.match is not None:
                raise QuotaRequestError(
                    INVALID_REQUEST, "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."
                )
            typed.add(entity_type)
        else:
            raise QuotaRequestError(INVALID_REQUEST, f"Unknown match type {component.match_type}")
    filtered = exact.keys() | typed
    if IP in filtered and (USER in filtered or CLIENT_ID in filtered):
        raise QuotaRequestError(
            INVALID_REQUEST,
            "Invalid entity filter component combination. IP filter component should not be used with "
            "user or clientId filter component.",
        )
    return [d for d in configured_entities(settings) if _matches(d.entity, exact, typed, strict)]


def _matches(entity: EntityMap, exact: Mapping[str, str | None], typed: set[str], strict: bool) -> bool:
    if strict and len(entity) != len(exact) + len(typed):
        return False
    for entity_type, name in exact.items():
        if entity_type not in entity or entity[entity_type] != name:
            return False
    return all(entity_type in entity for entity_type in typed)


@dataclass(frozen=True, slots=True)
class QuotaOp:
    key: str
    value: float = 0.0
    remove: bool = False


@dataclass(frozen=True, slots=True)
class QuotaAlteration:
    # (entity type, name) pairs as sent, so duplicates can be reported; None = default entity.
    entity: Sequence[tuple[str, str | None]]
    ops: Sequence[QuotaOp]


@dataclass(frozen=True, slots=True)
class AlterationResult:
    entity: Sequence[tuple[str, str | None]]
    error_code: int
    error_message: str | None


def validate_alterations(alterations: Sequence[QuotaAlteration]) -> list[AlterationResult]:
    """ClientQuotaControlManager.alterClientQuotas's verdict for each distinct entity."""
    results: dict[frozenset[tuple[str, str | None]], AlterationResult] = {}
    for alteration in alterations:
        key = frozenset(alteration.entity)
        described = _describe_entity(alteration.entity)
        seen_keys: set[str] = set()
        duplicate_key = False
        for op in alteration.ops:
            if op.key in seen_keys:
                duplicate_key = True
            seen_keys.add(op.key)
        if duplicate_key or key in results:
            # Kafka replaces a duplicate-key error by this one too (the entity is already in its results).
            results[key] = AlterationResult(
                alteration.entity, INVALID_REQUEST, f"Ignoring duplicate entity {described}"
            )
            continue
        message = _entity_error(alteration.entity) or _ops_error(alteration)
        results[key] = AlterationResult(alteration.entity, INVALID_REQUEST if message else NONE, message)
    return list(results.values())


def _describe_entity(entity: Sequence[tuple[str, str | None]]) -> str:
    return "ClientQuotaEntity(entries={" + ", ".join(f"{t}={n}" for t, n in entity) + "})"


def _entity_error(entity: Sequence[tuple[str, str | None]]) -> str | None:
    if not entity:
        return "Invalid empty client quota entity"
    types: set[str] = set()
    for entity_type, name in entity:
        if entity_type in types:
            return f"Invalid client quota entity, duplicate entity entry {entity_type}"
        if entity_type not in (USER, CLIENT_ID, IP):
            return f"Unhandled client quota entity type: {entity_type}"
        types.add(entity_type)
        if name is not None and not name:
            return f"Empty {entity_type} not supported"
    if IP in types:
        if USER in types or CLIENT_ID in types:
            # Kafka's message, missing space included.
            return "Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId"
        ip = dict(entity)[IP]
        if ip is not None and not _is_ip_literal(ip):
            return f"{ip} is not a valid IP or resolvable host."
    return None


def _is_ip_literal(text: str) -> bool:
    # Kafka also accepts host names it can resolve; a pure library cannot resolve, so only
    # literal addresses pass.
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _ops_error(alteration: QuotaAlteration) -> str | None:
    is_ip = any(entity_type == IP for entity_type, _ in alteration.entity)
    valid_keys = _IP_KEYS if is_ip else _LONG_KEYS | _DOUBLE_KEYS
    for op in alteration.ops:
        if op.remove:
            continue
        key, value = op.key, op.value
        if key not in valid_keys:
            return f"Invalid configuration key {key}"
        if value <= 0.0:
            return f"Quota {key} must be greater than 0"
        if key in _DOUBLE_KEYS:
            continue
        if key in _LONG_KEYS and value > _JAVA_LONG_MAX:
            return f"Proposed value for {key} is too large for a LONG."
        if key in _IP_KEYS and value > _JAVA_INT_MAX:
            return f"Proposed value for {key} is too large for an INT."
        if abs(math.fmod(value, 1.0)) > 1e-6:
            return f"{key} cannot be a fractional value."
    return None


def apply_alterations(settings: QuotaSettings, alterations: Sequence[QuotaAlteration]) -> QuotaSettings:
    """The settings after the alterations that validate (the others are left out)."""
    valid = {frozenset(r.entity) for r in validate_alterations(alterations) if r.error_code == NONE}
    entries: dict[QuotaEntity, QuotaEntry] = {entry.entity: entry for entry in settings.entries}
    ip_rates: dict[str, float] = {e.ip: e.connection_creation_rate for e in settings.ip_entries}
    for alteration in alterations:
        if frozenset(alteration.entity) not in valid:
            continue
        names = {t: (DEFAULT_ENTITY if n is None else n) for t, n in alteration.entity}
        if IP in names:
            for op in alteration.ops:
                if op.remove:
                    ip_rates.pop(names[IP], None)
                else:
                    ip_rates[names[IP]] = op.value
            continue
        entity = QuotaEntity(names.get(USER), names.get(CLIENT_ID))
        current = entries.get(entity, QuotaEntry(entity, {}))
        limits: dict[QuotaType, float] = dict(current.limits)
        for op in alteration.ops:
            quota_key: QuotaType = op.key  # type: ignore[assignment]  # validated above
            if op.remove:
                limits.pop(quota_key, None)
            else:
                limits[quota_key] = op.value
        if limits or current.dry_run or current.scope is not None:
            entries[entity] = replace(current, limits=limits)
        else:
            entries.pop(entity, None)
    return replace(
        settings,
        entries=tuple(entries.values()),
        ip_entries=tuple(IpQuotaEntry(ip, rate) for ip, rate in ip_rates.items()),
    )
