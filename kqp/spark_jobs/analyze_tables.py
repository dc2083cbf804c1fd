"""`analyze`'s driver-side shaping: the (small) aggregates its Spark passes bring back
(kqp.spark_jobs.analyze_transform) made into series, statistics and tables, with pandas.

Pure: no Spark, no reading, no writing. The names of the statistics, resolutions, metrics and
columns the two sides share are defined here, below the Spark side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from kqp.quotas import capacity as cap

# Exact percentiles for the throughput series (one value per second or minute: few enough
# rows for Spark's exact `percentile`) and for per-request latency (the same percentiles of
# the requests, from the count of each latency value: latency_by_api).
PERCENTILES = (0.5, 0.95, 0.99, 0.999)
PERCENTILE_NAMES = ("p50", "p95", "p99", "p99_9")
STATS = (*PERCENTILE_NAMES, "max")
# Series resolutions, in seconds per bucket: 1 s shows the bursts a broker's network
# feels; 1 min is what most dashboards (and capacity plans) are drawn at.
RESOLUTIONS = {"1s": 1, "1min": 60}

# Additive per-bucket metrics of a throughput series (rates in bytes/s or requests/s).
ADDITIVE_METRICS = ("produce_bytes", "fetch_bytes", "bytes_in", "bytes_out", "requests")
NETWORK_METRICS = ("replication_in", "replication_out", "nw_in", "nw_out")
SERIES_METRICS = (*ADDITIVE_METRICS, "connections", *NETWORK_METRICS)
RESOURCE_OF_METRIC = {"nw_in": cap.NW_IN, "nw_out": cap.NW_OUT}

# Batch-size buckets (upper bounds, bytes). Google's sizing notes flag batches under 10 KB
# as CPU-expensive; the edges are powers of ten around that.
BATCH_BUCKETS = ((1_000, "<1KB"), (10_000, "1-10KB"), (100_000, "10-100KB"), (1_000_000, "100KB-1MB"))
BATCH_BUCKET_LAST = ">=1MB"
# A batch under this size counts in a client's small-batch share.
SMALL_BATCH_BYTES = 10_000
# The Pareto summary reports how few entities carry this share of the bytes.
PARETO_SHARE = 0.8

# The per-entity sums every share and throttle table is made of.
ENTITY_SUMS = ("requests", "bytes_in", "bytes_out", "produce_bytes", "fetch_bytes")


# analyze_transform.entry_aggregates' sets: which figure a row of its result is for.
PARTITION_SECOND_SET = 0
PRODUCE_REQUEST_SET = 1
PRODUCE_BATCH_SET = 2


# Column names the Spark aggregates write and the tables read.
def api_column(api_key: int) -> str:
    return f"requests_api_{api_key}"


def bucket_column(label: str, what: str) -> str:
    return f"{what}:{label}"


# ---------------------------------------------------------------- series and their statistics (pandas)


def bucket_series(
    per_second: pd.DataFrame,
    unit_seconds: int,
    bucket_range: tuple[int, int],
    brokers: Sequence[int],
    api_keys: Sequence[int],
    connections: pd.DataFrame | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The throughput series per broker and bucket, and the requests per API key, from
    broker_second_totals' rows.

    Rates are per-second averages over the captured seconds of the bucket (the first and last
    buckets are usually partial, and an edge of the capture must not look like a dip); every
    bucket of the capture window is present, zeros where a broker was idle, so percentiles count
    idle seconds. `connections` (bucket_connections' rows) is needed for buckets longer than 1 s.
    Returns (broker series, API series), column for column what analyze writes.
    """
    first_second, last_second = bucket_range
    buckets = np.arange(first_second // unit_seconds, last_second // unit_seconds + 1, dtype=np.int64)
    start = buckets * unit_seconds
    covered = (np.minimum(start + unit_seconds - 1, last_second) - np.maximum(start, first_second) + 1).astype(float)
    grid = pd.MultiIndex.from_product([list(brokers), buckets], names=["broker", "bucket"])
    covered_s = np.tile(covered, len(brokers))
    window_start = pd.to_datetime(np.tile(start, len(brokers)), unit="s")

    api_columns = [api_column(key) for key in api_keys]
    keyed = per_second.assign(bucket=per_second["second"] // unit_seconds)
    summed = keyed.groupby(["broker", "bucket"])[[*ADDITIVE_METRICS, *api_columns]].sum().reindex(grid, fill_value=0.0)
    if unit_seconds == 1:
        distinct = keyed.set_index(["broker", "bucket"])["connections"]
    else:
        if connections is None:
            raise ValueError("buckets longer than 1 s need their own distinct connection counts")
        distinct = connections.set_index(["broker", "bucket"])["connections"]
    distinct = distinct.reindex(grid, fill_value=0.0).astype(float)

    series = pd.DataFrame(
        {
            "broker": grid.get_level_values("broker").astype(np.int32),
            "bucket": grid.get_level_values("bucket").astype(np.int64),
            "window_start": window_start,
            **{m: summed[m].to_numpy(dtype=float) / covered_s for m in ADDITIVE_METRICS},
            "connections": distinct.to_numpy(),
        }
    )
    api_series = pd.concat(
        [
            pd.DataFrame(
                {
                    "broker": series["broker"],
                    "bucket": series["bucket"],
                    "api_key": np.int32(key),
                    "window_start": series["window_start"],
                    "requests": summed[api_column(key)].to_numpy(dtype=float) / covered_s,
                }
            )
            for key in api_keys
        ],
        ignore_index=True,
    )
    return series, api_series


def with_replication(series: pd.DataFrame, replication_factor: int, broker_count: int) -> pd.DataFrame:
    """Add modelled follower traffic and total network in/out per broker and bucket.

    The proxy never sees replication, so it is modelled: every byte a leader takes in is
    fetched by RF-1 followers (the leader's extra outbound), and followers are spread evenly
    over the other brokers, so a broker takes in (RF-1)/(N-1) of every other leader's bytes.
    RF is capped at the broker count. replication_out = (RF-1) x produce, replication_in =
    (RF-1)/(N-1) x (cluster produce - own produce); nw_in = all client request bytes +
    replication_in, nw_out = all client response bytes + replication_out.
    """
    followers = min(replication_factor, broker_count) - 1
    frame = series.copy()
    if followers <= 0 or broker_count <= 1:
        frame["replication_in"] = 0.0
        frame["replication_out"] = 0.0
    else:
        cluster_produce = frame.groupby("bucket")["produce_bytes"].transform("sum")
        frame["replication_in"] = (cluster_produce - frame["produce_bytes"]) * (followers / (broker_count - 1))
        frame["replication_out"] = frame["produce_bytes"] * float(followers)
    frame["nw_in"] = frame["bytes_in"] + frame["replication_in"]
    frame["nw_out"] = frame["bytes_out"] + frame["replication_out"]
    # The bucket first, as the tables have always been written (a join on it put it there).
    return frame[["bucket", *[c for c in frame.columns if c != "bucket"]]]


def without_broker(series: pd.DataFrame, lost: int, replication_factor: int, broker_count: int) -> pd.DataFrame:
    """Series as if broker `lost` failed: its client traffic spread evenly over the survivors.

    Leaders move to the survivors (even re-homing), then replication is recomputed for
    N-1 brokers. Input is a series before with_replication.
    """
    survivors = broker_count - 1
    moved_metrics = [*ADDITIVE_METRICS, "connections"]
    lost_traffic = series[series["broker"] == lost].set_index("bucket")[moved_metrics]
    moved = series[series["broker"] != lost].reset_index(drop=True)
    for metric in moved_metrics:
        moved[metric] = moved[metric] + moved["bucket"].map(lost_traffic[metric]).to_numpy() / survivors
    return with_replication(moved, replication_factor, survivors)


def cluster_series(series: pd.DataFrame) -> pd.DataFrame:
    """Cluster-wide series: the sum over brokers per bucket (connections are per broker, so they add)."""
    metrics = [m for m in SERIES_METRICS if m in series.columns]
    return series.groupby(["bucket", "window_start"], as_index=False)[metrics].sum()


def exact_percentiles(values: np.ndarray, percentages: Sequence[float]) -> list[float]:
    """Spark's exact `percentile`, value for value: linear interpolation between the order
    statistics at floor and ceil of (n - 1) x p, in the form Spark 4 evaluates it
    (low + fraction x (high - low)), so the figures are those the Spark SQL aggregate gave, to
    the last bit (checked against Spark's own on a 1M-request capture: 160 of 160 equal; the
    textbook (1 - fraction) x low + fraction x high differs in the last bit for 24)."""
    ordered = np.sort(values)
    max_position = len(ordered) - 1
    result = []
    for percentage in percentages:
        position = max_position * percentage
        lower, higher = math.floor(position), math.ceil(position)
        low = float(ordered[lower])
        high = float(ordered[higher])
        if higher == lower or high == low:
            result.append(low)
        else:
            result.append(low + (position - lower) * (high - low))
    return result


STATS_COLUMNS = (
    "scope",
    "broker",
    "metric",
    "mean",
    *PERCENTILE_NAMES,
    "max",
    "max_at",
    "limit",
    "seconds_above_limit",
)


def series_stats(
    series: pd.DataFrame,
    scope: str,
    metrics: Sequence[str],
    unit_seconds: int,
    limits: dict[tuple[str, int | None, str], float] | None,
) -> list[dict[str, Any]]:
    """Mean, exact percentiles, max and the (earliest) time of the max of every metric of each
    broker's series (scope "broker") or of the cluster's (scope "cluster"), and the seconds spent
    above the limit where `limits` gives one for (scope, broker, metric)."""
    rows = []
    groups = series.groupby("broker", sort=False) if scope == "broker" else [(None, series)]
    for broker, frame in groups:
        ordered = frame.sort_values("window_start")
        times = ordered["window_start"].to_numpy()
        key_broker = None if broker is None else int(broker)
        for metric in metrics:
            values = ordered[metric].to_numpy(dtype=float)
            peak = float(values.max())
            limit = (limits or {}).get((scope, key_broker, metric))
            rows.append(
                {
                    "scope": scope,
                    "broker": key_broker,
                    "metric": metric,
                    # Correctly rounded: Spark's own sum depends on how the rows were shuffled,
                    # so the last bit of a mean of fractional rates had no one right value.
                    "mean": math.fsum(values) / len(values),
                    **dict(zip(PERCENTILE_NAMES, exact_percentiles(values, PERCENTILES), strict=True)),
                    "max": peak,
                    "max_at": times[int(np.argmax(values == peak))],
                    "limit": limit,
                    "seconds_above_limit": None if limit is None else int((values > limit).sum()) * unit_seconds,
                }
            )
    return rows


def stats_frame(rows: list[dict[str, Any]], resolution: str, scenario: str) -> pd.DataFrame:
    """series_stats' rows as the throughput_stats table, labelled with resolution and scenario."""
    frame = pd.DataFrame(rows, columns=list(STATS_COLUMNS))
    frame = frame.astype({"broker": float, "limit": float, "seconds_above_limit": float})
    frame.insert(0, "resolution", resolution)
    frame.insert(1, "scenario", scenario)
    return frame


def network_stats(
    series: pd.DataFrame,
    unit_seconds: int,
    limits: dict[tuple[str, int | None, str], float] | None,
    resolution: str,
    scenario: str,
) -> pd.DataFrame:
    """The statistics of every broker's and the cluster's series (with_replication's) at one resolution."""
    rows = series_stats(series, "broker", SERIES_METRICS, unit_seconds, limits)
    rows += series_stats(cluster_series(series), "cluster", SERIES_METRICS, unit_seconds, limits)
    return stats_frame(rows, resolution, scenario)


def api_stats(api_series: pd.DataFrame, unit_seconds: int, resolution: str, names: dict[int, str]) -> pd.DataFrame:
    """Request-count statistics per API, per broker and for the cluster; no limit applies to them."""
    wide = api_series.assign(metric="requests:" + api_series["api_key"].map(names)).pivot_table(
        index=["broker", "bucket", "window_start"], columns="metric", values="requests", aggfunc="sum"
    )
    wide.columns = list(wide.columns)
    wide = wide.reset_index()
    metrics = [f"requests:{names[key]}" for key in sorted(names)]
    rows = series_stats(wide, "broker", metrics, unit_seconds, None)
    cluster = wide.groupby(["bucket", "window_start"], as_index=False)[metrics].sum()
    rows += series_stats(cluster, "cluster", metrics, unit_seconds, None)
    return stats_frame(rows, resolution, "observed")


def network_limits(
    capacity_file: cap.CapacityFile | None, brokers: Sequence[int], thresholds: dict[str, float]
) -> dict[tuple[str, int | None, str], float] | None:
    """Each broker's NW_IN / NW_OUT limit (capacity x threshold, bytes/s) and the cluster's, their sum;
    None without a capacity file: there is then no limit to compare a load with.
    """
    if capacity_file is None:
        return None
    limits: dict[tuple[str, int | None, str], float] = {}
    totals = dict.fromkeys(RESOURCE_OF_METRIC, 0.0)
    for broker in brokers:
        broker_capacity = capacity_file.for_broker(broker)
        for metric, resource in RESOURCE_OF_METRIC.items():
            limit = broker_capacity.network_bytes_per_s(resource) * thresholds[resource]
            limits[("broker", broker, metric)] = limit
            totals[metric] += limit
    limits.update({("cluster", None, metric): limit for metric, limit in totals.items()})
    return limits


# ---------------------------------------------------------------- the traffic sums' tables (pandas)
#
# analyze_transform.aggregate_traffic's rows (one per second, broker, connection, principal,
# client-id, API, version and error code: about 100 per second of capture, a twentieth of the
# requests) come to the driver once; the coverage, the per-second and per-minute totals, the
# per-client totals, the burstiness and the API mix are pandas over them. Every sum is of whole
# requests, bytes or milliseconds (x the whole sampling factor), exact in doubles in any order,
# so they are the sums Spark gave over the same rows; distinct counts and extremes do not depend
# on order either.

# The per-entity throttle sums and maxima of the throttle table.
THROTTLE_SUMS = ("broker_throttled", "broker_throttle_ms_total", "proxy_throttled", "proxy_throttle_ms_total")
THROTTLE_MAXIMA = ("broker_throttle_ms_max", "proxy_throttle_ms_max")


def traffic_coverage(traffic: pd.DataFrame) -> dict[str, Any]:
    """What the capture spans: rows and requests, first and last request, seconds, distinct
    client-ids, principals and connections, and the brokers, API keys and sampling factors seen."""
    return {
        "rows": int(traffic["rows"].sum()),
        "requests": float(traffic["requests"].sum()),
        "first_us": int(traffic["first_us"].min()) if len(traffic) else None,
        "last_us": int(traffic["last_us"].max()) if len(traffic) else None,
        "first_second": int(traffic["second"].min()) if len(traffic) else None,
        "last_second": int(traffic["second"].max()) if len(traffic) else None,
        "client_ids": int(traffic["client_id"].nunique()),
        "principals": int(traffic["principal"].nunique()),
        "connections": int(traffic["connection_id"].nunique()),
        "brokers": sorted(int(b) for b in traffic["broker"].unique()),
        "api_keys": sorted(int(k) for k in traffic["api_key"].unique()),
        # Spark's cast of a double to int truncates, as astype does.
        "sampling_one_in": sorted(int(w) for w in traffic["weight"].astype(np.int64).unique()),
    }


def _distinct_connections(grouped: Any) -> pd.Series:
    """Distinct connections per group, each standing for `weight` connections (a sampled capture)."""
    return grouped["connection_id"].nunique().astype(float) * grouped["weight"].max()


def broker_second_totals(traffic: pd.DataFrame, api_keys: Sequence[int]) -> pd.DataFrame:
    """Per (broker, second): the additive metrics, distinct connections and requests per API key.

    The 1 s series are these rows; the coarser ones are their sums (connections excepted:
    distinct counts do not add, see bucket_connections).
    """
    keys = ["broker", "second"]
    per_api = traffic[keys].assign(
        **{api_column(key): traffic["requests"].where(traffic["api_key"] == key, 0.0) for key in api_keys}
    )
    grouped = traffic.groupby(keys, sort=False)
    totals = grouped[list(ADDITIVE_METRICS)].sum()
    totals["connections"] = _distinct_connections(grouped)
    totals = totals.join(per_api.groupby(keys, sort=False).sum())
    return totals.reset_index()


def bucket_connections(traffic: pd.DataFrame, unit_seconds: int) -> pd.DataFrame:
    """Per (broker, bucket of `unit_seconds`): distinct connections (x the sampling factor)."""
    grouped = traffic.assign(bucket=traffic["second"] // unit_seconds).groupby(["broker", "bucket"], sort=False)
    return _distinct_connections(grouped).rename("connections").reset_index()


def client_totals(traffic: pd.DataFrame) -> pd.DataFrame:
    """Per (broker, principal, client-id): requests, bytes and throttles.

    The shares of principals, client-ids and (principal, client-id), each broker's clients and
    the throttle table are all sums of these rows (entity_totals and friends).
    """
    grouped = traffic.groupby(["broker", "principal", "client_id"], sort=False)
    totals = grouped[[*ENTITY_SUMS, *THROTTLE_SUMS]].sum()
    return totals.join(grouped[list(THROTTLE_MAXIMA)].max()).reset_index()


def api_error_totals(traffic: pd.DataFrame) -> pd.DataFrame:
    """Requests per (API key, API version, error code): the API mix and the error table."""
    return traffic.groupby(["api_key", "api_version", "error_code"], as_index=False, dropna=False)["requests"].sum()


def client_burstiness(traffic: pd.DataFrame) -> pd.DataFrame:
    """Per client-id: median and p99 of its bytes/s over the seconds it was active (Spark's exact
    `percentile`: counted_percentiles, each second counted once), and their ratio."""
    per_second = (
        traffic.assign(value=traffic["bytes_in"] + traffic["bytes_out"])
        .groupby(["client_id", "second"], sort=False)["value"]
        .sum()
        .reset_index()
        .assign(n=1)
    )
    quantiles = counted_percentiles(per_second, "client_id", [0.5, 0.99])
    frame = pd.DataFrame(
        {
            "entity": quantiles.index.to_numpy(dtype=object),
            "active_seconds": per_second.groupby("client_id")["n"].sum().reindex(quantiles.index).to_numpy(np.int64),
            "active_p50_bytes_per_s": quantiles[0.5].to_numpy(),
            "active_p99_bytes_per_s": quantiles[0.99].to_numpy(),
        }
    )
    # A median of zero bytes/s gives no ratio (Spark's division gives null, not infinity).
    median = frame["active_p50_bytes_per_s"]
    frame["burstiness"] = (frame["active_p99_bytes_per_s"] / median).where(median != 0)
    return frame


# ---------------------------------------------------------------- entity and partition tables (pandas)


def entity_totals(clients: pd.DataFrame, dimension: str) -> pd.DataFrame:
    """Requests and bytes per principal, client-id or (principal, client-id), from client_totals' rows."""
    key = clients["principal"] + " / " + clients["client_id"] if dimension == "principal_client" else clients[dimension]
    totals = clients.groupby(key.rename("entity"), dropna=False)[list(ENTITY_SUMS)].sum().reset_index()
    totals["bytes"] = totals["bytes_in"] + totals["bytes_out"]
    return totals


def client_broker_totals(clients: pd.DataFrame) -> pd.DataFrame:
    """Requests and bytes per (broker, client-id), for per-broker shares."""
    totals = clients.groupby(["broker", "client_id"], as_index=False)[["requests", "bytes_in", "bytes_out"]].sum()
    totals["bytes"] = totals["bytes_in"] + totals["bytes_out"]
    return totals.drop(columns=["bytes_in", "bytes_out"])


def throttle_counts(clients: pd.DataFrame) -> pd.DataFrame:
    """Per (principal, client-id): throttles the broker returned vs throttles the proxy applied."""
    grouped = clients.groupby(["principal", "client_id"], as_index=False).agg(
        requests=("requests", "sum"),
        **{
            f"{side}_{column}": (f"{side}_{column}", how)
            for side in ("broker", "proxy")
            for how, column in (("sum", "throttled"), ("sum", "throttle_ms_total"), ("max", "throttle_ms_max"))
        },
    )
    return grouped[(grouped["broker_throttled"] > 0) | (grouped["proxy_throttled"] > 0)]


def error_counts(api_errors: pd.DataFrame) -> pd.DataFrame:
    """Per API key and error code: responses with that error and the share of the API's responses."""
    per_api = api_errors.groupby("api_key")["requests"].sum().rename("api_requests")
    errors = (
        api_errors[api_errors["error_code"] != 0].groupby(["api_key", "error_code"], as_index=False)["requests"].sum()
    )
    errors = errors.join(per_api, on="api_key")
    errors["share"] = errors["requests"] / errors["api_requests"]
    return errors


def api_mix(api_errors: pd.DataFrame) -> pd.DataFrame:
    """Requests per (API key, API version)."""
    return api_errors.groupby(["api_key", "api_version"], as_index=False)["requests"].sum()


def counted_percentiles(counted: pd.DataFrame, key: str, percentages: Sequence[float]) -> pd.DataFrame:
    """Per `key`: Spark's exact `percentile` of `value` with the counts `n` as frequencies, one
    column per percentage (named by it), for every key with a non-null value.

    Value for value what Spark gives (and exact_percentiles of the values repeated `n` times):
    the order statistics at floor and ceil of (count - 1) x p, the first value whose running
    count passes the rank, interpolated as low + fraction x (high - low). All keys at once:
    the rows sorted by (key, value) and one running count over all of them, each key's ranks
    offset by the counts of the keys before it.
    """
    rows = counted[counted["value"].notna()].sort_values([key, "value"], kind="stable")
    values = rows["value"].to_numpy(dtype=float)
    running = np.cumsum(rows["n"].to_numpy())
    totals = rows.groupby(key, sort=False)["n"].sum()
    before = np.cumsum(totals.to_numpy()) - totals.to_numpy()
    max_position = totals.to_numpy() - 1
    result = pd.DataFrame(index=totals.index)
    for percentage in percentages:
        position = max_position * percentage
        lower, higher = np.floor(position), np.ceil(position)
        low = values[np.searchsorted(running, before + lower, side="right")]
        high = values[np.searchsorted(running, before + higher, side="right")]
        interpolated = low + (position - lower) * (high - low)
        result[percentage] = np.where((higher == lower) | (high == low), low, interpolated)
    return result


LATENCY_COLUMNS = (
    "api_key",
    "broker",
    "responses",
    *[f"{name}_ms" for name in PERCENTILE_NAMES],
    "max_ms",
    *[f"broker_{name}_ms" for name in PERCENTILE_NAMES],
    "broker_max_ms",
)


def latency_by_api(counts: pd.DataFrame) -> pd.DataFrame:
    """Latency percentiles at the proxy and to the broker, per (API key, broker) and per API
    key (the rows with a null broker), exact: counted_percentiles of analyze_transform.
    latency_counts' rows, the percentiles Spark's `percentile` gives of the requests the
    counts stand for."""
    per_broker = _latency_figures(counts, ["api_key", "broker"])
    per_api = _latency_figures(counts, ["api_key"]).assign(broker=np.nan)
    return pd.concat([per_broker, per_api], ignore_index=True)[list(LATENCY_COLUMNS)]


def _latency_figures(counts: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """latency_by_api's figures per `keys`, from the counts of both latencies."""
    counts = counts.assign(group=counts.groupby(keys, sort=False).ngroup())
    figures = counts.groupby("group", sort=False)[keys].first()
    for column, prefix in (("latency_ms", ""), ("broker_latency_ms", "broker_")):
        counted = counts[counts[column].notna()].rename(columns={column: "value"})
        percentiles = counted_percentiles(counted, "group", PERCENTILES)
        for percentage, name in zip(PERCENTILES, PERCENTILE_NAMES, strict=True):
            figures[f"{prefix}{name}_ms"] = percentiles[percentage]
        figures[f"{prefix}max_ms"] = counted.groupby("group")["value"].max()
        if column == "latency_ms":
            figures["responses"] = counted.groupby("group")["n"].sum()
    return figures.reset_index(drop=True)


PARTITION_COLUMNS = (
    "topic",
    "partition",
    "leader",
    "requests",
    "produce_bytes",
    "fetch_bytes",
    "produced_records",
    "peak_bytes_per_s",
    "peak_second",
    "bytes",
)


def _whole(frame: pd.DataFrame, types: dict[str, str]) -> pd.DataFrame:
    """Integer columns back to their Spark type where no value is missing (a column with a
    missing value stays float, as Spark's toPandas gives it)."""
    return frame.astype({column: kind for column, kind in types.items() if frame[column].notna().all()})


def partition_totals(entries: pd.DataFrame) -> pd.DataFrame:
    """Per topic-partition: leader, requests, bytes in/out, records produced, peak bytes/s and
    its second (the earliest among ties); the mean over the capture is the caller's (analyze
    computes this before it knows the capture's span).

    From entry_aggregates' per (partition, second) rows (`entries`: its result), their sums
    and the peak second. Topic totals are sums of these rows.
    """
    rows = entries[entries["set"] == PARTITION_SECOND_SET].rename(columns={"name": "topic"})
    keys = ["topic", "partition"]
    totals = (
        rows.groupby(keys, dropna=False, sort=False)
        .agg(
            leader=("leader", "max"),
            requests=("requests", "sum"),
            produce_bytes=("produce_bytes", "sum"),
            fetch_bytes=("fetch_bytes", "sum"),
            produced_records=("produced_records", "sum"),
            peak_bytes_per_s=("bps", "max"),
        )
        .reset_index()
    )
    # The peak's second: the earliest of the seconds at the partition's largest bytes/s.
    at_peak = (
        rows[rows["bps"].notna()]
        .sort_values("second", kind="stable")
        .sort_values([*keys, "bps"], ascending=[True, True, False], kind="stable")
        .drop_duplicates(keys)
    )
    peaks = at_peak[[*keys, "second"]].rename(columns={"second": "peak_second"})
    totals = totals.merge(peaks, on=keys, how="left")
    totals["bytes"] = totals["produce_bytes"] + totals["fetch_bytes"]
    return _whole(totals, {"partition": "int32", "leader": "int32", "peak_second": "int64"})[list(PARTITION_COLUMNS)]


def batch_bucket(batch_bytes: pd.Series) -> pd.Series:
    """The BATCH_BUCKETS class of each batch size: the first upper bound above it; a size at
    or above every bound, or unknown, is in the last class (a comparison with a null is not
    true)."""
    labels = pd.Series(BATCH_BUCKET_LAST, index=batch_bytes.index, dtype=object)
    for upper, label in reversed(BATCH_BUCKETS):
        labels[batch_bytes < upper] = label
    return labels


def produce_batches_by_client(entries: pd.DataFrame) -> pd.DataFrame:
    """Per client-id, from its Produce requests: requests, records per request (p50/p95), mean
    and median batch size, share of small batches, and its batches and bytes in each
    BATCH_BUCKETS class (weighted; the overall batch mix is their sum; none in a class: NaN).

    From entry_aggregates' rows (`entries`: its result): the request figures from the
    PRODUCE_REQUEST_SET rows (requests counted per records value), the batch figures from the
    PRODUCE_BATCH_SET rows (entries counted per mean batch size). The percentiles are exact,
    those Spark's `percentile` gives with the counts as frequencies (counted_percentiles).
    """
    labels = [label for _, label in BATCH_BUCKETS] + [BATCH_BUCKET_LAST]
    requests = entries[entries["set"] == PRODUCE_REQUEST_SET]
    batches = entries[entries["set"] == PRODUCE_BATCH_SET]
    clients = pd.Index(pd.concat([requests["name"], batches["name"]]).unique(), name="name")
    by_client = pd.DataFrame(index=clients)
    by_client["produce_requests"] = requests.groupby("name")["n"].sum()
    records = counted_percentiles(requests, "name", [0.5, 0.95])
    by_client["p50_records_per_request"] = records[0.5]
    by_client["p95_records_per_request"] = records[0.95]
    # Sums over a client's batch rows, NaN for a client with none.
    batch_sums = batches.groupby("name")[["bytes", "batches"]].sum()
    batch_count = batch_sums["batches"].reindex(clients)
    by_client["mean_batch_bytes"] = batch_sums["bytes"].reindex(clients) / batch_count
    by_client["median_batch_bytes"] = counted_percentiles(batches, "name", [0.5])[0.5]
    small = batches[batches["value"] < SMALL_BATCH_BYTES].groupby("name")["batches"].sum()
    by_client["small_batch_share"] = small.reindex(batch_sums.index, fill_value=0).reindex(clients) / batch_count
    classes = batches.assign(bucket=batch_bucket(batches["value"])).groupby(["name", "bucket"])
    per_class = {
        what: classes[column].sum().unstack("bucket").reindex(index=clients, columns=labels).astype(float)
        for what, column in (("batches", "weighted_batches"), ("bytes", "bps"))
    }
    for label in labels:
        for what in ("batches", "bytes"):
            by_client[bucket_column(label, what)] = per_class[what][label]
    by_client = by_client.rename_axis("client_id").reset_index()
    return _whole(by_client, {"produce_requests": "int64"})


def topic_totals(partitions: pd.DataFrame) -> pd.DataFrame:
    """Requests and record bytes per topic (Produce in, Fetch out), from partition_totals' rows."""
    totals = (
        partitions.groupby(partitions["topic"].rename("entity"), dropna=False)[
            ["requests", "produce_bytes", "fetch_bytes"]
        ]
        .sum()
        .reset_index()
    )
    totals["bytes"] = totals["produce_bytes"] + totals["fetch_bytes"]
    return totals


def batch_tables(by_client: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(batch mix by size class, per-client batch figures) from produce_batches_by_client's rows."""
    labels = [label for _, label in BATCH_BUCKETS] + [BATCH_BUCKET_LAST]
    mix = pd.DataFrame(
        {
            "bucket": labels,
            "batches": [by_client[bucket_column(label, "batches")].sum(min_count=1) for label in labels],
            "bytes": [by_client[bucket_column(label, "bytes")].sum(min_count=1) for label in labels],
        }
    )
    # A class no batch fell in has no row, as in a group-by.
    mix = mix[mix["batches"].notna()].reset_index(drop=True)
    bucket_columns = [bucket_column(label, what) for label in labels for what in ("batches", "bytes")]
    per_client = by_client.drop(columns=bucket_columns)
    return mix, per_client


# ---------------------------------------------------------------- driver-side shaping (pandas)


def rank_shares(totals: pd.DataFrame, dimension: str) -> pd.DataFrame:
    """Rank entities by bytes; add byte and request shares and the cumulative byte share."""
    frame = totals.sort_values(["bytes", "requests", "entity"], ascending=[False, False, True]).reset_index(drop=True)
    total_bytes = frame["bytes"].sum()
    total_requests = frame["requests"].sum()
    frame.insert(0, "dimension", dimension)
    frame.insert(1, "rank", range(1, len(frame) + 1))
    frame["share_bytes"] = frame["bytes"] / total_bytes if total_bytes else 0.0
    frame["share_requests"] = frame["requests"] / total_requests if total_requests else 0.0
    frame["cumulative_share_bytes"] = frame["share_bytes"].cumsum()
    return frame


def pareto_summary(ranked: pd.DataFrame, top_n: int) -> dict[str, Any]:
    """Concentration of bytes: top-1/top-N shares, entities carrying 80 %, share of the top 20 %."""
    entities = len(ranked)
    if entities == 0:
        return {"entities": 0}
    cumulative = ranked["cumulative_share_bytes"].to_numpy()
    for_pareto = int((cumulative < PARETO_SHARE - 1e-12).sum()) + 1
    top_fifth = max(1, math.ceil(entities * 0.2))
    return {
        "entities": entities,
        "top1": {"entity": ranked["entity"].iloc[0], "share_bytes": float(ranked["share_bytes"].iloc[0])},
        "top_n_share_bytes": float(ranked["share_bytes"].head(top_n).sum()),
        "entities_for_80pct_bytes": min(for_pareto, entities),
        "top_20pct_entities_share_bytes": float(ranked["share_bytes"].head(top_fifth).sum()),
        "top": [
            {"entity": row.entity, "bytes": float(row.bytes), "share_bytes": float(row.share_bytes)}
            for row in ranked.head(top_n).itertuples()
        ],
    }


def skew(values: pd.Series) -> float | None:
    """max / mean (1.0 = perfectly even); None when there is nothing to compare."""
    mean = float(values.mean()) if len(values) else 0.0
    return float(values.max()) / mean if mean > 0 else None


def topic_skew(partitions: pd.DataFrame) -> pd.DataFrame:
    """Per topic: partitions seen, total bytes and max/mean partition bytes."""
    grouped = partitions.groupby("topic")["bytes"]
    frame = pd.DataFrame(
        {
            "partitions_seen": grouped.size(),
            "bytes": grouped.sum(),
            "max_partition_bytes": grouped.max(),
            "skew": grouped.apply(skew),
        }
    ).reset_index()
    return frame.sort_values("bytes", ascending=False).reset_index(drop=True)


def resolve_lost_broker(stats: pd.DataFrame) -> int | None:
    """The busiest broker: highest mean client bytes in + out."""
    rows = stats[(stats["scope"] == "broker") & stats["metric"].isin(["bytes_in", "bytes_out"])]
    if rows.empty:
        return None
    totals = rows.groupby("broker")["mean"].sum().sort_values(ascending=False)
    return int(totals.index[0])


def ordered_stats(stats: pd.DataFrame) -> pd.DataFrame:
    """The statistics in reading order: by resolution and scenario, the cluster first, then each
    broker, and the metrics in SERIES_METRICS order.
    """
    order = {metric: i for i, metric in enumerate(SERIES_METRICS)}
    keyed = stats.assign(
        _scope=stats["scope"] != "cluster",
        _metric=stats["metric"].map(lambda m: order.get(m, len(order))),
        _broker=stats["broker"].fillna(-1),
    )
    keyed = keyed.sort_values(["resolution", "scenario", "_scope", "_broker", "_metric", "metric"], kind="stable")
    return keyed.drop(columns=["_scope", "_metric", "_broker"]).reset_index(drop=True)


def api_names(api_keys: Sequence[int]) -> dict[int, str]:
    try:
        from kqp.protocol.apis import api_name
    except ImportError:  # kafka-python missing on the driver: fall back to numbers
        return {k: f"api{k}" for k in api_keys}
    return {k: api_name(k) for k in api_keys}


def headroom_loads(stats: pd.DataFrame, resolution: str, scenario: str, stat: str) -> list[tuple[int, str, float]]:
    """(broker, NW_IN | NW_OUT, load) at the headroom statistic: what analyze compares with each limit."""
    rows = stats[
        (stats["resolution"] == resolution)
        & (stats["scenario"] == scenario)
        & (stats["scope"] == "broker")
        & stats["metric"].isin(list(RESOURCE_OF_METRIC))
    ]
    return [(int(r.broker), RESOURCE_OF_METRIC[r.metric], float(getattr(r, stat))) for r in rows.itertuples()]
