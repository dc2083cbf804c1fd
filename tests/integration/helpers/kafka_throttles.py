"""Each captured Produce throttle against Kafka's arithmetic, replayed apart from kqp.quotas.

The capture says what the proxy charged (`quota_produce_bytes`, when the response came back),
at which instant of the engine's clock (`quota_response_now_ms`) and in which order of the
engine's calls (`quota_response_seq`). Replaying exactly those charges through the reference
written from Kafka's source (kqpsim/kafka_reference.py: ClientQuotaManager, its
DefaultQuotaCallback and Rate) gives the ThrottleTimeMs a broker would have answered each
request with. Neither phase nor load moves this comparison: the replay takes the times the
proxy saw, whatever they were, so a real-time test can assert it exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kqpsim.kafka_reference import ClientQuotaManager, Entity

PRODUCE = 0


def throttles_differing_from_kafkas(
    rows: Iterable[Mapping[str, Any]],
    quotas: Mapping[Entity, float],
    *,
    window_num: int,
    window_size_s: int = 1,
    charged: Callable[[Mapping[str, Any]], bool] = lambda _row: True,
) -> tuple[int, list[tuple[str, int, int, int]]]:
    """Replays the Produce rows `charged` selects, in the engine's order, through a fresh
    ClientQuotaManager holding `quotas` (producer_byte_rate per (user, client-id) entity,
    None absent, "<default>" the default). Returns how many were compared and those whose
    throttle differs: (client id, correlation id, kqp's ms, Kafka's ms)."""
    replayed = sorted(
        (row for row in rows if row["api_key"] == PRODUCE and charged(row)),
        key=lambda row: int(row["quota_response_seq"]),
    )
    missing = [row["correlation_id"] for row in replayed if row["quota_produce_bytes"] is None]
    assert not missing, f"acknowledged Produce requests not charged to a quota: {missing[:10]}"
    kafka = ClientQuotaManager(samples=window_num, window_s=window_size_s)
    kafka.set_quotas(dict(quotas))
    differences = []
    for row in replayed:
        # The engine clock is float ms; Kafka's (time.milliseconds()) counts whole ms, and kqp's
        # engine reads the same instant as int(now_ms) (kqp/quotas/engine.py, record_produce),
        # which on this monotonic, positive clock is the floor: the whole ms Kafka's clock would
        # read at that instant. So the reference is asked at exactly the instant kqp used, and
        # any difference in the throttle is one of arithmetic, not of rounding the clock.
        now_ms = math.floor(row["quota_response_now_ms"])
        kafka_ms = kafka.record(str(row["principal"] or ""), str(row["client_id"] or ""),
                                int(row["quota_produce_bytes"]), now_ms)
        if kafka_ms != row["proxy_throttle_ms"]:
            differences.append((str(row["client_id"]), int(row["correlation_id"]),
                                int(row["proxy_throttle_ms"] or 0), kafka_ms))
    return len(replayed), differences
