"""The replay pre-filter (kqp/spark_jobs/replay_filter.py): the bound on hand-computed cases,
the bound against the proxy's own engine, and the filter's exactness against a full replay.

The exactness case replays a small synthetic timeline task by task with replay_group (the
code whatif's Spark job runs per task), once in full and once with the tasks the filter
passes through taken as recorded, and compares what advise reads from it: each broker's
bytes per bucket after the deferral, and each client's throttled share.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kqp.protocol.api_keys import ApiKey
from kqp.quotas import QuotaEngine, QuotaEntity, QuotaEntry, QuotaSettings
from kqp.quotas.recording import QuotaClient, ResponseCharges, broker_label, charge_response
from kqp.spark_jobs.quota_replay import replay_group
from kqp.spark_jobs.replay_filter import (
    TaskQuotas,
    max_span_bytes,
    never_throttled,
    passthrough_tasks,
    task_quotas,
    window_allowance_bytes,
    window_span_seconds,
)


def settings_of(*entries: tuple[QuotaEntity, dict[str, float]], window_num: int = 11) -> QuotaSettings:
    return QuotaSettings(
        entries=tuple(QuotaEntry(entity, limits) for entity, limits in entries),  # type: ignore[misc]
        window_num=window_num,
    )


def produce_quota(quota: float | None) -> TaskQuotas:
    return TaskQuotas(bounded=True, smallest={"producer_byte_rate": quota, "consumer_byte_rate": None})


def charged(seconds: list[int], nbytes: list[float]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {"producer_byte_rate": (np.array(seconds, dtype=np.int64), np.array(nbytes, dtype=np.float64))}


# ---------------------------------------------------------------- the bound, by hand


def test_the_span_covers_the_overlapping_sample_and_a_partial_second() -> None:
    # 11 x 1 s: 11 windows + the overlapping one = 12 s of ms, which touch at most 13 seconds.
    assert window_span_seconds(11, 1) == 13
    assert window_span_seconds(2, 1) == 4
    assert window_span_seconds(3, 2) == 9


def test_the_allowance_is_the_quota_over_the_padded_window() -> None:
    assert window_allowance_bytes(1_000, 11, 1) == 10_000  # 10 full windows of 1 s
    assert window_allowance_bytes(1_000, 2, 1) == 1_000
    assert window_allowance_bytes(500, 3, 2) == 2_000  # 2 windows of 2 s
    # One sample: Rate pads nothing, the window can be 1 ms, so 1 ms worth of quota.
    assert window_allowance_bytes(1_000, 1, 1) == 1


def test_max_span_bytes_slides_over_whole_seconds() -> None:
    seconds = np.array([7, 0, 5, 1, 6, 1])
    nbytes = np.array([5.0, 10.0, 5.0, 20.0, 5.0, 1.0])  # second 1 twice: 21 bytes
    assert max_span_bytes(seconds, nbytes, 1) == 21
    assert max_span_bytes(seconds, nbytes, 2) == 31  # seconds 0-1
    assert max_span_bytes(seconds, nbytes, 3) == 31  # 0-2 or 5-7 (15)
    assert max_span_bytes(seconds, nbytes, 6) == 36  # 1-6: 21 + 5 + 5... 2-7: 15; 0-5: 36
    assert max_span_bytes(seconds, nbytes, 8) == 46
    assert max_span_bytes(np.array([], dtype=np.int64), np.array([]), 13) == 0


def test_never_throttled_on_hand_computed_timelines() -> None:
    # quota 1,000 B/s, 11 x 1 s: 10,000 bytes allowed in any 13 consecutive seconds.
    assert never_throttled(produce_quota(1_000), charged([0], [9_999]), 11, 1)
    # At the allowance exactly: kept in the replay (the margin for the doubles' rounding).
    assert not never_throttled(produce_quota(1_000), charged([0], [10_000]), 11, 1)
    # 6,000 + 6,000 twelve seconds apart share a 13 s run; thirteen seconds apart they do not.
    assert not never_throttled(produce_quota(1_000), charged([0, 12], [6_000, 6_000]), 11, 1)
    assert never_throttled(produce_quota(1_000), charged([0, 13], [6_000, 6_000]), 11, 1)
    # No quota of that type in the task: nothing to bound.
    assert never_throttled(produce_quota(None), charged([0], [1e12]), 11, 1)
    # Fetch bytes do not count against a produce quota.
    fetch_only = {"consumer_byte_rate": (np.array([0]), np.array([1e12]))}
    assert never_throttled(produce_quota(1_000), fetch_only, 11, 1)
    assert not never_throttled(TaskQuotas(bounded=False, smallest={}), charged([], []), 11, 1)


def test_task_quotas_take_the_smallest_and_refuse_what_they_cannot_bound() -> None:
    settings = settings_of(
        (QuotaEntity(client_id="<default>"), {"producer_byte_rate": 5_000}),
        (QuotaEntity(client_id="small"), {"producer_byte_rate": 1_000}),
        (QuotaEntity(client_id="exempt"), {"producer_byte_rate": float(2**63 - 1)}),
        (QuotaEntity(client_id="cpu"), {"request_percentage": 50}),
    )
    engine = QuotaEngine(settings)
    quotas = task_quotas(engine, settings, [("u", "big"), ("u", "small")])
    assert quotas.bounded and quotas.smallest == {"producer_byte_rate": 1_000, "consumer_byte_rate": None}
    # Long.MAX_VALUE is Kafka's "no quota".
    assert task_quotas(engine, settings, [("u", "exempt")]).smallest["producer_byte_rate"] is None
    assert not task_quotas(engine, settings, [("u", "cpu")]).bounded
    with_callback = QuotaSettings(callback="kqp.quotas.callbacks:DefaultQuotaCallback")
    assert not task_quotas(QuotaEngine(settings), with_callback, [("u", "big")]).bounded


# ---------------------------------------------------------------- the bound, against the engine


@pytest.mark.parametrize("window_num", [1, 2, 3, 11])
def test_a_timeline_within_the_bound_is_never_throttled_by_the_engine(window_num: int) -> None:
    """Random bursty timelines (ms resolution) scaled to just inside the bound: Kafka's Rate,
    as kqp.quotas implements it, never throttles them; and the bound is not vacuous."""
    rng = np.random.default_rng(window_num)
    quota = 1_000.0
    settings = settings_of((QuotaEntity(client_id="<default>"), {"producer_byte_rate": quota}), window_num=window_num)
    span = window_span_seconds(window_num, 1)
    allowance = window_allowance_bytes(quota, window_num, 1)
    for _ in range(40):
        times = np.sort(rng.integers(0, 60_000, rng.integers(5, 200)))
        nbytes = rng.pareto(1.0, len(times)) + 1.0
        seconds = times // 1000
        # Scale so that the busiest run of `span` seconds carries just under the allowance.
        nbytes = np.floor(nbytes * (allowance * 0.999 / max_span_bytes(seconds, nbytes, span)))
        assert never_throttled(produce_quota(quota), charged(list(seconds), list(nbytes)), window_num, 1)
        engine = QuotaEngine(settings)
        client = QuotaClient(broker_label(0), "u", "c")
        throttles = [
            charge_response(engine, client, ResponseCharges(ApiKey.PRODUCE, int(b), None, None), int(t))
            for t, b in zip(times, nbytes, strict=True)
        ]
        assert max(throttles) == 0
    # The same traffic at twice the allowance in one second is throttled.
    engine = QuotaEngine(settings)
    client = QuotaClient(broker_label(0), "u", "c")
    charges = ResponseCharges(ApiKey.PRODUCE, int(allowance), None, None)
    over = [charge_response(engine, client, charges, t) for t in (0, 1)]
    assert max(over) > 0


# ---------------------------------------------------------------- exactness of the filter


def synthetic_requests(seed: int = 3) -> pd.DataFrame:
    """Six clients on two brokers over 60 s: two heavy producers, a heavy consumer, three light ones."""
    rng = np.random.default_rng(seed)
    rows = []
    rates = {"heavy-p1": 40, "heavy-p2": 30, "heavy-c": 30, "light-1": 3, "light-2": 2, "light-3": 2}
    for number, (client_id, per_second) in enumerate(rates.items()):
        consumer = client_id.endswith("-c")
        size = 20_000 if client_id.startswith("heavy") else 200
        for broker in (0, 1):
            for connection in range(2):
                count = per_second * 60 // 2
                for ts in np.sort(rng.integers(0, 60_000, count)):
                    # 10 % chatter that charges no bytes: Heartbeat (12) or Metadata (3).
                    data = ApiKey.FETCH if consumer else ApiKey.PRODUCE
                    api = int(data) if rng.random() < 0.9 else (12 if consumer else 3)
                    nbytes = int(rng.integers(size // 2, size * 3 // 2)) if api == data else 0
                    connection_id = number * 10 + broker * 2 + connection
                    rows.append((int(ts), connection_id, broker, f"user-{number % 2}", client_id, api, nbytes))
    frame = pd.DataFrame(
        rows, columns=["ts_ms", "connection_id", "broker", "principal", "client_id", "api_key", "nbytes"]
    )
    frame["request_time_ms"] = 1.0
    return frame


def engine_throttle(settings: QuotaSettings):  # type: ignore[no-untyped-def]
    """whatif's throttle function, without importing pyspark: one fresh engine per task."""
    engine = QuotaEngine(settings)

    def throttle(api_key, broker, principal, client_id, nbytes, request_ms, now_ms):  # type: ignore[no-untyped-def]
        charges = ResponseCharges(
            api_key,
            produce_bytes=nbytes if api_key == ApiKey.PRODUCE else None,
            fetch_bytes=nbytes if api_key == ApiKey.FETCH else None,
            request_time_ms=request_ms,
        )
        return float(charge_response(engine, QuotaClient(broker_label(broker), principal, client_id), charges, now_ms))

    return throttle


