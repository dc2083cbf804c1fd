"""Fuzzing the decoders: every input either decodes or raises the protocol's own error type.

Each Hypothesis example draws a valid message (or plain random bytes) and a seed, then
feeds the decoder the message itself and MUTATIONS mutants of it (bit flips, boundary
values written over length fields, truncations, insertions, deletions, duplicated runs), so
the inputs per test are examples x (MUTATIONS + 1). `KQP_FUZZ_EXAMPLES` sets the examples
per test (default 150: about 270,000 inputs); KQP_FUZZ_EXAMPLES=600 feeds over a million.
Run with `-s` to see the count.
"""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kqp.protocol.apis import API_SPECS, FETCH_KEY, PRODUCE_KEY
from kqp.protocol.codec import decode_body
from kqp.protocol.error_codes import scan_error_codes
from kqp.protocol.errors import ProtocolError
from kqp.protocol.fast_path import parse_fetch_request, parse_fetch_response, parse_produce_request
from kqp.protocol.framing import FrameDecoder, frame
from kqp.protocol.headers import encode_request_header, parse_request_header, response_body_offset
from kqp.protocol.proxy_header import read_header
from kqp.protocol.throttle_field import patch_throttle_time, read_throttle_time
from tests.unit.helpers import proxy_header
from tests.unit.helpers.fast_path_strategies import fetch_requests, fetch_responses, produce_requests
from tests.unit.helpers.schema_messages import body_strategy

EXAMPLES = int(os.environ.get("KQP_FUZZ_EXAMPLES", "150"))
MUTATIONS = 200
FUZZ_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BOUNDARY_INT32 = (-2**31, -2, -1, 0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 2**31 - 1)
ALL_VERSIONS = [(key, version) for key, spec in sorted(API_SPECS.items())
                for version in range(spec.min_version, spec.max_version + 1)]
SEEDS = st.integers(0, 2**32 - 1)
FED = [0]


