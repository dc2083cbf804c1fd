"""The one place a SparkSession is created.

Under `spark-submit` the master comes from the command line, so the code must not set one
(a master set on SparkConf beats `--master`). Only when a job is started directly
(`python -m kqp.spark_jobs...` or `kqp replay ...`) do we pass one, defaulting to
`local[*]`.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from typing import cast

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

DEFAULT_MASTER = "local[*]"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
# Capture Parquet per shuffle partition. Spark's default of 200 partitions turns a capture of a
# few MB into stages of 200 mostly empty tasks (measured: a 20,000-request capture ran 200-task
# stages at ~0.3 s a task on a busy 2-core machine). A 10M-request capture (~570 MB) gets 9.
CAPTURE_BYTES_PER_SHUFFLE_PARTITION = 64 * 2**20
# Local runs hold everything in the driver JVM, whose default heap (1 GB) makes a 10M-request
# capture spill its cache to disk. The heap is reserved lazily, so small runs do not pay for it.
LOCAL_DRIVER_MEMORY = "4g"

# Settings every job relies on: UTC windows regardless of the host, Arrow for the pandas
# hand-offs (applyInPandas, toPandas), and no speculative duplicates of `live` tasks (a
# duplicate task would send its slice of traffic twice).
BASE_CONF: Mapping[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.speculation": "false",
}


def launched_by_spark_submit() -> bool:
    """True when spark-submit started this Python process (it exports the master it chose)."""
    return os.environ.get("PYSPARK_GATEWAY_PORT") is not None


def get_spark(
    app_name: str,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Return the active SparkSession, or build one.

    Args:
        app_name: shown in the Spark UI and logs.
        master: a master URL (`local[2]`, `spark://host:7077`, `yarn`, `k8s://...`). None means
            "whatever spark-submit chose", or `local[*]` when not launched by spark-submit.
        conf: extra settings, applied after BASE_CONF.
    """
    builder = SparkSession.builder.appName(app_name)
    if master is None and not launched_by_spark_submit():
        master = DEFAULT_MASTER
    settings = dict(BASE_CONF)
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local"):
            settings["spark.driver.memory"] = LOCAL_DRIVER_MEMORY
            # Local Python workers must use this interpreter (the virtualenv with pandas,
            # numpy and kqp), not whatever `python3` is first on PATH.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            # A local run has no executor elsewhere to reach it: its driver, block manager and
            # UI listen on loopback only, not on every interface of the host (Spark's default).
            # A user who wants the UI from another host sets SPARK_LOCAL_IP or these keys.
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            settings["spark.driver.host"] = "127.0.0.1"
            settings["spark.driver.bindAddress"] = "127.0.0.1"
    for key, value in {**settings, **(conf or {})}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def fit_shuffle_partitions(spark: SparkSession, input_path: str) -> int:
    """Size the shuffle partitions to the input, unless the user set them; returns the number used.

    One partition per CAPTURE_BYTES_PER_SHUFFLE_PARTITION of input, and at least one per core
    (Spark's default parallelism: the executors' cores, or local[N]'s N), so a small capture runs
    a task per core on any master. `--conf spark.sql.shuffle.partitions=N` still wins.
    """
    if spark.sparkContext.getConf().contains(SHUFFLE_PARTITIONS):
        return int(spark.conf.get(SHUFFLE_PARTITIONS) or 0)
    # The Hadoop file system Spark itself reads with: local paths and any Hadoop-compatible URI.
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(input_path)
    size = int(path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).getContentSummary(path).getLength())
    partitions = max(spark.sparkContext.defaultParallelism, math.ceil(size / CAPTURE_BYTES_PER_SHUFFLE_PARTITION), 1)
    spark.conf.set(SHUFFLE_PARTITIONS, str(partitions))
    return partitions


def to_pandas(frame: DataFrame) -> pd.DataFrame:
    """Collect a (small) result to the driver as pandas."""
    return cast(pd.DataFrame, frame.toPandas())
