"""The SparkSession kqp builds for local runs."""

from __future__ import annotations

from typing import Any


def test_a_local_session_listens_on_loopback_only(spark: Any) -> None:
    # Spark's default binds the driver and block manager to every interface of the host; a
    # local run has nothing elsewhere that needs to reach it.
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.driver.bindAddress") == "127.0.0.1"
    assert conf.get("spark.driver.host") == "127.0.0.1"
