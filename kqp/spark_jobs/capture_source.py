"""Extract: read a capture directory into Spark, and its footers on the driver.

The schema is given explicitly (derived from `kqp.capture.schema`), never inferred, so a
capture with a column missing in older files (`sampling_one_in`) still reads, as nulls.
Files under `date=YYYY-MM-DD/hour=HH/` are found by Spark's partition discovery; hidden
in-progress files (leading dot) are skipped by Spark itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from kqp.capture.schema import (
    CAPTURE_SCHEMA,
    META_RECORDS_DROPPED,
    META_RECORDS_INVALID,
    META_RECORDS_WRITTEN,
)
from kqp.spark_jobs.session import fit_shuffle_partitions

US_PER_SECOND = 1_000_000


def capture_struct_type() -> StructType:
    """The capture schema as a Spark StructType."""
    schema: StructType = from_arrow_schema(CAPTURE_SCHEMA)
    return schema


def read_capture(
    spark: SparkSession,
    path: str,
    start_us: int | None = None,
    end_us: int | None = None,
) -> DataFrame:
    """All capture rows under `path` (a local path or any Hadoop-compatible URI).

    Every job reads its capture here, so this is also where the session's shuffle partitions
    are sized to the capture (session.fit_shuffle_partitions).

    Args:
        start_us / end_us: optional [start, end) filter on `ts_request_received_us`.
    """
    fit_shuffle_partitions(spark, path)
    frame = spark.read.schema(capture_struct_type()).option("basePath", path).parquet(path)
    # Partition columns (date, hour) are only a layout detail; every job works from timestamps.
    frame = frame.select(*[F.col(name) for name in CAPTURE_SCHEMA.names])
    if start_us is not None:
        frame = frame.where(F.col("ts_request_received_us") >= start_us)
    if end_us is not None:
        frame = frame.where(F.col("ts_request_received_us") < end_us)
    return frame


@dataclass(frozen=True)
class FooterCoverage:
    """What the writers said about completeness, summed over the files' footers."""

    files: int
    records_written: int
    records_dropped: int
    records_invalid: int

    @property
    def coverage(self) -> float | None:
        submitted = self.records_written + self.records_dropped
        return self.records_written / submitted if submitted else None


def read_footer_coverage(path: str) -> FooterCoverage | None:
    """Sum footer counters of a local capture; None for remote URIs (not read on the driver)."""
    if "://" in path and not path.startswith("file://"):
        return None
    root = Path(path.removeprefix("file://"))
    files = written = dropped = invalid = 0
    for file in sorted(root.rglob("*.parquet")):
        if file.name.startswith("."):
            continue
        metadata = pq.read_metadata(file).metadata or {}
        files += 1
        written += int(metadata.get(META_RECORDS_WRITTEN, b"0"))
        dropped += int(metadata.get(META_RECORDS_DROPPED, b"0"))
        invalid += int(metadata.get(META_RECORDS_INVALID, b"0"))
    return FooterCoverage(files=files, records_written=written, records_dropped=dropped, records_invalid=invalid)
