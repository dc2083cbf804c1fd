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
from kqp.spark_jobs.synthetic import write_capture
from tests.spark.helpers import SPEC, TEST_JVM_OPTIONS


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
            "spark.driver.extraJavaOptions": TEST_JVM_OPTIONS,
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def kafka(kafka_1node: KafkaCluster) -> KafkaCluster:
    """The real single-node Kafka broker (harness/local_kafka.py) for live, the advice's closed loop
    and the real capture: tests/conftest.py's, which the integration tests used before them in the
    same pytest (their topics and client-ids are their own)."""
    return kafka_1node


@pytest.fixture(scope="session")
def capture_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("capture")
    write_capture(SPEC, directory)
    return directory


@pytest.fixture(scope="session")
def capture_rows(capture_dir: Path) -> pd.DataFrame:
    """The capture as pandas, read independently of the jobs."""
    return ds.dataset(str(capture_dir), format="parquet", partitioning="hive").to_table().to_pandas()


