"""`kqp replay advise` on a synthetic capture with three noisy producers over a given capacity.

The figures the job starts from (each broker's NW_IN at the p99 of 1 s buckets) are
recomputed here with pandas from the Parquet files; the advised file is checked the way a
user would (`kqp check-config`) and through the proxy's engine (which limit each captured
client resolves to).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest

from kqp.cli import main as kqp_main
from kqp.spark_jobs.synthetic import SyntheticSpec, write_capture

pytestmark = pytest.mark.spark

# The skewed population of the other Spark tests, plus three producers sending ~1.4 MB/s
# each to every broker, steadily.
NOISY_SPEC = SyntheticSpec(
    requests=6_000,
    seconds=60,
    brokers=3,
    clients=10,
    principals=4,
    topics=5,
    seed=11,
    noisy_clients=3,
    noisy_requests_per_s=100,
    noisy_batch_bytes=30_000,
)
NOISY = {"noisy-0", "noisy-1", "noisy-2"}
# NW_IN 5,500 KB/s x 0.8 = 4.5 MB/s per broker: above what the ten others send at their
# p99 (under 1 MB/s per broker), below what the noisy three add.
CAPACITY = {
    "brokerCapacities": [
        {"brokerId": "-1", "capacity": {"DISK": "100000", "CPU": "100", "NW_IN": "5500", "NW_OUT": "50000"}}
    ]
}
CURRENT = 'quotas:\n  entries:\n    - entity: {client-id: "<default>"}\n      producer_byte_rate: 1048576\n'


@pytest.fixture(autouse=True)
def keep_test_shuffle_partitions(spark: Any) -> Iterator[None]:
    before = spark.conf.get("spark.sql.shuffle.partitions")
    yield
    spark.conf.set("spark.sql.shuffle.partitions", before)


@pytest.fixture(scope="module")
def noisy_capture(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("advise")
    write_capture(NOISY_SPEC, work / "capture")
    (work / "capacity.json").write_text(json.dumps(CAPACITY))
    (work / "current.yaml").write_text(CURRENT)
    return {"capture": work / "capture", "capacity": work / "capacity.json", "current": work / "current.yaml"}


def advise(paths: dict[str, Path], output: Path, *extra: str) -> int:
    return kqp_main(
        [
            "replay",
            "advise",
            str(paths["capture"]),
            "--capacity",
            str(paths["capacity"]),
            "--output",
            str(output),
            "--replication-factor",
            "1",
            # A 2 x 1 s quota window: Kafka's 11 s one lets a throttled client burst for seconds
            # between throttles, which a per-second p99 cannot absorb (docs/replay.md).
            "--window-num",
            "2",
            "--master",
            "local[2]",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def advised(spark: Any, noisy_capture: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("advised")
    assert advise(noisy_capture, output, "--current", str(noisy_capture["current"])) == 0
    return output


def test_the_capacity_is_exceeded_before_the_advice(advised: Path, noisy_capture: dict[str, Path]) -> None:
    rows = ds.dataset(str(noisy_capture["capture"]), format="parquet", partitioning="hive").to_table().to_pandas()
    second = rows["ts_request_received_us"] // 1_000_000
    seconds = range(second.min(), second.max() + 1)
    loads = pd.read_csv(advised / "csv" / "broker_loads.csv").set_index(["broker", "resource"])
    for broker, on_broker in rows.groupby("upstream_node_id"):
        per_second = on_broker.groupby(second[on_broker.index])["request_bytes"].sum().reindex(seconds, fill_value=0)
        assert loads.loc[(broker, "NW_IN"), "before"] == pytest.approx(np.percentile(per_second, 99))
    nw_in = loads.xs("NW_IN", level="resource")
    assert list(nw_in.index[nw_in["before"] > nw_in["limit"]]) == [0, 1]  # broker 2 is just under


def test_exactly_the_noisy_three_are_limited_and_the_replay_fits(advised: Path) -> None:
    advice = pd.read_csv(advised / "csv" / "advice.csv")
    assert set(advice.loc[advice["limited"], "entity"]) == {f"client-id={name}" for name in NOISY}
    replay = pd.read_csv(advised / "csv" / "replay_clients.csv")
    throttled = set(replay.loc[replay["throttled_requests"] > 0, "client_id"])
    assert throttled == NOISY
    loads = pd.read_csv(advised / "csv" / "broker_loads.csv")
    assert (loads["verified_after"] <= loads["limit"]).all(), loads
    summary = json.loads((advised / "summary.json").read_text())
    assert summary["fits"] and summary["unmet"] == []
    assert summary["schema"] == "kqp.replay.advise/1"


def test_the_advised_file_loads_and_gives_each_client_its_advice(advised: Path, capsys: Any) -> None:
    from kqp.config import load_config
    from kqp.quotas import QuotaEngine

    assert kqp_main(["check-config", str(advised / "quotas.yaml")]) == 0
    text = (advised / "quotas.yaml").read_text()
    assert "throttled" in text and "fair share of broker" in text  # the comments say why
    engine = QuotaEngine(load_config([str(advised / "quotas.yaml")]).quota_settings())
    advice = pd.read_csv(advised / "csv" / "advice.csv")
    produce = advice[advice["quota_type"] == "producer_byte_rate"].set_index("entity")
    replay = pd.read_csv(advised / "csv" / "replay_clients.csv")
    for pair in replay.itertuples():
        limit = engine.quota("producer_byte_rate", pair.principal, pair.client_id)
        row = produce.loc[f"client-id={pair.client_id}"] if f"client-id={pair.client_id}" in produce.index else None
        if pair.client_id in NOISY:
            assert row is not None and limit == row["quota_bytes_per_s"]
        elif row is not None:
            # A quiet producer: whatever entry covers it is above the highest rate it reached.
            assert limit is None or limit >= row["demand_peak_bytes_per_s"]
    diff = pd.read_csv(advised / "csv" / "diff.csv")
    assert diff["current_producer_byte_rate"].eq(1048576).all()
    page = (advised / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3


def test_protecting_the_noisy_three_cannot_fit_and_exits_3(
    noisy_capture: dict[str, Path], tmp_path: Path, spark: Any
) -> None:
    protect = [argument for name in sorted(NOISY) for argument in ("--protect", name)]
    assert advise(noisy_capture, tmp_path, *protect) == 3
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert not summary["fits"]
    # Brokers 0 and 1: the three alone are over their NW_IN limit.
    assert [reason.split(":")[0] for reason in summary["unmet"]] == ["broker 0 NW_IN", "broker 1 NW_IN"]
    assert all("protected client-id=noisy-0, client-id=noisy-1" in reason for reason in summary["unmet"])
