"""Count and checksum of record values, to compare what was sent with what came back."""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass

RECORDS = 100_000


@dataclass(frozen=True)
class Tally:
    count: int
    distinct: int
    # Sum of CRC32s: order-independent, and changed by any lost, duplicated or altered value.
    checksum: int

    @classmethod
    def of(cls, values: Iterable[bytes]) -> Tally:
        count = 0
        checksum = 0
        seen: set[bytes] = set()
        for value in values:
            count += 1
            checksum += zlib.crc32(value)
            seen.add(value)
        return cls(count, len(seen), checksum)


def numbered_values(count: int = RECORDS) -> list[bytes]:
    """b"0" .. b"count-1": the values ProducerPerformance --payload-monotonic sends, used by every client."""
    return [str(i).encode() for i in range(count)]


EXPECTED = Tally.of(numbered_values())
