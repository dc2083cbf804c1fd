"""whatif's Spark glue (grouping, ordering, aggregation) with a deterministic throttle function.

The quota arithmetic itself belongs to kqp.quotas and is tested there; here a simple
throttle rule stands in for it so the figures can be recomputed with pandas.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle

from kqp.spark_jobs.capture_source import read_capture
from kqp.spark_jobs.whatif import (
    ReplayOptions,
    broker_peaks,
    calibration,
    client_outcomes,
    prepare_requests,
    simulate,
)
from tests.spark.helpers import QUOTAS_YAML

pytestmark = pytest.mark.spark
# Executors cannot import the tests package: ship this module's functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

THROTTLED_CLIENT = "app-0"
THROTTLE_MS = 40.0


def every_produce_of_one_client():  # type: ignore[no-untyped-def]
    def throttle(api_key, broker, principal, client_id, nbytes, request_ms, now_ms):  # type: ignore[no-untyped-def]
        return THROTTLE_MS if api_key == 0 and client_id == THROTTLED_CLIENT else 0.0

    return throttle


@pytest.fixture(scope="module")
def simulated(spark: Any, capture_dir: Path) -> pd.DataFrame:
    requests = prepare_requests(read_capture(spark, str(capture_dir)))
    frame = simulate(spark, requests, every_produce_of_one_client, ReplayOptions("open_loop"))
    return frame


def test_open_loop_outcomes_per_client(simulated: Any, capture_rows: pd.DataFrame) -> None:
    clients = client_outcomes(simulated).toPandas().set_index("client_id")
    produce = capture_rows[(capture_rows["client_id"] == THROTTLED_CLIENT) & (capture_rows["api_key"] == 0)]
    row = clients.loc[THROTTLED_CLIENT]
    assert row["throttled_requests"] == len(produce)
    assert row["throttle_ms_total"] == len(produce) * THROTTLE_MS
    assert row["bytes_delayed"] == (produce["request_bytes"] - 4).sum()
    assert row["requests"] == (capture_rows["client_id"] == THROTTLED_CLIENT).sum()
    assert clients.drop(index=THROTTLED_CLIENT)["throttled_requests"].sum() == 0


def test_calibration_against_recorded_throttles(simulated: Any, capture_rows: pd.DataFrame) -> None:
    table = calibration(simulated).toPandas().set_index("client_id")
    recorded = capture_rows.groupby("client_id")["proxy_throttle_ms"].sum()
    assert table["recorded_throttle_ms_total"].to_dict() == pytest.approx(recorded.astype(float).to_dict())
    expected_agreement = {
        client: ((rows["api_key"] == 0) & (client == THROTTLED_CLIENT)).eq(rows["proxy_throttle_ms"] > 0).sum()
        for client, rows in capture_rows.groupby("client_id")
    }
    assert table["agreeing_requests"].to_dict() == expected_agreement


def test_deferral_moves_throttled_traffic_later(spark: Any, capture_dir: Path, capture_rows: pd.DataFrame) -> None:
    requests = prepare_requests(read_capture(spark, str(capture_dir)))
    deferred = simulate(spark, requests, every_produce_of_one_client, ReplayOptions("deferral"))
    shifts = deferred.where("client_id = 'app-0'").selectExpr("max(sim_ts_ms - ts_ms) as shift").first()
    others = deferred.where("client_id != 'app-0'").selectExpr("max(abs(sim_ts_ms - ts_ms)) as shift").first()
    produce_per_connection = capture_rows[capture_rows["client_id"] == THROTTLED_CLIENT].groupby("connection_id").size()
    assert shifts is not None and others is not None
    # Every produce of app-0 adds 40 ms, so the last request of a busy connection moves by a lot.
    assert shifts["shift"] >= THROTTLE_MS
    assert shifts["shift"] <= THROTTLE_MS * produce_per_connection.max()
    assert others["shift"] == 0
    peaks = broker_peaks(deferred).toPandas()
    assert (peaks["simulated_peak_bytes_per_s"] > 0).all()


def sequential_replay(rows: pd.DataFrame, settings: Any) -> pd.DataFrame:
    """Every request of the capture, in time order, through one engine in this process.

    The inputs follow the capture contract and the proxy's recording rules (Produce: frame
    less the size prefix, at the response or, for acks=0, at the request; Fetch: 4 + the
    response body, recorded after the request time and unrecorded when either throttles, as
    KafkaApis does for the empty answer; request time: broker round trip less a long-poll's
    wait).
    """
    from kqp.quotas import QuotaEngine

    engine = QuotaEngine(settings)
    frame = rows.copy()
    answered = frame["ts_response_received_us"].notna()
    frame["ts_ms"] = (frame["ts_response_received_us"].where(answered, frame["ts_request_received_us"]) // 1000).astype(
        "int64"
    )
    frame = frame.sort_values(["ts_ms", "connection_id"], kind="stable")
    throttles = []
    for row in frame.itertuples():
        broker = "bootstrap" if pd.isna(row.upstream_node_id) else str(int(row.upstream_node_id))
        principal, client = row.principal, row.client_id
        request_throttle = 0
        if not pd.isna(row.ts_response_received_us):
            round_trip = (row.ts_response_received_us - row.ts_request_sent_us) / 1000.0
            if row.api_key == 1 and round_trip >= row.fetch_max_wait_ms:
                round_trip -= row.fetch_max_wait_ms
            request_throttle = engine.record_request_time(broker, principal, client, row.api_key, round_trip,
                                                          row.ts_ms)
        delays = [request_throttle]
        if row.api_key == 0:
            delays.append(engine.record_produce(broker, principal, client, int(row.request_bytes) - 4, row.ts_ms))
        elif row.api_key == 1:
            header = 5 if row.api_version >= 12 else 4
            body = int(row.response_bytes) - 4 - header
            # A throttled Fetch is answered empty and its bytes unrecorded, whichever quota throttled it.
            delays.append(engine.record_fetch(broker, principal, client, 4 + body, row.ts_ms, request_throttle))
        throttles.append(max(delays))
    frame["throttle_ms"] = throttles
    return frame


def test_whatif_through_the_quota_engine_matches_a_sequential_replay(
    spark: Any, capture_dir: Path, capture_rows: pd.DataFrame, tmp_path: Path
) -> None:
    from kqp.config import load_config
    from kqp.spark_jobs.whatif import WhatIfOptions, run_whatif, write_whatif_outputs

    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(QUOTAS_YAML)
    options = WhatIfOptions(capture=str(capture_dir), quotas=str(quotas), output=str(tmp_path / "out"), calibrate=True)
    result = run_whatif(spark, options)
    write_whatif_outputs(result, options.output)

    expected = sequential_replay(capture_rows, load_config([str(quotas)]).quota_settings())
    per_client = expected.groupby(["principal", "client_id"]).agg(
        throttled=("throttle_ms", lambda t: int((t > 0).sum())),
        total=("throttle_ms", "sum"),
        max=("throttle_ms", "max"),
    )
    clients = result["tables"]["clients"].set_index(["principal", "client_id"])
    assert per_client["throttled"].sum() > 0  # the config does bite
    assert clients["throttled_requests"].to_dict() == per_client["throttled"].to_dict()
    assert clients["throttle_ms_total"].to_dict() == pytest.approx(per_client["total"].astype(float).to_dict())
    assert clients["throttle_ms_max"].to_dict() == pytest.approx(per_client["max"].astype(float).to_dict())

    # The limits each client got: tenant-1's user quota beats the client-id default for produce.
    limits = clients["produce_quota_bytes_per_s"]
    tenant_1 = clients.index.get_level_values("principal") == "tenant-1"
    assert (limits[tenant_1] == 15000).all() and (limits[~tenant_1] == 40000).all()
    assert (clients["fetch_quota_bytes_per_s"] == 60000).all()

    summary = result["summary"]
    assert summary["throttled_requests"] == per_client["throttled"].sum()
    assert summary["calibration"]["recorded_throttle_ms_total"] == capture_rows["proxy_throttle_ms"].sum()
    page = (tmp_path / "out" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2
    assert (tmp_path / "out" / "csv" / "clients.csv").exists()


def test_controller_mutations_are_charged_when_they_arrived(spark: Any, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kqp.capture.schema import CAPTURE_SCHEMA
    from kqp.config import load_config
    from kqp.quotas import QuotaEngine
    from kqp.spark_jobs.whatif import engine_replay_functions

    # Eight CreateTopics (v7, strict) of 20 partitions each, 100 ms apart,
    # against 10 partitions/s (a burst of 110): the bucket runs dry and later requests are throttled.
    start_us = 1_767_225_600_000_000
    rows = [
        {
            "schema_version": 1,
            "ts_request_received_us": start_us + i * 100_000,
            "ts_request_sent_us": start_us + i * 100_000 + 100,
            # Uneven answer times: charging at the answer instead would change the last throttle.
            "ts_response_received_us": start_us + i * 100_000 + (i % 3) * 45_000 + 1_000,
            "ts_response_sent_us": start_us + i * 100_000 + (i % 3) * 45_000 + 1_100,
            "connection_id": 1,
            "upstream_node_id": 1,
            "principal": "ops",
            "client_id": "admin",
            "api_key": 19,
            "api_version": 7,
            "correlation_id": i,
            "request_bytes": 120,
            "response_bytes": 80,
            "mutations": [{"topic": f"t{i}-{k}", "partitions": 10, "error_code": 0} for k in range(2)],
            "proxy_throttle_ms": 0,
        }
        for i in range(8)
    ]
    capture = tmp_path / "capture"
    capture.mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=CAPTURE_SCHEMA), capture / "mutations.parquet")
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(
        'quotas:\n  entries:\n    - entity: {client-id: "<default>"}\n      controller_mutation_rate: 10\n'
    )
    settings = load_config([str(quotas)]).quota_settings()

    requests = prepare_requests(read_capture(spark, str(capture)))
    factory = functools.partial(engine_replay_functions, settings)
    simulated = simulate(spark, requests, factory, ReplayOptions("open_loop")).toPandas().sort_values("ts_ms")

    engine = QuotaEngine(settings)
    expected = [
        float(
            engine.mutations(
                "1",
                "ops",
                "admin",
                19,
                7,
                [(m["topic"], m["partitions"]) for m in row["mutations"]],
                row["ts_request_received_us"] // 1000,
            ).throttle_ms
        )
        for row in rows
    ]
    assert list(simulated["sim_throttle_ms"]) == expected
    assert expected[0] == 0 and max(expected) > 0


# A client-id default that bites, one client far under a generous quota, one exempt.
PASSTHROUGH_QUOTAS_YAML = """\
quotas:
  entries:
    - entity: {client-id: "<default>"}
      producer_byte_rate: 40000
      consumer_byte_rate: 60000
    - entity: {client-id: "app-8"}
      producer_byte_rate: 100000000
      consumer_byte_rate: 100000000
    - entity: {client-id: "app-9"}
      producer_byte_rate: 9223372036854775807
      consumer_byte_rate: 9223372036854775807
