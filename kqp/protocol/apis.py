"""The catalogue of Kafka APIs, generated from Kafka's own JSON message definitions.

The definitions are Kafka 4.3.1's (kqp/protocol/kafka_message_definitions, copied from the
kafka-clients jar); harness/kafka_codegen.py generates from them the table of APIs
(kqp.protocol.generated), each API's codec (kqp.protocol.generated.messages.<api>) and its
response walks (kqp.protocol.generated.walks.<api>), so version ranges, flexible versions and
field layouts are the brokers', not hand-copied, and nothing is parsed at run time. An API's
modules are imported the first time it is met (`PerApi`): a proxy holds only the APIs its
traffic uses. A key or version missing here is not an error: the proxy forwards what it does
not need to read as opaque bytes. Only the APIs in `DECODED_APIS` must be readable, and only
they are capped in the ApiVersions answer.
"""

from __future__ import annotations

import importlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any, TypeVar

from kqp.protocol.api_keys import ApiKey
from kqp.protocol.errors import UnsupportedApiError
from kqp.protocol.generated import APIS
from kqp.protocol.wire import Message

# The names the protocol code uses; the values are kqp.protocol.api_keys.ApiKey's.
API_VERSIONS_KEY = ApiKey.API_VERSIONS
PRODUCE_KEY = ApiKey.PRODUCE
FETCH_KEY = ApiKey.FETCH
METADATA_KEY = ApiKey.METADATA
FIND_COORDINATOR_KEY = ApiKey.FIND_COORDINATOR
SASL_HANDSHAKE_KEY = ApiKey.SASL_HANDSHAKE
CREATE_TOPICS_KEY = ApiKey.CREATE_TOPICS
DELETE_TOPICS_KEY = ApiKey.DELETE_TOPICS
SASL_AUTHENTICATE_KEY = ApiKey.SASL_AUTHENTICATE
CREATE_PARTITIONS_KEY = ApiKey.CREATE_PARTITIONS
DESCRIBE_CLIENT_QUOTAS_KEY = ApiKey.DESCRIBE_CLIENT_QUOTAS
ALTER_CLIENT_QUOTAS_KEY = ApiKey.ALTER_CLIENT_QUOTAS
DESCRIBE_QUORUM_KEY = ApiKey.DESCRIBE_QUORUM
DESCRIBE_CLUSTER_KEY = ApiKey.DESCRIBE_CLUSTER
SHARE_FETCH_KEY = ApiKey.SHARE_FETCH
SHARE_ACKNOWLEDGE_KEY = ApiKey.SHARE_ACKNOWLEDGE

# What the proxy itself reads or writes: responses with broker addresses, the requests quotas
# act on (byte rates, partition mutations), the quota admin APIs it answers, SASL (for the
# principal) and ApiVersions. Every other API is forwarded without being decoded.
DECODED_APIS = frozenset({
    API_VERSIONS_KEY, PRODUCE_KEY, FETCH_KEY, METADATA_KEY, FIND_COORDINATOR_KEY, DESCRIBE_CLUSTER_KEY,
    DESCRIBE_QUORUM_KEY, SHARE_FETCH_KEY, SHARE_ACKNOWLEDGE_KEY, CREATE_TOPICS_KEY, DELETE_TOPICS_KEY,
    CREATE_PARTITIONS_KEY, DESCRIBE_CLIENT_QUOTAS_KEY, ALTER_CLIENT_QUOTAS_KEY, SASL_HANDSHAKE_KEY,
    SASL_AUTHENTICATE_KEY,
})


def _generated(package: str, api_key: int) -> ModuleType:
    return importlib.import_module(f"kqp.protocol.generated.{package}.{APIS[api_key][1]}")


@cache
def message_class(api_key: int, is_request: bool) -> type[Message]:
    """The generated codec class of an API's request or response (imports its module)."""
    module = _generated("messages", api_key)
    cls: type[Message] = module.REQUEST if is_request else module.RESPONSE
    return cls


V = TypeVar("V")


