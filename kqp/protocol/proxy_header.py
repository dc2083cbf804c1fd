"""The PROXY protocol header a load balancer puts before a client's own bytes (HAProxy's
specification, versions 1 and 2), and which sources may send one.

Behind a balancer every connection comes from the balancer's address; the header carries the
client's. It is read once, before the first Kafka frame or TLS ClientHello, so this module
parses a buffer and says how much of it is the header; the IO layer reads no further than
that, and what follows is the connection's own.

- Version 1 is one line of text, at most 107 bytes with its CRLF:
  `PROXY TCP4 <src> <dst> <srcport> <dstport>\\r\\n`, TCP6 likewise, or `PROXY UNKNOWN...\\r\\n`.
- Version 2 is binary: a 12-byte signature, a version/command byte, a family/transport byte,
  a 16-bit length, then the addresses and TLVs (type-length-value extensions) in that length.

The LOCAL command of version 2 (a balancer's own health check) and version 1's UNKNOWN carry
no client: the connection's own addresses stand, as the specification says. So do the
UNSPEC and UNIX families, which name no IP. TLVs are walked to check they fit, then skipped:
nothing here needs them.
"""

from __future__ import annotations

import enum
import ipaddress
import struct
from dataclasses import dataclass
from typing import Literal

from kqp.protocol.errors import ProtocolError

__all__ = [
    "V1_MAX_BYTES",
    "V2_SIGNATURE",
    "Mode",
    "ProxyHeader",
    "ProxyHeaderError",
    "Refusal",
    "TrustedNetworks",
    "begins_header",
    "read_header",
    "refusal",
]

V1_PREFIX = b"PROXY "
V1_MAX_BYTES = 107  # the specification's worst case: "PROXY UNKNOWN" + two IPv6 addresses and ports + CRLF
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V2_FIXED_BYTES = 16  # signature, version/command, family/transport, length

_V2_LOCAL = 0x0
_V2_PROXY = 0x1
_AF_UNSPEC, _AF_INET, _AF_INET6, _AF_UNIX = 0x0, 0x1, 0x2, 0x3
_TRANSPORT_UNSPEC, _TRANSPORT_STREAM, _TRANSPORT_DGRAM = 0x0, 0x1, 0x2
# Bytes of the address block per family: two addresses then two ports (UNIX: two 108-byte paths).
_ADDRESS_BYTES = {_AF_UNSPEC: 0, _AF_INET: 12, _AF_INET6: 36, _AF_UNIX: 216}
_TLV_HEAD = struct.Struct(">BH")


