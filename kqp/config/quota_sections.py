"""The quota sections of the configuration: `quotas` (Kafka's entities, entries and IP entries,
the KIP-257 callback) and the opt-in cluster `guard`. Kept apart from the proxy's own sections
(kqp.config.models) as the quota model is kept apart from the proxy: they are what `kqp replay`
and `kqp check-config` read of a file, whatever the listeners say.

Quota entries use Kafka's own entity and config names and accept exactly the values Kafka's
AlterClientQuotas accepts (kafka-quota-spec.md section 8.3).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from kqp.config.capacity_file import load_capacity
from kqp.config.section import (
    DoubleQuota,
    EntityName,
    IntQuota,
    LongQuota,
    NonEmptyText,
    PositiveSeconds,
    Scope,
    Section,
    nested_error,
)
from kqp.quotas.capacity import DEFAULT_NETWORK_THRESHOLD, NW_IN, NW_OUT, CapacityFile, CapacityFileError
from kqp.quotas.guard_inputs import GuardSettings
from kqp.quotas.settings import (
    DEFAULT_ENTITY,
    QUOTA_TYPES,
    IpQuotaEntry,
    QuotaEntity,
    QuotaEntry,
    QuotaType,
    entity_text,
)


class EntitySection(Section):
    """Kafka's (user, client-id) entity; a missing key is an absent part, "<default>" the default."""

    user: EntityName | None = None
    client_id: EntityName | None = Field(default=None, alias="client-id")

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        # Kafka's wire format spells the default entity as null; here it must be explicit.
        if isinstance(data, dict):
            for key, value in data.items():
                if value is None:
                    raise nested_error(
                        "null_entity_name",
                        'null is ambiguous here: write "<default>" for the default entity, or leave the key out',
                        (key,),
                    )
        return data

    @model_validator(mode="after")
    def _not_empty(self) -> EntitySection:
        if self.user is None and self.client_id is None:
            raise ValueError("an entity needs at least one of the keys user, client-id")
        return self

    def to_entity(self) -> QuotaEntity:
        return QuotaEntity(user=self.user, client_id=self.client_id)

    def describe(self) -> str:
        return entity_text(self.to_entity())


class QuotaEntrySection(Section):
    entity: EntitySection
    producer_byte_rate: LongQuota | None = None  # bytes/s
    consumer_byte_rate: LongQuota | None = None  # bytes/s
    request_percentage: DoubleQuota | None = None  # percent of one broker thread's time
    controller_mutation_rate: DoubleQuota | None = None  # partitions/s
    dry_run: bool = False
    scope: Scope | None = None
    # Who last wrote the entry, when the proxy did (AlterClientQuotas, the fleet's quota
    # topic): `kqp check-config` shows it. Not part of the quota.
    origin: NonEmptyText | None = None

    @model_validator(mode="after")
    def _sets_a_quota(self) -> QuotaEntrySection:
        if not self.limits():
            raise ValueError(f"the entry sets no quota: expected at least one of {', '.join(QUOTA_TYPES)}")
        return self

    def limits(self) -> dict[QuotaType, float]:
        values: dict[QuotaType, float] = {}
        for quota_type in QUOTA_TYPES:
            value = getattr(self, quota_type)
            if value is not None:
                values[quota_type] = float(value)
        return values

    def to_entry(self) -> QuotaEntry:
        return QuotaEntry(self.entity.to_entity(), self.limits(), dry_run=self.dry_run, scope=self.scope)


class IpQuotaEntrySection(Section):
    # An IP address, or "<default>" for every address without its own entry (KIP-612).
    ip: str
    connection_creation_rate: IntQuota  # connections/s

    @field_validator("ip")
    @classmethod
    def _ip_address(cls, value: str) -> str:
        if value == DEFAULT_ENTITY:
            return value
        try:
            # Normalised so that "::1" and "0::1" are the same entity.
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError(f'expected an IP address or "{DEFAULT_ENTITY}", got {value!r}') from None

    def to_entry(self) -> IpQuotaEntry:
        return IpQuotaEntry(self.ip, float(self.connection_creation_rate))


_CALLBACK_CLASS = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


