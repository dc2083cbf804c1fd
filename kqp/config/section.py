"""What every configuration section is built from: the strict, frozen `Section` base, the
error a validator raises for a nested field, and the value types sections share (ports, host:port,
sizes, names, Kafka's quota value ranges). Split from kqp.config.models, which holds the
sections themselves, so that the quota sections (kqp.config.quota_sections) and the others
build on one base without importing each other.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
)
from pydantic_core import PydanticCustomError

from kqp.quotas.settings import DEFAULT_ENTITY

# Java's Long.MAX_VALUE and Integer.MAX_VALUE: the largest LONG and INT quota values Kafka stores.
LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1
# Kafka accepts a LONG/INT quota whose fractional part is at most this (ClientQuotaControlManager).
_FRACTION_TOLERANCE = 1e-6

Scope = Literal["broker", "cluster"]


# strict: YAML already types its scalars, so a quoted "9192" is an operator's mistake to report,
# not to coerce. frozen: the running config is shared by the loop, the reload and the fleet
# exchange, and a reload swaps a whole new config in rather than editing the old one.
class Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    def given(self) -> dict[str, Any]:
        """The values the file (or the caller) gave, by field name; defaults are left to the
        model, so that a section built from these knows, as this one does, what was set."""
        return {name: getattr(self, name) for name in self.model_fields_set}

    def updated(self, **changes: Any) -> Self:
        """A copy with `changes`, validated as a file's values are (model_copy alone checks
        nothing). For sections without aliased keys (the quota entries have some)."""
        return type(self).model_validate({**self.given(), **changes})


def nested_error(kind: str, message: str, sub_path: tuple[str | int, ...], **context: object) -> PydanticCustomError:
    """An error raised by a section-wide check that belongs to one field inside the section.

    Pydantic places such errors at the section; the loader appends `sub_path` so the
    reported path names the field itself.
    """
    return PydanticCustomError(kind, message, {"sub_path": sub_path, **context})


def _whole_number(value: object) -> object:
    # Kafka stores producer/consumer byte rates as LONG and connection rates as INT, but the
    # wire carries doubles; it accepts 1048576.0 and rejects 1048576.5.
    if isinstance(value, float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError("expected a finite number")
        if abs(value - round(value)) > _FRACTION_TOLERANCE:
            raise ValueError(f"cannot be a fractional value (Kafka stores it as a whole number), got {value}")
        return round(value)
    return value


def _non_empty_name(value: str) -> str:
    """Kafka rejects an empty entity name in AlterClientQuotas; the default entity has its own name."""
    if value == "":
        raise ValueError(f'an empty name is not supported; write "{DEFAULT_ENTITY}" for the default entity')
    return value


def _host_port(value: str) -> str:
    parse_host_port(value)
    return value


def parse_host_port(text: str) -> tuple[str, int]:
    """"host:port" or "[v6-address]:port" -> (host, port)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f'expected "host:port", got {text!r}')
    if host.startswith("["):
        if not host.endswith("]"):
            raise ValueError(f'expected "[ipv6-address]:port", got {text!r}')
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f'write an IPv6 address in brackets, "[{host}]:{port_text}"')
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"expected a port between 1 and 65535 after the colon, got {port_text!r}")
    return host, int(port_text)


# Annotated types carry the rule with the field, so every section that takes a port or a
# duration checks it the same way and the error names the field.
Port = Annotated[int, Field(ge=1, le=65535)]
NodeId = Annotated[int, Field(ge=0)]
PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


def _buffer_size(size: int) -> int:
    # Kafka's socket.*.buffer.bytes: -1 leaves the OS default; 0 is no size (a broker fails on it).
    if size == 0 or size < -1:
        raise ValueError(f"expected a size in bytes >= 1, or -1 for the OS default, got {size}")
    return size


SocketBufferBytes = Annotated[int, AfterValidator(_buffer_size)]
NonEmptyText = Annotated[str, Field(min_length=1)]
HostPort = Annotated[str, AfterValidator(_host_port)]
EntityName = Annotated[str, AfterValidator(_non_empty_name)]
# Quota values as AlterClientQuotas accepts them: > 0, whole numbers for LONG/INT keys.
LongQuota = Annotated[int, BeforeValidator(_whole_number), Field(gt=0, le=LONG_MAX)]
IntQuota = Annotated[int, BeforeValidator(_whole_number), Field(gt=0, le=INT_MAX)]
DoubleQuota = Annotated[float, Field(gt=0, allow_inf_nan=False)]
