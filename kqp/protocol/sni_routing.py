"""SNI routing: one TLS port for the bootstrap and every broker, told apart by the server name
(TLS SNI, RFC 6066) the client sends.

A client connects to the host name it was given (the bootstrap name) or was told in a
Metadata answer (a broker's name, made from a pattern with the node id in it), and sends that
name in its ClientHello; the proxy reads it back to know which broker the connection is for.
The pattern's placeholder is Kroxylicious' `$(nodeId)`, so operators moving between the two
write the same thing.

Names are compared case-insensitively (DNS names are) and must be names a client really
sends: Java sends no SNI for a name without a dot or for an IP address, so neither is
accepted as a configured name.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from functools import lru_cache

NODE_ID_PLACEHOLDER = "$(nodeId)"
# What `route` returns for the bootstrap name (the id of the bootstrap listener).
BOOTSTRAP_ROUTE = -1
_MAX_NAME_LENGTH = 253
_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
# Node ids as the broker writes them: no sign, no leading zero, so each node has one name.
_NODE_ID = r"(0|[1-9][0-9]{0,9})"


class SniNameError(ValueError):
    """A configured name or pattern that no client could send as its SNI name."""


def check_host_name(name: str, what: str = "name") -> str:
    """`name` lower-cased, if a client would send it as an SNI host name; else SniNameError."""
    lowered = name.lower()
    if len(lowered) > _MAX_NAME_LENGTH:
        raise SniNameError(f"{what} {name!r} is longer than {_MAX_NAME_LENGTH} characters")
    try:
        ipaddress.ip_address(lowered)
    except ValueError:
        pass
    else:
        raise SniNameError(f"{what} {name!r} is an IP address; clients send no SNI name for one")
    labels = lowered.split(".")
    if len(labels) < 2:
        raise SniNameError(f"{what} {name!r} has no dot; Java clients send no SNI name for such a host")
    for label in labels:
        if not _LABEL.fullmatch(label):
            raise SniNameError(f"{what} {name!r}: {label!r} is not a DNS label (letters, digits and inner "
                               f"hyphens, 1 to 63 of them)")
    return lowered


def check_broker_pattern(pattern: str) -> str:
    """The pattern lower-cased, if it holds the placeholder once and makes valid names."""
    if pattern.count(NODE_ID_PLACEHOLDER) != 1:
        raise SniNameError(f"pattern {pattern!r} must contain {NODE_ID_PLACEHOLDER} exactly once")
    prefix, suffix = pattern.split(NODE_ID_PLACEHOLDER)
    # The longest node id a broker can have, so every name the pattern makes is valid.
    check_host_name(f"{prefix}2147483647{suffix}", f"pattern {pattern!r} makes names like")
    return prefix.lower() + NODE_ID_PLACEHOLDER + suffix.lower()


@lru_cache(maxsize=8)
def _pattern_regex(pattern: str) -> re.Pattern[str]:
    prefix, suffix = pattern.split(NODE_ID_PLACEHOLDER)
    return re.compile(re.escape(prefix) + _NODE_ID + re.escape(suffix))


@dataclass(frozen=True, slots=True)
class SniRoutes:
    """The bootstrap name and the brokers' name pattern of an SNI-routed listener."""

    bootstrap_host: str  # e.g. bootstrap.kafka.example.com
    broker_host_pattern: str  # e.g. broker-$(nodeId).kafka.example.com
    # The port put in rewritten addresses; None: the port the proxy listens on.
    advertised_port: int | None

    def __post_init__(self) -> None:
        bootstrap = check_host_name(self.bootstrap_host, "bootstrap name")
        pattern = check_broker_pattern(self.broker_host_pattern)
        if _pattern_regex(pattern).fullmatch(bootstrap):
            raise SniNameError(f"bootstrap name {self.bootstrap_host!r} is also a broker name of the pattern "
                               f"{self.broker_host_pattern!r}: a client asking for it could not be routed")
        object.__setattr__(self, "bootstrap_host", bootstrap)
        object.__setattr__(self, "broker_host_pattern", pattern)

    def broker_host(self, node_id: int) -> str:
        """The name clients are told for broker `node_id`."""
        return self.broker_host_pattern.replace(NODE_ID_PLACEHOLDER, str(node_id))

    def route(self, server_name: str | None) -> int | None:
        """BOOTSTRAP_ROUTE, the node id the name is for, or None (no name, or not one of ours)."""
        if server_name is None:
            return None
        name = server_name.lower()
        if name == self.bootstrap_host:
            return BOOTSTRAP_ROUTE
        match = _pattern_regex(self.broker_host_pattern).fullmatch(name)
        if match is None:
            return None
        node_id = int(match.group(1))
        return node_id if node_id < 2**31 else None
