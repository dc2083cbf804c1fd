"""Coverage-guided fuzzing of the protocol decoders with atheris (libFuzzer).

Every input must either decode or raise kqp.protocol.errors.ProtocolError; anything else
is a crash that libFuzzer reports with the input that caused it. Not collected by pytest.

    .venv/bin/pip install atheris
    .venv/bin/python tests/fuzz/fuzz_decoders.py -runs=1000000 -max_len=4096
"""

from __future__ import annotations

import contextlib
import sys

import atheris

with atheris.instrument_imports():
    from kqp.protocol.apis import API_SPECS
    from kqp.protocol.codec import decode_body
    from kqp.protocol.errors import ProtocolError
    from kqp.protocol.fast_path import parse_fetch_request, parse_fetch_response, parse_produce_request
    from kqp.protocol.framing import FrameDecoder
    from kqp.protocol.headers import parse_request_header, response_body_offset
    from kqp.protocol.proxy_header import read_header
    from kqp.protocol.throttle_field import patch_throttle_time, read_throttle_time

ALL_VERSIONS = [(key, version) for key, spec in sorted(API_SPECS.items())
                for version in range(spec.min_version, spec.max_version + 1)]
TARGETS = 9


def run_target(target: int, api_key: int, version: int, is_request: bool, data: bytes) -> None:
    if target == 0:
        FrameDecoder(max_frame_bytes=1024).feed(data)
    elif target == 1:
        parse_request_header(data)
    elif target == 2:
        response_body_offset(data, api_key, version)
    elif target == 3:
        parse_produce_request(memoryview(data), version % 14)
    elif target == 4:
        parse_fetch_response(data, version % 19)
    elif target == 5:
        parse_fetch_request(data, version % 19)
    elif target == 6:
        buf = bytearray(data)
        if read_throttle_time(buf, 0, api_key, version) is not None:
            patch_throttle_time(buf, 0, api_key, version, 1)
    elif target == 7:
        # A PROXY protocol header (v1 text or v2 binary) before a connection's first bytes.
        header = read_header(data)
        assert header is None or header.length <= len(data)
    else:
        decode_body(api_key, version, data, is_request=is_request)


def test_one_input(raw: bytes) -> None:
    provider = atheris.FuzzedDataProvider(raw)
    target = provider.ConsumeIntInRange(0, TARGETS - 1)
    api_key, version = ALL_VERSIONS[provider.ConsumeIntInRange(0, len(ALL_VERSIONS) - 1)]
    is_request = provider.ConsumeBool()
    data = provider.ConsumeBytes(provider.remaining_bytes())
    with contextlib.suppress(ProtocolError):
        run_target(target, api_key, version, is_request, data)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
