"""What a replay task hands back: its partial sums, not its rows.

No Spark here: whatif's `simulate_partials` applies `task_partials` to each task's replayed
frame (and to each batch of passed-through rows), and Spark merges the parts
(whatif.client_outcomes_from_partials and friends). A task replays tens of thousands of
requests; what whatif and advise read of them is a few sums per client, the throttle values
with their counts, and bytes per broker, API and second (or bucket). Returning those instead of
the rows spares the row-sized transfer back to the JVM, a cache of every replayed request and
the passes over it.

The merged figures are the ones the row-level aggregations (whatif.client_outcomes,
broker_peaks, calibration, advise_verify's moved bytes) give, bit for bit: sums of whole
milliseconds and bytes are exact in any order (far below 2^53), minima and maxima do not depend
on it, and Spark's exact percentile over (value, count) pairs keeps the same value -> count map
whether the counts were added up in one place or in several.

One long table: `part` says which figure a row belongs to, and only that figure's columns are
set (the others are null):

  * `client`: per (principal, client-id), requests, throttled requests, throttle total and
    maximum, bytes, bytes delayed, first and last simulated send time, the largest shift, and
    the calibration sums against the recorded throttles;
  * `throttle`: per (principal, client-id, throttle value), its count (`requests`);
  * `recorded_second` / `simulated_second`: Produce and Fetch bytes per (broker, API, second)
    by recorded and by simulated time (whatif's broker peaks);
  * `moved_out` / `moved_in`: per (broker, API, bucket of `moved_unit` s), the Produce and
    Fetch bytes the deferral moved out of and into it, with the arrivals and the last second
    they reach (advise's verification).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kqp.protocol.api_keys import ApiKey

# Column -> Spark type, in the schema's order.
PARTIAL_COLUMNS: dict[str, str] = {
    "part": "string",
    "principal": "string",
    "client_id": "string",
    "broker": "int",
    "api_key": "int",
    "bucket": "long",
    "requests": "long",
    "throttled": "long",
    "throttle_ms": "double",
    "throttle_ms_max": "double",
    "bytes": "long",
    "bytes_delayed": "long",
    "first_ms": "long",
    "last_ms": "long",
    "max_shift_ms": "long",
    "recorded_throttled": "long",
    "agreeing": "long",
    "recorded_throttle_ms": "double",
    "abs_error_ms": "double",
    "abs_error_ms_max": "double",
    "moved_out": "long",
    "moved_in": "long",
    "last_second": "long",
}
PARTIALS_SCHEMA = ", ".join(f"{name} {kind}" for name, kind in PARTIAL_COLUMNS.items())
_CLIENT = ["principal", "client_id"]
_BYTES_APIS = (ApiKey.PRODUCE, ApiKey.FETCH)


def task_partials(frame: pd.DataFrame, peaks: bool, moved_unit: int | None) -> pd.DataFrame:
    """The partial sums of one task's replayed rows (whatif.SIMULATED_COLUMNS), in PARTIAL_COLUMNS.

    `peaks`: add the per-second bytes by recorded and simulated time; `moved_unit`: add the bytes
    moved between buckets of that many seconds.
    """
    ts = frame["ts_ms"].to_numpy(dtype=np.int64)
    sim_ts = frame["sim_ts_ms"].to_numpy(dtype=np.int64)
    throttle = frame["sim_throttle_ms"].to_numpy(dtype=np.float64)
    recorded = frame["recorded_throttle_ms"].to_numpy(dtype=np.float64)
    nbytes = frame["nbytes"].to_numpy(dtype=np.int64)
    throttled = throttle > 0
    # In deferral mode a request can be delayed without being throttled itself: it queued
    # behind a throttled one on its connection. Its bytes count as delayed too.
    delayed = throttled | (sim_ts > ts)
    work = pd.DataFrame(
        {
            "principal": frame["principal"].to_numpy(),
            "client_id": frame["client_id"].to_numpy(),
            "throttled": throttled.astype(np.int64),
            "throttle_ms": throttle,
            "bytes": nbytes,
            "bytes_delayed": np.where(delayed, nbytes, 0),
            "sim_ts_ms": sim_ts,
            "shift_ms": sim_ts - ts,
            "recorded_throttled": (recorded > 0).astype(np.int64),
            "agreeing": (throttled == (recorded > 0)).astype(np.int64),
            "recorded_throttle_ms": recorded,
            "abs_error_ms": np.abs(throttle - recorded),
        }
    )
    by_client = work.groupby(_CLIENT, sort=False)
    clients = by_client.agg(
        requests=("bytes", "size"),
        throttled=("throttled", "sum"),
        throttle_ms=("throttle_ms", "sum"),
        throttle_ms_max=("throttle_ms", "max"),
        bytes=("bytes", "sum"),
        bytes_delayed=("bytes_delayed", "sum"),
        first_ms=("sim_ts_ms", "min"),
        last_ms=("sim_ts_ms", "max"),
        max_shift_ms=("shift_ms", "max"),
        recorded_throttled=("recorded_throttled", "sum"),
        agreeing=("agreeing", "sum"),
        recorded_throttle_ms=("recorded_throttle_ms", "sum"),
        abs_error_ms=("abs_error_ms", "sum"),
        abs_error_ms_max=("abs_error_ms", "max"),
    ).reset_index()
    throttles = work.groupby([*_CLIENT, "throttle_ms"], sort=False).size().rename("requests").reset_index()
    parts = [clients.assign(part="client"), throttles.assign(part="throttle")]

    data = np.isin(frame["api_key"].to_numpy(dtype=np.int64), _BYTES_APIS)
    carried = pd.DataFrame(
        {
            "broker": frame["broker"].to_numpy(dtype=np.int64)[data],
            "api_key": frame["api_key"].to_numpy(dtype=np.int64)[data],
            "ts_ms": ts[data],
            "sim_ts_ms": sim_ts[data],
            "bytes": nbytes[data],
        }
    )
    if peaks:
        for part, column in (("recorded_second", "ts_ms"), ("simulated_second", "sim_ts_ms")):
            per_second = (
                carried.assign(bucket=carried[column] // 1000)
                .groupby(["broker", "api_key", "bucket"], sort=False)["bytes"]
                .sum()
                .reset_index()
            )
            parts.append(per_second.assign(part=part))
    if moved_unit is not None:
        span_ms = 1000 * moved_unit
        before = carried["ts_ms"] // span_ms
        after = carried["sim_ts_ms"] // span_ms
        moved = carried.assign(before=before, after=after, sim_second=carried["sim_ts_ms"] // 1000)[before != after]
        out = moved.groupby(["broker", "api_key", "before"], sort=False)["bytes"].sum().rename("moved_out")
        parts.append(out.reset_index().rename(columns={"before": "bucket"}).assign(part="moved_out"))
        arrived = moved.groupby(["broker", "api_key", "after"], sort=False).agg(
            moved_in=("bytes", "sum"), requests=("bytes", "size"), last_second=("sim_second", "max")
        )
        parts.append(arrived.reset_index().rename(columns={"after": "bucket"}).assign(part="moved_in"))
    return _in_schema(parts)


def _in_schema(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """The parts stacked into PARTIAL_COLUMNS, each column in its nullable type.

    Built from numpy arrays and masks, column by column: a pass-through batch is summed on its
    own, so this runs once per batch, and pandas' per-piece casts and concatenations cost
    more than the sums themselves on batches of a few thousand rows.
    """
    lengths = [len(part) for part in parts]
    columns: dict[str, pd.Series] = {}
    for name, kind in PARTIAL_COLUMNS.items():
        present = [name in part.columns for part in parts]
        if kind == "string":
            values = np.concatenate(
                [
                    part[name].to_numpy(dtype=object) if has else np.full(n, None, dtype=object)
                    for part, has, n in zip(parts, present, lengths, strict=True)
                ]
                or [np.zeros(0, dtype=object)]
            )
            columns[name] = pd.Series(values, dtype=object)
        elif kind == "double":
            values = np.concatenate(
                [
                    part[name].to_numpy(dtype=np.float64) if has else np.full(n, np.nan)
                    for part, has, n in zip(parts, present, lengths, strict=True)
                ]
                or [np.zeros(0)]
            )
            columns[name] = pd.Series(values)
        else:
            integer = np.int32 if kind == "int" else np.int64
            # Every value a part sets is a whole number with no gap (counts, sums, keys).
            values = np.concatenate(
                [
                    part[name].to_numpy(dtype=integer) if has else np.zeros(n, dtype=integer)
                    for part, has, n in zip(parts, present, lengths, strict=True)
                ]
                or [np.zeros(0, dtype=integer)]
            )
            missing = np.concatenate(
                [np.full(n, not has) for has, n in zip(present, lengths, strict=True)] or [np.zeros(0, dtype=bool)]
            )
            columns[name] = pd.Series(pd.arrays.IntegerArray(values, missing))
    return pd.DataFrame(columns)
