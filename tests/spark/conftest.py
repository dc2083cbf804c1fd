"""One local Spark session per test session, and small synthetic captures.

Every figure the Spark tests check is recomputed here with pandas straight from the
Parquet files (pyarrow), not through the job's code.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pytest

from harness.local_kafka import KafkaCluster
from kqp.spark_jobs.synthetic import SyntheticSpec, write_capture

SPEC = SyntheticSpec(requests=12_000, seconds=90, brokers=3, clients=10, principals=4, topics=5, seed=11)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from kqp.spark_jobs.session import get_spark

    session = get_spark(
        "kqp-tests",
        "local[2]",
        {
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.default.parallelism": "2",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaCluster]:
    """One real single-node Kafka broker (harness/local_kafka.py) for live and the real capture."""
    with KafkaCluster(nodes=1) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def capture_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("capture")
    write_capture(SPEC, directory)
    return directory


@pytest.fixture(scope="session")
def capture_rows(capture_dir: Path) -> pd.DataFrame:
    """The capture as pandas, read independently of the jobs."""
    return ds.dataset(str(capture_dir), format="parquet", partitioning="hive").to_table().to_pandas()


def exploded(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (request, partition) entry, with the request's columns."""
    with_parts = rows[rows["partitions"].notna()][
        ["api_key", "client_id", "upstream_node_id", "ts_request_received_us", "partitions"]
    ]
    flat = with_parts.explode("partitions").dropna(subset=["partitions"])
    details = pd.DataFrame(list(flat["partitions"]), index=flat.index)
    return pd.concat([flat.drop(columns="partitions"), details], axis=1)