class ProxyHeaderError(ProtocolError):
    """Bytes that begin like a PROXY header but are not a valid one."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    version: int  # 1 or 2
    length: int  # bytes of the buffer the header takes; the connection's own bytes follow
    # The client's address and port, and the address it connected to (the balancer's front);
    # None when the header names no IP client (LOCAL, UNKNOWN, UNSPEC, UNIX).
    source: tuple[str, int] | None = None
    destination: tuple[str, int] | None = None

    @property
    def names_client(self) -> bool:
        return self.source is not None


def begins_header(data: bytes) -> bool:
    """Whether the first bytes of a connection are the start of a PROXY header.

    One byte decides: `P` starts version 1 and `\\r` version 2, while a Kafka request starts
    with its size (a first byte of 0x0D or 0x50 would announce a frame of over 200 MB, past
    any max_frame_bytes a proxy uses) and a TLS ClientHello with 0x16."""
    return bool(data) and data[:1] in (V1_PREFIX[:1], V2_SIGNATURE[:1])


def read_header(data: bytes) -> ProxyHeader | None:
    """The header at the start of `data`, None while more bytes are needed to complete it.

    Raises ProxyHeaderError as soon as the bytes cannot be a header, so a peer cannot make the
    reader wait for bytes that would not help. `data` may go on past the header."""
    if not data:
        return None
    if data[:1] == V1_PREFIX[:1]:
        return _read_v1(data)
    if data[:1] == V2_SIGNATURE[:1]:
        return _read_v2(data)
    raise ProxyHeaderError(f"not a PROXY header: it starts with {data[:8]!r}")


def _read_v1(data: bytes) -> ProxyHeader | None:
    prefix = data[: len(V1_PREFIX)]
    if prefix != V1_PREFIX[: len(prefix)]:
        raise ProxyHeaderError(f"not a PROXY v1 header: it starts with {data[:8]!r}")
    end = data.find(b"\r\n", 0, V1_MAX_BYTES)
    if end < 0:
        # A lone LF, or a line already too long, will not become a header with more bytes.
        scanned = data[:V1_MAX_BYTES]
        if not _printable(scanned[:-1] if scanned.endswith(b"\r") else scanned):
            raise ProxyHeaderError("PROXY v1 header: not printable ASCII before its CRLF")
        if len(data) >= V1_MAX_BYTES:
            raise ProxyHeaderError(f"PROXY v1 header: no CRLF within {V1_MAX_BYTES} bytes")
        return None
    line = data[len(V1_PREFIX) : end]
    if not _printable(line):
        raise ProxyHeaderError("PROXY v1 header: not printable ASCII before its CRLF")
    fields = line.decode("ascii").split(" ")
    protocol = fields[0]
    length = end + 2
    if protocol == "UNKNOWN":
        # The specification: whatever follows UNKNOWN up to the CRLF is ignored.
        return ProxyHeader(1, length)
    if protocol not in ("TCP4", "TCP6"):
        raise ProxyHeaderError(f"PROXY v1 header: protocol {protocol[:16]!r}, expected TCP4, TCP6 or UNKNOWN")
    if len(fields) != 5:
        raise ProxyHeaderError(f"PROXY v1 header: {protocol} needs source and destination addresses and ports, "
                               f"separated by single spaces")
    kind: type[ipaddress.IPv4Address] | type[ipaddress.IPv6Address] = (
        ipaddress.IPv4Address if protocol == "TCP4" else ipaddress.IPv6Address
    )
    source_ip = _v1_address(kind, fields[1], protocol)
    destination_ip = _v1_address(kind, fields[2], protocol)
    return ProxyHeader(1, length, (source_ip, _v1_port(fields[3])), (destination_ip, _v1_port(fields[4])))


def _printable(text: bytes) -> bool:
    return all(0x20 <= byte <= 0x7E for byte in text)


def _v1_address(kind: type[ipaddress.IPv4Address] | type[ipaddress.IPv6Address], text: str, protocol: str) -> str:
    try:
        return str(kind(text))
    except ValueError:
        raise ProxyHeaderError(f"PROXY v1 header: {text[:46]!r} is not an {protocol[-1]} address "
                               f"for {protocol}") from None


def _v1_port(text: str) -> int:
    # Decimal, 0-65535; the specification's senders write no sign and no leading zero.
    if not text.isdigit() or not text.isascii() or (len(text) > 1 and text[0] == "0") or int(text) > 65535:
        raise ProxyHeaderError(f"PROXY v1 header: port {text[:8]!r} is not a number from 0 to 65535")
    return int(text)


def _read_v2(data: bytes) -> ProxyHeader | None:
    signature = data[: len(V2_SIGNATURE)]
    if signature != V2_SIGNATURE[: len(signature)]:
        raise ProxyHeaderError("not a PROXY v2 header: its signature is wrong")
    if len(data) < V2_FIXED_BYTES:
        return None
    version, command = data[12] >> 4, data[12] & 0x0F
    if version != 2:
        raise ProxyHeaderError(f"PROXY v2 signature with version {version}")
    if command not in (_V2_LOCAL, _V2_PROXY):
        raise ProxyHeaderError(f"PROXY v2 header: command {command:#x}, expected LOCAL (0) or PROXY (1)")
    family, transport = data[13] >> 4, data[13] & 0x0F
    block_bytes = int.from_bytes(data[14:16], "big")
    length = V2_FIXED_BYTES + block_bytes
    if len(data) < length:
        return None
    if command == _V2_LOCAL:
        # A balancer's own connection (a health check): its family and addresses are not the client's.
        return ProxyHeader(2, length)
    if family not in _ADDRESS_BYTES:
        raise ProxyHeaderError(f"PROXY v2 header: address family {family:#x} is not one the specification defines")
    if transport not in (_TRANSPORT_UNSPEC, _TRANSPORT_STREAM, _TRANSPORT_DGRAM):
        raise ProxyHeaderError(f"PROXY v2 header: transport {transport:#x} is not one the specification defines")
    if transport == _TRANSPORT_DGRAM:
        raise ProxyHeaderError("PROXY v2 header: a datagram (UDP) client on a stream listener")
    address_bytes = _ADDRESS_BYTES[family]
    if block_bytes < address_bytes:
        raise ProxyHeaderError(f"PROXY v2 header: {block_bytes} bytes after the fixed header, fewer than the "
                               f"{address_bytes} its address family takes")
    block = data[V2_FIXED_BYTES:length]
    _check_tlvs(block[address_bytes:])
    if family == _AF_INET:
        return ProxyHeader(2, length, (str(ipaddress.IPv4Address(block[0:4])), _port(block, 8)),
                           (str(ipaddress.IPv4Address(block[4:8])), _port(block, 10)))
    if family == _AF_INET6:
        return ProxyHeader(2, length, (str(ipaddress.IPv6Address(block[0:16])), _port(block, 32)),
                           (str(ipaddress.IPv6Address(block[16:32])), _port(block, 34)))
    return ProxyHeader(2, length)  # UNSPEC or UNIX: no IP client


def _port(block: bytes, offset: int) -> int:
    return int.from_bytes(block[offset : offset + 2], "big")


def _check_tlvs(tlvs: bytes) -> None:
    """TLVs are skipped, but each must fit in the header: a length running past its end means
    the sender and this reader disagree about where the client's bytes begin."""
    offset = 0
    while offset < len(tlvs):
        if offset + _TLV_HEAD.size > len(tlvs):
            raise ProxyHeaderError(f"PROXY v2 header: {len(tlvs) - offset} stray bytes after its last TLV")
        _kind, value_bytes = _TLV_HEAD.unpack_from(tlvs, offset)
        offset += _TLV_HEAD.size + value_bytes
        if offset > len(tlvs):
            raise ProxyHeaderError("PROXY v2 header: a TLV runs past the header's length")