def passed_tasks(tasks: dict[tuple[int, str], pd.DataFrame], settings: QuotaSettings) -> set[tuple[int, str]]:
    """The filter's verdict, from each task's bytes per second (here the charges themselves)."""
    bounds = {}
    for key, rows in tasks.items():
        for quota_type, api in (("producer_byte_rate", ApiKey.PRODUCE), ("consumer_byte_rate", ApiKey.FETCH)):
            data = rows[rows["api_key"] == api]
            bounds[(key, quota_type)] = ((data["ts_ms"] // 1000).to_numpy(), data["nbytes"].to_numpy(dtype=float))
    pairs = {key: list(zip(rows["principal"], rows["client_id"], strict=True)) for key, rows in tasks.items()}
    return passthrough_tasks(settings, pairs, bounds)  # type: ignore[arg-type]


def replay(requests: pd.DataFrame, settings: QuotaSettings, filtered: bool) -> pd.DataFrame:
    """Every task (broker, client-id: a client-id default quota links nothing else) replayed in
    deferral mode, or, with `filtered`, only the tasks the filter does not pass through."""
    tasks = {key: rows for key, rows in requests.groupby(["broker", "client_id"])}
    passed = passed_tasks(tasks, settings) if filtered else set()
    results = []
    for key, rows in tasks.items():
        if key in passed:
            result = rows.sort_values(["ts_ms", "connection_id"], kind="stable").reset_index(drop=True)
            result["sim_ts_ms"] = result["ts_ms"]
            result["sim_throttle_ms"] = 0.0
        else:
            result = replay_group(rows, engine_throttle(settings), "deferral")
        results.append(result)
    return pd.concat(results, ignore_index=True)


def advise_figures(simulated: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    data = simulated[simulated["api_key"].isin([ApiKey.PRODUCE, ApiKey.FETCH])]
    loads = data.groupby(["broker", "api_key", data["sim_ts_ms"] // 1000])["nbytes"].sum().sort_index()
    shares = simulated.groupby("client_id")["sim_throttle_ms"].apply(lambda t: float((t > 0).mean())).sort_index()
    return loads, shares


def test_the_filtered_replay_gives_the_full_replays_loads_and_throttled_shares() -> None:
    requests = synthetic_requests()
    settings = settings_of(
        (QuotaEntity(client_id="<default>"), {"producer_byte_rate": 200_000, "consumer_byte_rate": 200_000}),
        (QuotaEntity(client_id="light-3"), {"producer_byte_rate": 500}),
    )
    full = replay(requests, settings, filtered=False)
    filtered = replay(requests, settings, filtered=True)
    loads_full, shares_full = advise_figures(full)
    loads_filtered, shares_filtered = advise_figures(filtered)
    pd.testing.assert_series_equal(loads_filtered, loads_full)
    pd.testing.assert_series_equal(shares_filtered, shares_full)
    # Every request, one for one: the passed-through rows are what the replay returned for them.
    columns = ["broker", "connection_id", "ts_ms", "api_key", "nbytes", "sim_ts_ms", "sim_throttle_ms"]
    ordered = [frame[columns].sort_values(columns).reset_index(drop=True) for frame in (full, filtered)]
    pd.testing.assert_frame_equal(ordered[1], ordered[0])
    # The case is not vacuous: the heavy clients are throttled, and the light ones passed through.
    assert shares_full[["heavy-p1", "heavy-p2", "heavy-c"]].gt(0).all()
    assert shares_full[["light-1", "light-2"]].eq(0).all()
    passed = passed_tasks({key: rows for key, rows in requests.groupby(["broker", "client_id"])}, settings)
    # light-3's quota of 500 B/s is one the filter cannot vouch for: it stays in the replay.
    assert {client for _, client in passed} == {"light-1", "light-2"}