"""


def test_deferral_passes_through_what_the_quotas_never_throttle_and_changes_nothing(
    spark: Any, capture_dir: Path, tmp_path: Path
) -> None:
    """The pre-filter (kqp.spark_jobs.replay_filter) on the real engine: the tasks it passes
    through come back exactly as the full replay returns them, and so does everything else."""
    from kqp.config import load_config
    from kqp.spark_jobs.whatif import (
        SIMULATED_COLUMNS,
        engine_replay_functions,
        passthrough_condition,
        replay_options,
        replay_traffic,
    )

    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(PASSTHROUGH_QUOTAS_YAML)
    settings = load_config([str(quotas)]).quota_settings()
    requests = prepare_requests(read_capture(spark, str(capture_dir)))
    options = replay_options(settings, "deferral")
    runs = {
        name: simulate(
            spark,
            requests,
            functools.partial(engine_replay_functions, settings),
            replace(options, passthrough=passthrough),
        )
        for name, passthrough in (("full", None), ("filtered", settings))
    }
    columns = list(SIMULATED_COLUMNS)
    full, filtered = (
        runs[name].toPandas().sort_values(columns).reset_index(drop=True)[columns] for name in ("full", "filtered")
    )
    pd.testing.assert_frame_equal(filtered, full)
    outcomes = {
        name: client_outcomes(frame).toPandas().sort_values(["principal", "client_id"]).reset_index(drop=True)
        for name, frame in runs.items()
    }
    pd.testing.assert_frame_equal(outcomes["filtered"], outcomes["full"])
    # The percentiles, taken from (throttle, count) pairs, are Spark's percentile over every request.
    from pyspark.sql import functions as F

    direct = (
        runs["full"]
        .groupBy("principal", "client_id")
        .agg(F.percentile("sim_throttle_ms", [0.5, 0.95, 0.99]).alias("q"))
        .toPandas()
        .sort_values(["principal", "client_id"])
        .reset_index(drop=True)
    )
    for position, column in enumerate(("throttle_ms_p50", "throttle_ms_p95", "throttle_ms_p99")):
        assert list(outcomes["full"][column]) == [q[position] for q in direct["q"]]
    assert outcomes["full"]["throttle_ms_p99"].gt(0).any()
    # Not vacuous: the config throttles some tasks, and the filter passes others through.
    assert (full["sim_throttle_ms"] > 0).any()
    pairs = [(r["principal"], r["client_id"]) for r in requests.select("principal", "client_id").distinct().collect()]
    from kqp.spark_jobs.quota_replay import quota_groups

    groups = quota_groups(pairs, options.link_users, options.link_client_ids)
    mapping = spark.createDataFrame(
        [(p, c, g) for (p, c), g in groups.items()], "principal string, client_id string, quota_group int"
    )
    traffic = replay_traffic(requests)
    # The one pass that plans the replay sees every pair the capture holds.
    assert traffic.pairs == sorted(pairs)
    flagged = passthrough_condition(
        spark,
        requests.join(mapping, ["principal", "client_id"]),
        ("broker", "quota_group"),
        groups,
        settings,
        traffic,
    )
    assert flagged is not None
    passed = {r["client_id"] for r in flagged.where("_kqp_passthrough").select("client_id").distinct().collect()}
    # app-9 has no quota (passed whole); app-8's quota is far above what it sends (passed by the
    # bound), and so may be a light client's default; no client the replay throttles is passed.
    assert {"app-8", "app-9"} <= passed
    assert passed.isdisjoint(full.loc[full["sim_throttle_ms"] > 0, "client_id"])


def _sorted(frame: Any, keys: list[str]) -> pd.DataFrame:
    return frame.toPandas().sort_values(keys).reset_index(drop=True)


def _moved_from_rows(simulated: Any, unit: int) -> pd.DataFrame:
    """Per (broker, API, bucket of `unit` s): the bytes the deferral moved out and in, from the rows."""
    from pyspark.sql import functions as F

    rows = (
        simulated.where(F.col("api_key").isin(0, 1))
        .select(
            "broker",
            "api_key",
            F.floor(F.col("ts_ms") / (1000 * unit)).cast("long").alias("before"),
            F.floor(F.col("sim_ts_ms") / (1000 * unit)).cast("long").alias("after"),
            F.floor(F.col("sim_ts_ms") / 1000).cast("long").alias("sim_second"),
            "nbytes",
        )
        .where(F.col("before") != F.col("after"))
        .toPandas()
    )
    out = rows.groupby(["broker", "api_key", "before"])["nbytes"].sum().rename("moved_out")
    arrived = rows.groupby(["broker", "api_key", "after"]).agg(
        moved_in=("nbytes", "sum"), arrivals=("nbytes", "size"), last_second=("sim_second", "max")
    )
    out.index.names = arrived.index.names = ["broker", "api_key", "bucket"]
    return pd.concat([out, arrived], axis=1).fillna({"moved_out": 0, "moved_in": 0, "arrivals": 0}).sort_index()


@pytest.mark.parametrize("mode", ["deferral", "open_loop"])
def test_partial_sums_give_the_tables_the_rows_give(spark: Any, capture_dir: Path, tmp_path: Path, mode: str) -> None:
    """Each task's partial sums (simulate_partials), merged by Spark, give every table the rows
    give, value for value: the per-client outcomes with their exact percentiles, the broker
    peaks, the calibration and advise's moved bytes; in deferral mode with the pre-filter on, so
    passed-through batches are summed too."""
    from kqp.config import load_config
    from kqp.spark_jobs.whatif import (
        broker_peaks_from_partials,
        calibration_from_partials,
        client_outcomes_from_partials,
        engine_replay_functions,
        moved_bytes_from_partials,
        replay_options,
        simulate_partials,
    )

    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(PASSTHROUGH_QUOTAS_YAML)
    settings = load_config([str(quotas)]).quota_settings()
    requests = prepare_requests(read_capture(spark, str(capture_dir)))
    common: dict[str, Any] = {
        "throttle_factory": functools.partial(engine_replay_functions, settings),
        "options": replay_options(settings, mode),  # type: ignore[arg-type]  # mode: a parametrised str
    }
    rows = simulate(spark, requests, **common)
    unit = 3
    partials = simulate_partials(spark, requests, peaks=True, moved_unit=unit, **common)
    client = ["principal", "client_id"]
    pd.testing.assert_frame_equal(
        _sorted(client_outcomes_from_partials(partials), client), _sorted(client_outcomes(rows), client)
    )
    peaks = ["broker", "api_key"]
    pd.testing.assert_frame_equal(
        _sorted(broker_peaks_from_partials(partials), peaks), _sorted(broker_peaks(rows), peaks)
    )
    pd.testing.assert_frame_equal(
        _sorted(calibration_from_partials(partials), client), _sorted(calibration(rows), client)
    )
    moved = moved_bytes_from_partials(partials).toPandas().set_index(["broker", "api_key", "bucket"]).sort_index()
    expected = _moved_from_rows(rows, unit)
    pd.testing.assert_frame_equal(moved.astype(float), expected.astype(float))
    # Not vacuous: the quotas throttle some requests, and in deferral mode move bytes across buckets.
    assert (rows.toPandas()["sim_throttle_ms"] > 0).any()
    assert mode == "open_loop" or len(expected) > 0


def test_charged_replays_give_simulates_tables_config_after_config(
    spark: Any, capture_dir: Path, tmp_path: Path
) -> None:
    """advise's rounds (kqp.spark_jobs.replay_rounds): the rows charged and partitioned by task
    once, each replay one pass over them, give the tables simulate_partials gives, value for
    value, for one config after another: two with the same grouping (the cache reused, a task
    app-8 and app-9 passed through in each) and one linking a user's client-ids (the cache rebuilt)."""
    from kqp.config import load_config
    from kqp.spark_jobs.replay_rounds import ChargedReplays
    from kqp.spark_jobs.whatif import (
        calibration_from_partials,
        client_outcomes_from_partials,
        engine_replay_functions,
        moved_bytes_from_partials,
        replay_options,
        replay_traffic,
        simulate_partials,
    )

    tighter = PASSTHROUGH_QUOTAS_YAML.replace("40000", "25000").replace("60000", "30000")
    requests = prepare_requests(read_capture(spark, str(capture_dir)))
    traffic = replay_traffic(requests)
    replays = ChargedReplays(spark, requests, traffic)
    unit = 3
    client = ["principal", "client_id"]
    bucket = ["broker", "api_key", "bucket"]
    throttled = []
    for number, text in enumerate((PASSTHROUGH_QUOTAS_YAML, tighter, QUOTAS_YAML)):
        quotas = tmp_path / f"quotas-{number}.yaml"
        quotas.write_text(text)
        settings = load_config([str(quotas)]).quota_settings()
        factory = functools.partial(engine_replay_functions, settings)
        options = replay_options(settings, "deferral")
        expected = simulate_partials(spark, requests, factory, options, moved_unit=unit, traffic=traffic)
        replayed = replays.partials(factory, options, moved_unit=unit)
        outcomes = _sorted(client_outcomes_from_partials(replayed), client)
        pd.testing.assert_frame_equal(outcomes, _sorted(client_outcomes_from_partials(expected), client))
        pd.testing.assert_frame_equal(
            _sorted(calibration_from_partials(replayed), client), _sorted(calibration_from_partials(expected), client)
        )
        pd.testing.assert_frame_equal(
            _sorted(moved_bytes_from_partials(replayed), bucket), _sorted(moved_bytes_from_partials(expected), bucket)
        )
        throttled.append(int(outcomes["throttled_requests"].sum()))
    replays.release()
    # Not vacuous: every config throttles, and the tighter default more than the first.
    assert all(count > 0 for count in throttled) and throttled[1] > throttled[0]