class TrustedNetworks:
    """The source networks (the balancers) whose PROXY headers are believed."""

    def __init__(self, cidrs: tuple[str, ...]) -> None:
        self.networks = tuple(ipaddress.ip_network(cidr) for cidr in cidrs)

    def trusts(self, ip: str) -> bool:
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            # A dual-stack listener sees an IPv4 balancer as ::ffff:a.b.c.d.
            address = address.ipv4_mapped
        return any(address in network for network in self.networks)


Mode = Literal["off", "v1", "v2", "auto"]


class Refusal(enum.Enum):
    """Why a connection was refused before it became one; the value is the metric's bounded
    `reason` label (kqp_proxy_protocol_refused_total), the detail goes to the log."""

    UNTRUSTED_SOURCE = "header from untrusted source"
    MISSING = "no header from trusted source"
    WRONG_VERSION = "wrong header version"
    MALFORMED = "malformed header"
    TRUNCATED = "truncated header"  # the peer closed inside its header
    TIMEOUT = "header timeout"  # nothing, or not the whole header, within header_timeout_seconds


def refusal(mode: Mode, trusted: bool, header: ProxyHeader | None) -> tuple[Refusal, str] | None:
    """Whether a connection that began with `header` (None: with no header) may go on, and if
    not, why; `trusted`: it comes from one of the trusted networks."""
    if header is not None:
        if mode == "off" or not trusted:
            return Refusal.UNTRUSTED_SOURCE, ("it sent a PROXY header but does not come from "
                                              "proxy_protocol.trusted_networks: a client may not name its own address")
        if mode in ("v1", "v2") and mode != f"v{header.version}":
            return Refusal.WRONG_VERSION, f"it sent a PROXY v{header.version} header; this listener expects {mode}"
        return None
    if trusted and mode in ("v1", "v2"):
        return Refusal.MISSING, (f"it comes from a trusted network but sent no PROXY header; this listener "
                                 f"requires {mode} from there")
    return None
