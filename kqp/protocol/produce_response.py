"""Where ThrottleTimeMs sits in a Produce response: the generated skipper, by version.

The walk that was written here by hand is now generated from ProduceResponse.json with every
other response's (kqp.protocol.throttle_field, kqp.protocol.generated); this module keeps the
names the Produce-specific tests and benchmarks use.
"""

from __future__ import annotations

from collections.abc import Callable

from kqp.protocol.apis import PRODUCE_KEY, THROTTLE_TIME_MS

Buffer = bytes | bytearray | memoryview

_SKIPPERS: dict[int, Callable[[Buffer, int], int]] = THROTTLE_TIME_MS[PRODUCE_KEY]
FIRST_VERSION = min(_SKIPPERS)
LAST_VERSION = max(_SKIPPERS)


def walks(api_version: int) -> bool:
    """Whether `throttle_offset` knows this version's layout."""
    return api_version in _SKIPPERS


def throttle_offset(buf: Buffer, offset: int, api_version: int) -> int:
    """The offset of ThrottleTimeMs in a Produce response whose body starts at `offset`
    (`walks(api_version)` must hold). The returned offset is not checked against the end."""
    return _SKIPPERS[api_version](buf, offset)
