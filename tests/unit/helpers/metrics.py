"""What a ProxyMetrics registry exposes, as Prometheus sample names."""

from __future__ import annotations

from prometheus_client import Metric

from kqp.proxy.metrics import ProxyMetrics


def registered_metric_names(metrics: ProxyMetrics) -> set[str]:
    """Every sample name ProxyMetrics can expose (e.g. `kqp_requests_total`, `..._bucket`)."""
    names: set[str] = set()
    for family in metrics.registry.collect():
        names.update(_sample_names(family))
    return names


def _sample_names(family: Metric) -> set[str]:
    # prometheus_client names a counter family without its `_total` suffix and adds
    # `_created` samples to counters and histograms.
    if family.type == "counter":
        return {family.name + "_total", family.name + "_created"}
    if family.type == "histogram":
        return {family.name + suffix for suffix in ("_bucket", "_sum", "_count", "_created")}
    return {family.name}
