"""The PROXY protocol header (HAProxy's specification, v1 and v2): every form a balancer sends,
each address family, TLVs skipped, and the truncated and malformed inputs that must fail
cleanly; then who may send one, per mode."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kqp.protocol.proxy_header import (
    V1_MAX_BYTES,
    ProxyHeader,
    ProxyHeaderError,
    Refusal,
    TrustedNetworks,
    begins_header,
    read_header,
    refusal,
)
from tests.unit.helpers.proxy_header import DGRAM, INET, INET6, LOCAL, UNIX, UNSPEC, tlv, v1, v2

KAFKA_REQUEST = b"\x00\x00\x00\x1e\x00\x12\x00\x03"  # the start of an ApiVersions request
TLS_CLIENT_HELLO = bytes.fromhex("16030100f5010000f10303")


# ---- version 1 ------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "source", "destination"), [
    (b"PROXY TCP4 192.0.2.7 10.0.0.1 56324 9092\r\n", ("192.0.2.7", 56324), ("10.0.0.1", 9092)),
    (b"PROXY TCP6 2001:db8::7 2001:db8::1 0 65535\r\n", ("2001:db8::7", 0), ("2001:db8::1", 65535)),
    # Written out in full, read in the form the socket layer prints (so per-IP counts agree).
    (b"PROXY TCP6 2001:0db8:0000:0000:0000:0000:0000:0007 ::1 1 2\r\n", ("2001:db8::7", 1), ("::1", 2)),
])
def test_v1_names_the_client(line: bytes, source: tuple[str, int], destination: tuple[str, int]) -> None:
    header = read_header(line + KAFKA_REQUEST)
    assert header == ProxyHeader(1, len(line), source, destination)
    assert header.names_client


@pytest.mark.parametrize("line", [
    b"PROXY UNKNOWN\r\n",
    # The specification: anything after UNKNOWN up to the CRLF is ignored.
    b"PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n",
])
def test_v1_unknown_keeps_the_connections_own_address(line: bytes) -> None:
    header = read_header(line + TLS_CLIENT_HELLO)
    assert header == ProxyHeader(1, len(line))
    assert not header.names_client


def test_v1_longest_header_is_accepted() -> None:
    line = b"PROXY UNKNOWN " + b"x" * (V1_MAX_BYTES - len(b"PROXY UNKNOWN \r\n")) + b"\r\n"
    assert len(line) == V1_MAX_BYTES
    assert read_header(line) == ProxyHeader(1, V1_MAX_BYTES)


def test_v1_asks_for_more_until_its_crlf() -> None:
    line = v1("192.0.2.7", "10.0.0.1", 56324, 9092)
    for cut in range(1, len(line)):
        assert read_header(line[:cut]) is None, cut
    assert read_header(line) is not None


@pytest.mark.parametrize(("data", "says"), [
    (b"PROXY TCP4 192.0.2.7 10.0.0.1 56324\r\n", "needs source and destination"),
    (b"PROXY TCP4 192.0.2.7  10.0.0.1 56324 9092\r\n", "single spaces"),
    (b"PROXY TCP4 192.0.2.7 10.0.0.1 56324 9092 extra\r\n", "needs source and destination"),
    (b"PROXY TCP4 2001:db8::7 10.0.0.1 56324 9092\r\n", "not an 4 address"),
    (b"PROXY TCP6 192.0.2.7 2001:db8::1 56324 9092\r\n", "not an 6 address"),
    (b"PROXY TCP4 192.0.2.256 10.0.0.1 56324 9092\r\n", "not an 4 address"),
    (b"PROXY TCP4 192.0.2.07 10.0.0.1 56324 9092\r\n", "not an 4 address"),
    (b"PROXY TCP4 192.0.2.7 10.0.0.1 65536 9092\r\n", "port '65536'"),
    (b"PROXY TCP4 192.0.2.7 10.0.0.1 -1 9092\r\n", "port '-1'"),
    (b"PROXY TCP4 192.0.2.7 10.0.0.1 056324 9092\r\n", "port '056324'"),
    (b"PROXY TCP4 192.0.2.7 10.0.0.1 5632\xd9 9092\r\n", "not printable"),
    (b"PROXY UDP4 192.0.2.7 10.0.0.1 56324 9092\r\n", "protocol 'UDP4'"),
    (b"PROXY \r\n", "protocol ''"),
    (b"PROXY TCP4 192.0.2.7\n", "not printable"),  # a line feed without its carriage return
    (b"PROXY TCP4 192.0.2.7\x00", "not printable"),
    (b"PROXY TCP4 192.0.2.7\rx", "not printable"),
    (b"PROXY UNKNOWN " + b"x" * V1_MAX_BYTES, "no CRLF within 107 bytes"),
    (b"PROXY UNKNOWN " + b"x" * (V1_MAX_BYTES - len(b"PROXY UNKNOWN \r")) + b"\r\n", "no CRLF within 107"),
    (b"PROXI TCP4", "not a PROXY v1 header"),
    (b"PRO\x00", "not a PROXY v1 header"),
])
def test_v1_malformed_is_refused(data: bytes, says: str) -> None:
    with pytest.raises(ProxyHeaderError, match=says.replace("(", r"\(")):
        read_header(data)


# ---- version 2 ------------------------------------------------------------------------------


@pytest.mark.parametrize(("header", "source", "destination"), [
    (v2(("192.0.2.7", 56324), ("10.0.0.1", 9092)), ("192.0.2.7", 56324), ("10.0.0.1", 9092)),
    (v2(("2001:db8::7", 1), ("2001:db8::1", 65535)), ("2001:db8::7", 1), ("2001:db8::1", 65535)),
    # The transport may be left unspecified.
    (v2(("192.0.2.7", 1), transport=0), ("192.0.2.7", 1), ("10.0.0.1", 9092)),
])
def test_v2_names_the_client(header: bytes, source: tuple[str, int], destination: tuple[str, int]) -> None:
    assert read_header(header + KAFKA_REQUEST) == ProxyHeader(2, len(header), source, destination)


@pytest.mark.parametrize("tlvs", [
    tlv(0x01, b"kafka"),  # ALPN
    tlv(0x02, b"broker-1.example.com") + tlv(0x05, b"\x01\x02\x03"),  # AUTHORITY, UNIQUE_ID
    tlv(0xEA, b"vpce-0123456789abcdef0"),  # AWS NLB's VPC endpoint id (a custom type)
    tlv(0x20, b"\x07" + b"\0\0\0\0" + tlv(0x21, b"TLSv1.3")),  # SSL, with a sub-TLV
    tlv(0x04, b"\0" * 300),  # NOOP padding, longer than one peek
    tlv(0x03, b"\0\0\0\0") + tlv(0x00, b""),  # CRC32C (not checked) and an empty TLV
])
def test_v2_tlvs_are_skipped(tlvs: bytes) -> None:
    header = v2(("192.0.2.7", 56324), tlvs=tlvs)
    assert read_header(header + TLS_CLIENT_HELLO) == ProxyHeader(2, len(header), ("192.0.2.7", 56324),
                                                                  ("10.0.0.1", 9092))


@pytest.mark.parametrize("header", [
    v2(command=LOCAL),  # HAProxy's health check: no addresses at all
    v2(("192.0.2.7", 1), command=LOCAL),  # addresses given, but they are the balancer's own
    v2(("192.0.2.7", 1), command=LOCAL, family=0x7),  # LOCAL ignores the family byte
    v2(family=UNSPEC),  # PROXY with UNSPEC: the connection's own addresses stand
    v2(family=UNIX),  # a client on a UNIX socket has no IP
    v2(family=UNIX, tlvs=tlv(0x01, b"kafka")),
])
def test_v2_without_an_ip_client(header: bytes) -> None:
    read = read_header(header + KAFKA_REQUEST)
    assert read == ProxyHeader(2, len(header))
    assert not read.names_client


def test_v2_asks_for_more_until_its_length_is_in() -> None:
    header = v2(("2001:db8::7", 1), tlvs=tlv(0x01, b"kafka"))
    for cut in range(1, len(header)):
        assert read_header(header[:cut]) is None, cut
    assert read_header(header) is not None


def _with_byte(header: bytes, index: int, value: int) -> bytes:
    return header[:index] + bytes([value]) + header[index + 1 :]


def _with_length(header: bytes, length: int) -> bytes:
    return header[:14] + length.to_bytes(2, "big") + header[16:]


IPV4 = v2(("192.0.2.7", 56324))


@pytest.mark.parametrize(("data", "says"), [
    (b"\r\n\r\n\x00\r\nQUIT\r", "signature is wrong"),
    (b"\r\n\r\n\x01", "signature is wrong"),
    (_with_byte(IPV4, 12, 0x11), "version 1"),
    (_with_byte(IPV4, 12, 0x31), "version 3"),
    (_with_byte(IPV4, 12, 0x22), "command 0x2"),
    (_with_byte(IPV4, 13, 0x41), "address family 0x4"),
    (_with_byte(IPV4, 13, 0x13), "transport 0x3"),
    (v2(("192.0.2.7", 1), transport=DGRAM), "datagram"),
    # Lengths too short for the family's addresses.
    (_with_length(IPV4, 11)[:16 + 11], "fewer than the 12"),
    (_with_length(v2(("2001:db8::7", 1)), 12)[:16 + 12], "fewer than the 36"),
    (_with_length(v2(family=UNIX), 0)[:16], "fewer than the 216"),
    (_with_byte(IPV4, 13, INET6 << 4 | 1), "fewer than the 36"),  # IPv4 addresses labelled IPv6
    # TLVs that do not fit the header's length.
    (v2(("192.0.2.7", 1), tlvs=b"\x01\x00"), "stray bytes"),
    (v2(("192.0.2.7", 1), tlvs=b"\x01\x00\x05abc"), "runs past"),
    (v2(("192.0.2.7", 1), tlvs=tlv(0x01, b"ab") + b"\x02"), "stray bytes"),
])
def test_v2_malformed_is_refused(data: bytes, says: str) -> None:
    with pytest.raises(ProxyHeaderError, match=says):
        read_header(data)


def test_v2_inet_family_with_surplus_bytes_is_read_as_tlvs() -> None:
    # An IPv4 block in an IPv6-sized length: the surplus must parse as TLVs, and here does not.
    with pytest.raises(ProxyHeaderError):
        read_header(_with_byte(v2(("2001:db8::7", 1)), 13, INET << 4 | 1))


# ---- what begins a header ----------------------------------------------------------------------


@pytest.mark.parametrize(("first", "begins"), [
    (b"P", True), (b"\r", True), (KAFKA_REQUEST, False), (TLS_CLIENT_HELLO, False), (b"", False),
    (b"GET / HTTP/1.1\r\n", False),
])
def test_one_byte_tells_a_header_from_kafka_or_tls(first: bytes, begins: bool) -> None:
    assert begins_header(first) is begins


@pytest.mark.parametrize("data", [KAFKA_REQUEST, TLS_CLIENT_HELLO])
def test_read_header_refuses_what_is_not_one(data: bytes) -> None:
    with pytest.raises(ProxyHeaderError, match="not a PROXY header"):
        read_header(data)


@given(st.binary(max_size=300))
def test_any_bytes_parse_wait_or_fail_cleanly(data: bytes) -> None:
    """Whatever a peer sends: a header no longer than the bytes, a wait, or ProxyHeaderError."""
    try:
        header = read_header(data)
    except ProxyHeaderError:
        return
    if header is not None:
        assert 15 <= header.length <= len(data)
        # Reading exactly the header gives the same answer: nothing after it was used.
        assert read_header(data[: header.length]) == header


@given(st.sampled_from([v1("192.0.2.7", "10.0.0.1", 1, 2), v2(("2001:db8::7", 1), tlvs=tlv(0x01, b"x")),
                        v2(command=LOCAL)]),
       st.integers(0, 200), st.integers(0, 255), st.binary(max_size=40))
def test_mutated_headers_fail_cleanly(header: bytes, position: int, value: int, tail: bytes) -> None:
    mutated = bytearray(header)
    mutated[position % len(mutated)] = value
    try:
        read = read_header(bytes(mutated) + tail)
    except ProxyHeaderError:
        return
    if read is not None:
        assert read.length <= len(mutated) + len(tail)


# ---- who may send one -----------------------------------------------------------------------


def test_trusted_networks() -> None:
    trusted = TrustedNetworks(("10.0.0.0/8", "192.0.2.7", "fd00::/8"))
    assert trusted.trusts("10.1.2.3")
    assert trusted.trusts("192.0.2.7")
    assert not trusted.trusts("192.0.2.8")
    assert trusted.trusts("fd00::1")
    assert trusted.trusts("::ffff:10.0.0.9")  # a dual-stack listener's view of an IPv4 balancer
    assert not trusted.trusts("2001:db8::1")
    assert not trusted.trusts("?")


V1_HEADER = ProxyHeader(1, 40, ("192.0.2.7", 1))
V2_HEADER = ProxyHeader(2, 28, ("192.0.2.7", 1))


@pytest.mark.parametrize(("mode", "trusted", "header", "refused"), [
    ("v2", True, V2_HEADER, None),
    ("v1", True, V1_HEADER, None),
    ("auto", True, V1_HEADER, None),
    ("auto", True, V2_HEADER, None),
    ("auto", True, None, None),  # auto: a header is welcome, not required
    ("v2", True, V1_HEADER, Refusal.WRONG_VERSION),
    ("v1", True, V2_HEADER, Refusal.WRONG_VERSION),
    ("v2", True, None, Refusal.MISSING),
    ("v1", True, None, Refusal.MISSING),
    # Sources outside the trusted networks never name their own address, whatever the mode.
    ("v2", False, V2_HEADER, Refusal.UNTRUSTED_SOURCE),
    ("auto", False, V1_HEADER, Refusal.UNTRUSTED_SOURCE),
    ("v2", False, None, None),  # a client connecting directly, as it always could
    ("auto", False, None, None),
])
def test_who_may_send_a_header(mode: str, trusted: bool, header: ProxyHeader | None,
                               refused: Refusal | None) -> None:
    answer = refusal(mode, trusted, header)  # type: ignore[arg-type]
    assert (answer[0] if answer is not None else None) is refused