def mutate(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        choice = rng.randrange(7)
        position = rng.randrange(len(buf) + 1)
        if choice == 0 and buf:
            buf[min(position, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif choice == 1 and len(buf) >= 4:
            struct.pack_into(">i", buf, min(position, len(buf) - 4), rng.choice(BOUNDARY_INT32))
        elif choice == 2 and buf:
            buf[min(position, len(buf) - 1)] = rng.choice((0x00, 0x01, 0x7F, 0x80, 0xFF))
        elif choice == 3:
            del buf[position:]
        elif choice == 4:
            buf[position:position] = rng.randbytes(rng.randint(1, 8))
        elif choice == 5:
            del buf[position:position + rng.randint(1, 16)]
        else:
            buf[position:position] = buf[position:position + rng.randint(1, 32)]
    return bytes(buf)


def inputs(base: bytes, seed: int) -> Iterator[bytes]:
    rng = random.Random(seed)
    yield base
    for _ in range(MUTATIONS):
        yield mutate(base, rng)


@pytest.fixture(scope="module", autouse=True)
def report_inputs_fed() -> Iterator[None]:
    yield
    print(f"\nfuzz: {FED[0]:,} inputs fed to the decoders ({EXAMPLES} examples per test)")


def only_protocol_errors(decoder: Callable[[bytes], object], data: bytes) -> None:
    FED[0] += 1
    try:
        decoder(data)
    except ProtocolError:
        pass
    except Exception as exc:
        raise AssertionError(f"{exc!r} escaped on input {data.hex()}") from exc


@FUZZ_SETTINGS
@given(frames=st.lists(st.binary(max_size=64), max_size=4), seed=SEEDS, chunk=st.integers(1, 40))
def test_framing(frames: list[bytes], seed: int, chunk: int) -> None:
    def feed(stream: bytes) -> None:
        decoder = FrameDecoder(max_frame_bytes=256)
        for start in range(0, len(stream), chunk):
            decoder.feed(stream[start:start + chunk])
        assert decoder.buffered_bytes <= 256 + 4

    for data in inputs(b"".join(frame(f) for f in frames), seed):
        only_protocol_errors(feed, data)


@FUZZ_SETTINGS
@given(pair=st.sampled_from(ALL_VERSIONS), client_id=st.one_of(st.none(), st.text(max_size=8)),
       tail=st.binary(max_size=16), seed=SEEDS)
def test_request_headers(pair: tuple[int, int], client_id: str | None, tail: bytes, seed: int) -> None:
    base = encode_request_header(pair[0], pair[1], 7, client_id) + tail
    for data in inputs(base, seed):
        only_protocol_errors(parse_request_header, data)
        only_protocol_errors(lambda raw: response_body_offset(raw, *pair), data)


@FUZZ_SETTINGS
@given(data=st.data(), seed=SEEDS)
def test_produce_requests(data: st.DataObject, seed: int) -> None:
    version = data.draw(st.sampled_from(range(3, API_SPECS[PRODUCE_KEY].max_version + 1)))
    base, _ = data.draw(produce_requests(version))
    for body in inputs(base, seed):
        only_protocol_errors(lambda raw: parse_produce_request(memoryview(raw), version), body)


@FUZZ_SETTINGS
@given(data=st.data(), seed=SEEDS)
def test_fetch_requests_and_responses(data: st.DataObject, seed: int) -> None:
    version = data.draw(st.sampled_from(range(4, API_SPECS[FETCH_KEY].max_version + 1)))
    response, _ = data.draw(fetch_responses(version))
    for body in inputs(response, seed):
        only_protocol_errors(lambda raw: parse_fetch_response(raw, version), body)
    for body in inputs(data.draw(fetch_requests(version)), seed):
        only_protocol_errors(lambda raw: parse_fetch_request(raw, version), body)


def _throttle_round(pair: tuple[int, int]) -> Callable[[bytes], object]:
    def read_then_patch(raw: bytes) -> None:
        buf = bytearray(raw)
        if read_throttle_time(buf, 0, *pair) is not None:
            patch_throttle_time(buf, 0, *pair, 1234)
            assert read_throttle_time(buf, 0, *pair) == 1234
            assert len(buf) == len(raw)

    return read_then_patch


@FUZZ_SETTINGS
@given(data=st.data(), seed=SEEDS)
def test_throttle_field_and_codec_on_responses(data: st.DataObject, seed: int) -> None:
    pair = data.draw(st.sampled_from(ALL_VERSIONS))
    base = data.draw(body_strategy(*pair, is_request=False))
    for body in inputs(base, seed):
        only_protocol_errors(_throttle_round(pair), body)
        only_protocol_errors(lambda raw: scan_error_codes(*pair, raw), body)
        only_protocol_errors(lambda raw: decode_body(*pair, raw, is_request=False), body)


@FUZZ_SETTINGS
@given(data=st.data(), seed=SEEDS)
def test_codec_on_requests(data: st.DataObject, seed: int) -> None:
    pair = data.draw(st.sampled_from(ALL_VERSIONS))
    base = data.draw(body_strategy(*pair, is_request=True))
    for body in inputs(base, seed):
        only_protocol_errors(lambda raw: decode_body(*pair, raw, is_request=True), body)


IPS = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)).map(str)
PORTS = st.integers(0, 65535)


@st.composite
def proxy_headers(draw: st.DrawFn) -> bytes:
    """A PROXY header of either version, any family and command, with TLVs, then a connection's first bytes."""
    source, destination = draw(IPS), draw(IPS)
    if draw(st.booleans()):
        if ":" in source:
            destination = draw(st.ip_addresses(v=6).map(str))
        elif ":" in destination:
            destination = draw(st.ip_addresses(v=4).map(str))
        header = proxy_header.v1(source, destination, draw(PORTS), draw(PORTS))
    else:
        tlvs = b"".join(proxy_header.tlv(kind, value) for kind, value in
                        draw(st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=24)), max_size=3)))
        family = draw(st.sampled_from((None, proxy_header.UNSPEC, proxy_header.UNIX)))
        header = proxy_header.v2((source, draw(PORTS)), command=draw(st.sampled_from((proxy_header.LOCAL,
                                 proxy_header.PROXY))), family=family, tlvs=tlvs)
    return header + draw(st.binary(max_size=16))


@FUZZ_SETTINGS
@given(base=proxy_headers(), seed=SEEDS)
def test_proxy_protocol_headers(base: bytes, seed: int) -> None:
    def read(raw: bytes) -> None:
        header = read_header(raw)
        if header is not None:
            # Never more than it was given: what follows the header is the connection's.
            assert header.length <= len(raw)

    for data in inputs(base, seed):
        only_protocol_errors(read, data)


@FUZZ_SETTINGS
@given(raw=st.binary(max_size=200), pair=st.sampled_from(ALL_VERSIONS))
def test_random_bytes_everywhere(raw: bytes, pair: tuple[int, int]) -> None:
    only_protocol_errors(lambda data: parse_produce_request(data, pair[1] % 14), raw)
    only_protocol_errors(lambda data: parse_fetch_response(data, pair[1] % 19), raw)
    only_protocol_errors(lambda data: parse_fetch_request(data, pair[1] % 19), raw)
    only_protocol_errors(_throttle_round(pair), raw)
    only_protocol_errors(lambda data: scan_error_codes(*pair, data), raw)
    only_protocol_errors(lambda data: decode_body(*pair, data, is_request=False), raw)
    only_protocol_errors(read_header, raw)