class CallbackSection(Section):
    """KIP-257: a ClientQuotaCallback class and the options it is configured with."""

    class_: str = Field(alias="class")
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("class_")
    @classmethod
    def _class_path(cls, value: str) -> str:
        if not _CALLBACK_CLASS.match(value):
            raise ValueError(f'expected "package.module:ClassName", got {value!r}')
        return value


class QuotasSection(Section):
    scope: Scope = "broker"
    dry_run: bool = False
    window_num: Annotated[int, Field(ge=1)] = 11  # quota.window.num
    window_size_seconds: Annotated[int, Field(ge=1)] = 1  # quota.window.size.seconds
    controller_window_num: Annotated[int, Field(ge=1)] = 11
    controller_window_size_seconds: Annotated[int, Field(ge=1)] = 1
    sensor_expiry_seconds: PositiveSeconds = 3600.0
    # Whether a write-back (AlterClientQuotas, the fleet's quota topic) stamps the entries it
    # changes with an `origin` (who, from where, when; kqp check-config shows it). False: the
    # file changes in the altered values alone.
    stamp_origin: bool = True
    callback: CallbackSection | None = None
    entries: tuple[QuotaEntrySection, ...] = ()
    ip_entries: tuple[IpQuotaEntrySection, ...] = ()

    @field_validator("entries")
    @classmethod
    def _unique_entities(cls, entries: tuple[QuotaEntrySection, ...]) -> tuple[QuotaEntrySection, ...]:
        first_at: dict[tuple[str | None, str | None], int] = {}
        for index, entry in enumerate(entries):
            key = (entry.entity.user, entry.entity.client_id)
            if key in first_at:
                raise nested_error(
                    "duplicate_entity",
                    "duplicate entity ({entity}): already defined at quotas.entries[{first}]",
                    (index, "entity"), entity=entry.entity.describe(), first=first_at[key],
                )
            first_at[key] = index
        return entries

    @field_validator("ip_entries")
    @classmethod
    def _unique_ips(cls, entries: tuple[IpQuotaEntrySection, ...]) -> tuple[IpQuotaEntrySection, ...]:
        first_at: dict[str, int] = {}
        for index, entry in enumerate(entries):
            if entry.ip in first_at:
                raise nested_error(
                    "duplicate_entity",
                    "duplicate ip {ip}: already defined at quotas.ip_entries[{first}]",
                    (index, "ip"), ip=entry.ip, first=first_at[entry.ip],
                )
            first_at[entry.ip] = index
        return entries


Granularity = Literal["client-id", "user", "user,client-id"]
# The entity keys each granularity of the guard names, as the quota entries spell them.
_GRANULARITY_KEYS: dict[str, tuple[str, ...]] = {
    "client-id": ("client-id",),
    "user": ("user",),
    "user,client-id": ("user", "client-id"),
}
Threshold = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]


class GuardWeightSection(Section):
    entity: EntitySection
    weight: Annotated[float, Field(gt=0, allow_inf_nan=False)]