class PerApi(dict[int, V]):
    """API key -> one table of that API's generated walks module, imported the first time the
    key is looked up with `[]` (`get` does not load). A key the definitions do not know gives
    an empty table, not kept: clients may send any key."""

    __slots__ = ("_read", "_unknown")

    def __init__(self, read: Callable[[ModuleType], V], unknown: V) -> None:
        super().__init__()
        self._read = read
        self._unknown = unknown

    def __missing__(self, api_key: int) -> V:
        if api_key not in APIS:
            return self._unknown
        table = self[api_key] = self._read(_generated("walks", api_key))
        return table


# API key -> response version -> where ThrottleTimeMs is: an offset from the start of the body,
# a skipper (buffer, body offset) -> offset, or None when the version has none.
THROTTLE_TIME_MS: PerApi[dict[int, Any]] = PerApi(lambda walks: walks.THROTTLE_TIME_MS, {})
# API key -> field (harness/kafka_codegen.py's LOCATED_FIELDS) -> response version -> as above.
FIELD_LOCATIONS: PerApi[dict[str, dict[int, Any]]] = PerApi(lambda walks: walks.FIELD_LOCATIONS, {})
# API key -> response version -> collector (buffer, offset, found) -> offset after the body of
# every non-zero ErrorCode, or the body's size when it has no codes.
ERROR_CODES: PerApi[dict[int, Any]] = PerApi(lambda walks: walks.ERROR_CODES, {})


@dataclass(frozen=True, slots=True)
class ApiSpec:
    """One API as the bundled definitions describe it: the versions a broker of that release
    accepts (validVersions) and the first flexible version (KIP-482: compact strings and
    arrays, tagged fields, request header v2 and response header v1)."""

    key: int
    name: str
    min_version: int
    max_version: int
    first_flexible: int | None

    def is_flexible(self, version: int) -> bool:
        return self.first_flexible is not None and version >= self.first_flexible

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def response_header_version(self, version: int) -> int:
        """0 (correlation id only) or 1 (with a tagged-field section) for this version."""
        # ApiVersionsResponse keeps header v0 in every version so that a client can always
        # read the error of a version it does not support.
        if self.key == API_VERSIONS_KEY:
            return 0
        return 1 if self.is_flexible(version) else 0

    @property
    def request_class(self) -> Any:
        return message_class(self.key, True)

    @property
    def response_class(self) -> Any:
        return message_class(self.key, False)


# Removed APIs (LeaderAndIsr, ...) keep a stub definition without versions; the generator leaves them out.
API_SPECS: dict[int, ApiSpec] = {
    key: ApiSpec(key=key, name=name, min_version=low, max_version=high, first_flexible=flexible)
    for key, (name, _module, low, high, flexible) in APIS.items()
}


def supported_spec(api_key: int, api_version: int) -> ApiSpec:
    """The definition of an API whose version the definitions describe (raises UnsupportedApiError)."""
    spec = API_SPECS.get(api_key)
    if spec is None:
        raise UnsupportedApiError(f"unknown API key {api_key}")
    if not spec.supports(api_version):
        raise UnsupportedApiError(
            f"{spec.name} v{api_version} is outside the known range {spec.min_version}-{spec.max_version}")
    return spec


def can_decode(api_key: int, api_version: int) -> bool:
    spec = API_SPECS.get(api_key)
    return spec is not None and spec.supports(api_version)


def api_name(api_key: int) -> str:
    spec = API_SPECS.get(api_key)
    return spec.name if spec is not None else f"Unknown{api_key}"


# Kafka's Errors.UNSUPPORTED_VERSION.
UNSUPPORTED_VERSION = 35
_INT16 = struct.Struct(">h")


def response_layout_version(api_key: int, api_version: int, buf: bytes | bytearray | memoryview,
                            body_offset: int) -> int:
    """The version whose layout a response body has: a broker that does not support the
    requested ApiVersions version answers UNSUPPORTED_VERSION with a v0 body."""
    if (
        api_key == API_VERSIONS_KEY
        and len(buf) >= body_offset + 2
        and _INT16.unpack_from(buf, body_offset)[0] == UNSUPPORTED_VERSION
    ):
        return 0
    return api_version
