"""PROXY protocol headers as balancers send them (HAProxy's specification), for tests."""

from __future__ import annotations

import ipaddress
import struct

from kqp.protocol.proxy_header import V2_SIGNATURE

LOCAL, PROXY = 0x0, 0x1
UNSPEC, INET, INET6, UNIX = 0x0, 0x1, 0x2, 0x3
STREAM, DGRAM = 0x1, 0x2


def v1(source: str, destination: str, source_port: int, destination_port: int) -> bytes:
    family = "TCP6" if ":" in source else "TCP4"
    return f"PROXY {family} {source} {destination} {source_port} {destination_port}\r\n".encode()


def tlv(kind: int, value: bytes) -> bytes:
    return struct.pack(">BH", kind, len(value)) + value


def v2(source: tuple[str, int] | None = None, destination: tuple[str, int] | None = None, *,
       command: int = PROXY, family: int | None = None, transport: int = STREAM, tlvs: bytes = b"",
       unix_paths: tuple[bytes, bytes] = (b"/run/client.sock", b"/run/kqp.sock")) -> bytes:
    """A v2 header; `source` None with the default family is UNSPEC (no addresses)."""
    if family is None:
        family = UNSPEC if source is None else INET6 if ":" in source[0] else INET
    if destination is None:
        destination = ("2001:db8::1", 9092) if family == INET6 else ("10.0.0.1", 9092)
    if family in (INET, INET6):
        assert source is not None
        block = (ipaddress.ip_address(source[0]).packed + ipaddress.ip_address(destination[0]).packed
                 + struct.pack(">HH", source[1], destination[1]))
    elif family == UNIX:
        block = unix_paths[0].ljust(108, b"\0") + unix_paths[1].ljust(108, b"\0")
    else:
        block = b""
    block += tlvs
    return V2_SIGNATURE + bytes([0x20 | command, family << 4 | transport]) + struct.pack(">H", len(block)) + block