class GuardSection(Section):
    """Opt-in, beyond Kafka: the cluster guard (docs/quotas.md, "The cluster guard").

    While a broker's modelled NW_IN or NW_OUT is over capacity x threshold, every entity (at
    `granularity`) gets its max-min fair share of the limit as a guard limit, and its effective
    quota is the lower of its configured quota and its guard limit.
    """

    enabled: bool = False
    # Cruise Control's capacity.json, as `kqp replay analyze --capacity` reads it; relative to the
    # proxy's working directory. Read when the configuration is loaded (at start and at every
    # reload), never by the running guard: see `_capacity`.
    capacity_file: NonEmptyText | None = None
    # The share of a broker's declared capacity it may carry: Cruise Control's
    # network.{inbound,outbound}.capacity.threshold, with analyze's names and defaults.
    nw_in_threshold: Threshold = DEFAULT_NETWORK_THRESHOLD
    nw_out_threshold: Threshold = DEFAULT_NETWORK_THRESHOLD
    granularity: Granularity = "client-id"
    weights: tuple[GuardWeightSection, ...] = ()
    protected: tuple[EntitySection, ...] = ()
    # No guard limit below this many bytes/s; an entity whose rate is under it is never limited.
    floor: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    # Models follower traffic as analyze does (capped at the broker count).
    replication_factor: Annotated[int, Field(ge=1)] = 3
    interval_seconds: Annotated[float, Field(ge=0.1, le=60.0, allow_inf_nan=False)] = 1.0
    # A resource releases once its load is at or under limit x (1 - release_margin).
    release_margin: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)] = 0.1
    # A guard limit rises by at most this share of itself per second.
    raise_per_second: Annotated[float, Field(gt=0, le=10, allow_inf_nan=False)] = 0.05
    # Compute, log and report the guard limits; throttle nothing for them.
    dry_run: bool = False
    # Share the guard's measurements over the fleet exchange (the `fleet` section's usage topic):
    # every instance's guard measures the fleet's load per broker and entity, and so computes
    # the same limits. Every instance of the fleet needs the same `guard` section.
    fleet_wide: bool = False
    # The capacity file as read when this section was validated: the guard's loop computes its
    # limits from it, so the event loop never reads a file at a control step.
    _capacity: CapacityFile | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _capacity_and_entities(self) -> GuardSection:
        if self.enabled:
            if self.capacity_file is None:
                raise nested_error("missing_capacity_file", "the guard needs capacity_file (Cruise Control's "
                                   "capacity.json) when enabled", ("capacity_file",))
            try:
                self._capacity = load_capacity(self.capacity_file)
            except OSError as error:
                raise nested_error("capacity_file", "cannot read {path}: {reason}", ("capacity_file",),
                                   path=self.capacity_file, reason=error.strerror or str(error)) from error
            except (CapacityFileError, ValueError) as error:
                raise nested_error("capacity_file", "{path} is not a Cruise Control capacity file: {reason}",
                                   ("capacity_file",), path=self.capacity_file, reason=str(error)) from error
        keys = _GRANULARITY_KEYS[self.granularity]
        named: list[tuple[tuple[str | int, ...], EntitySection]] = [
            (("weights", index, "entity"), w.entity) for index, w in enumerate(self.weights)
        ]
        named += [(("protected", index), entity) for index, entity in enumerate(self.protected)]
        for path, entity in named:
            given = tuple(key for key, value in (("user", entity.user), ("client-id", entity.client_id))
                          if value is not None)
            if given != keys:
                raise nested_error(
                    "guard_entity", "the guard's entities are {granularity} (its granularity): expected the "
                    "key(s) {keys}, got {given}", path, granularity=self.granularity, keys=", ".join(keys),
                    given=", ".join(given),
                )
        return self

    def weight_of(self) -> dict[QuotaEntity, float]:
        return {w.entity.to_entity(): w.weight for w in self.weights}

    def protected_entities(self) -> frozenset[QuotaEntity]:
        return frozenset(entity.to_entity() for entity in self.protected)

    def limits(self, brokers: Sequence[int]) -> dict[tuple[int, str], float]:
        """capacity x threshold per (broker, NW_IN | NW_OUT), bytes/s, for the brokers the proxy
        knows; a broker the capacity file has no entry (nor -1 default) for is left unguarded.
        From the file as read at validation: a section that is off read none and guards nothing."""
        capacity = self._capacity
        if capacity is None:
            return {}
        thresholds = {NW_IN: self.nw_in_threshold, NW_OUT: self.nw_out_threshold}
        limits = {}
        for broker in brokers:
            try:
                declared = capacity.for_broker(broker)
            except CapacityFileError:
                continue
            for resource, threshold in thresholds.items():
                limits[(broker, resource)] = declared.network_bytes_per_s(resource) * threshold
        return limits

    def settings(self, brokers: Sequence[int]) -> GuardSettings:
        """The pure control step's settings for these brokers (from the capacity file as loaded)."""
        return GuardSettings(
            limits=self.limits(brokers),
            replication_factor=self.replication_factor,
            weights=self.weight_of(),
            protected=self.protected_entities(),
            floor=self.floor,
            release_margin=self.release_margin,
            raise_per_s=self.raise_per_second,
        )
