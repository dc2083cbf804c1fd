"""Framing, headers and correlation tracking: the sans-IO core every connection uses."""

from __future__ import annotations

import struct
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kqp.protocol.apis import API_SPECS, API_VERSIONS_KEY, METADATA_KEY, PRODUCE_KEY
from kqp.protocol.correlation import expects_response, produce_acks
from kqp.protocol.errors import (
    FrameTooLargeError,
    ProtocolDecodeError,
)
from kqp.protocol.framing import FrameDecoder, frame
from kqp.protocol.headers import (
    encode_request_header,
    encode_response_header,
    parse_request_header,
    response_body_offset,
)


@given(st.lists(st.binary(max_size=300), max_size=8), st.integers(min_value=1, max_value=700))
def test_frames_survive_any_split_of_the_stream(payloads: list[bytes], chunk: int) -> None:
    stream = b"".join(frame(p) for p in payloads)
    decoder = FrameDecoder()
    received: list[bytes] = []
    for start in range(0, len(stream), chunk):
        received += decoder.feed(stream[start : start + chunk])
    assert received == payloads
    assert decoder.buffered_bytes == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=200_000), min_size=1, max_size=4),
       st.lists(st.integers(min_value=1, max_value=70_000), min_size=1, max_size=6),
       st.sampled_from([bytes, bytearray, memoryview]))
def test_large_frames_survive_reads_of_any_size(sizes: list[int], chunks: list[int], kind: type) -> None:
    # Frames that span reads are kept as their pieces and joined once (small pieces copied
    # together): whatever the reads, the frames come out whole, as bytes, and a reused read
    # buffer (a bytearray the caller overwrites) does not change a frame kept in pieces.
    payloads = [bytes([index % 251]) * size for index, size in enumerate(sizes)]
    stream = b"".join(frame(p) for p in payloads)
    decoder = FrameDecoder()
    received: list[bytes] = []
    start = 0
    step = 0
    while start < len(stream):
        chunk = chunks[step % len(chunks)]
        piece = kind(stream[start : start + chunk])
        received += decoder.feed(piece)
        if isinstance(piece, bytearray):
            piece[:] = b"\xff" * len(piece)
        start += chunk
        step += 1
    assert [len(r) for r in received] == sizes
    assert received == payloads and all(type(r) is bytes for r in received)
    assert decoder.buffered_bytes == 0 and decoder.incomplete_frame() == (-1, 0)


def test_a_frame_sent_a_few_bytes_per_read_costs_its_size_not_an_object_per_read() -> None:
    size = 300_000
    stream = frame(b"x" * size)
    decoder = FrameDecoder()
    reads = [stream[start : start + 3] for start in range(0, len(stream), 3)]
    tracemalloc.start()
    try:
        for read in reads[:-1]:
            assert decoder.feed(read) == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoder.incomplete_frame() == (size, size - 1)
    # About 3.7x while the copy grows, as before pieces were kept; with an object per read, 100x.
    assert peak < 4 * size
    assert decoder.feed(reads[-1]) == [b"x" * size]


def test_oversized_frame_is_rejected_before_its_body_arrives() -> None:
    decoder = FrameDecoder(max_frame_bytes=1000)
    with pytest.raises(FrameTooLargeError, match="1001 bytes exceeds the limit of 1000"):
        decoder.feed(struct.pack(">i", 1001))


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=4), st.sampled_from([bytes, bytearray, memoryview]))
def test_one_whole_frame_per_read_comes_out_as_bytes(payloads: list[bytes], kind: type) -> None:
    # The path every small request and response takes: exactly one frame per read.
    decoder = FrameDecoder()
    for payload in payloads:
        (out,) = decoder.feed(kind(frame(payload)))
        assert out == payload and type(out) is bytes
    assert decoder.buffered_bytes == 0 and decoder.incomplete_frame() == (-1, 0)


def test_one_whole_oversized_frame_is_rejected_too() -> None:
    decoder = FrameDecoder(max_frame_bytes=10)
    assert decoder.feed(frame(b"x" * 10)) == [b"x" * 10]
    with pytest.raises(FrameTooLargeError):
        decoder.feed(frame(b"x" * 11))


def test_negative_frame_size_is_a_decode_error() -> None:
    with pytest.raises(ProtocolDecodeError):
        FrameDecoder().feed(struct.pack(">i", -5))


@pytest.mark.parametrize("api_key", sorted(API_SPECS))
def test_request_header_round_trips_for_every_version(api_key: int) -> None:
    spec = API_SPECS[api_key]
    for version in range(spec.min_version, spec.max_version + 1):
        encoded = encode_request_header(api_key, version, 4242, "client-é") + b"BODY"
        header = parse_request_header(encoded)
        assert (header.api_key, header.api_version, header.correlation_id) == (api_key, version, 4242)
        assert header.client_id == "client-é"
        assert encoded[header.body_offset :] == b"BODY"


def test_flexible_request_header_skips_tagged_fields() -> None:
    # Metadata v12 is flexible: header v2 with one tagged field (tag 7, 3 bytes).
    encoded = struct.pack(">hhih", METADATA_KEY, 12, 1, 1) + b"c" + b"\x01\x07\x03abc" + b"BODY"
    header = parse_request_header(encoded)
    assert encoded[header.body_offset :] == b"BODY"


def test_null_client_id_is_allowed() -> None:
    encoded = encode_request_header(METADATA_KEY, 1, 9, None)
    assert parse_request_header(encoded).client_id is None


def test_unknown_api_key_is_read_for_forwarding() -> None:
    header = parse_request_header(struct.pack(">hhih", 9999, 3, 77, 2) + b"id" + b"BODY")
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (9999, 3, 77, "id")
    assert not header.known


def test_too_new_version_is_read_for_forwarding_and_api_versions_probes_keep_their_header() -> None:
    too_new = API_SPECS[METADATA_KEY].max_version + 1
    header = parse_request_header(struct.pack(">hhih", METADATA_KEY, too_new, 1, -1) + b"\x00")
    assert (header.api_version, header.known) == (too_new, False)
    probe = API_SPECS[API_VERSIONS_KEY].max_version + 1
    header = parse_request_header(struct.pack(">hhih", API_VERSIONS_KEY, probe, 1, -1) + b"\x00BODY")
    assert header.api_version == probe
    assert header.body_offset == 11  # flexible header: its tagged-field section is skipped


def test_truncated_header_is_a_decode_error() -> None:
    with pytest.raises(ProtocolDecodeError):
        parse_request_header(b"\x00\x03\x00")
    with pytest.raises(ProtocolDecodeError, match="client id"):
        parse_request_header(struct.pack(">hhih", METADATA_KEY, 1, 1, 50) + b"short")


def test_api_versions_response_header_is_always_v0() -> None:
    assert encode_response_header(API_VERSIONS_KEY, 4, 7) == struct.pack(">i", 7)
    assert encode_response_header(METADATA_KEY, 12, 7) == struct.pack(">i", 7) + b"\x00"
    assert response_body_offset(struct.pack(">i", 7) + b"\x00BODY", METADATA_KEY, 12) == 5
    assert response_body_offset(struct.pack(">i", 7) + b"BODY", API_VERSIONS_KEY, 3) == 4


def _produce_body(version: int, acks: int, transactional_id: str | None) -> bytes:
    raw = None if transactional_id is None else transactional_id.encode()
    if version >= 9:  # compact nullable string: length + 1 as a varint, 0 for null
        tid = b"\x00" if raw is None else bytes([len(raw) + 1]) + raw
    else:
        tid = struct.pack(">h", -1) if raw is None else struct.pack(">h", len(raw)) + raw
    return tid + struct.pack(">hi", acks, 30000)


@pytest.mark.parametrize("version", range(3, API_SPECS[PRODUCE_KEY].max_version + 1))
@pytest.mark.parametrize("transactional_id", [None, "txn-1"])
def test_produce_acks_zero_expects_no_response(version: int, transactional_id: str | None) -> None:
    for acks in (-1, 0, 1):
        body = _produce_body(version, acks, transactional_id)
        assert produce_acks(body, version) == acks
        assert expects_response(PRODUCE_KEY, version, body) is (acks != 0)


@given(st.binary(max_size=12), st.integers(0, 15))
def test_expects_response_reads_acks_as_produce_acks_does(body: bytes, version: int) -> None:
    # On any bytes, a truncated or absurd TransactionalId length included.
    try:
        acks = produce_acks(body, version)
    except (ProtocolDecodeError, struct.error):
        with pytest.raises((ProtocolDecodeError, struct.error)):
            expects_response(PRODUCE_KEY, version, body)
    else:
        assert expects_response(PRODUCE_KEY, version, body) is (acks != 0)
    assert expects_response(METADATA_KEY, version, body) is True
