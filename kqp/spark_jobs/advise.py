"""`advise`: the quotas to set so that no broker runs past its capacity, from a capture.

Run locally::

    kqp replay advise CAPTURE_DIR --capacity capacity.json --output OUT \
        [--current quotas.yaml] [--weight ENTITY=W] [--protect ENTITY] [--floor BYTES_PER_S] \
        [--entity client-id|user|user,client-id] [--scope broker|cluster] [--burst-factor X]

On a cluster::

    kqp replay --package /tmp/kqp.zip
    spark-submit --master yarn --py-files /tmp/kqp.zip --files capacity.json \
        kqp/spark_jobs/advise.py hdfs:///captures/kqp --capacity capacity.json --output /shared/out/advise

Steps: Spark aggregates the capture into per-bucket series (analyze's transforms: every
broker's client bytes in and out, and each entity's Produce and Fetch bytes per broker);
`advice_math.water_fill` (pure) proposes max-min fair byte-rate quotas that bring every
broker's NW_IN and NW_OUT, at analyze's headroom statistic and resolution with replication
modelled the same way, to capacity x threshold; `advice_math.choose_entries` writes them as
the fewest KIP-55 entries. The advised file is then loaded exactly as the proxy loads it
and replayed through the proxy's own quota engine and recording rules in deferral mode
(whatif's `simulate`), which gives each broker's load after throttling and each entity's
throttled share. Exit 3 when the advice cannot meet a limit, or the replay shows a broker
over its limit.

Outputs: quotas.yaml (kqp's own config format, a comment per entry saying why),
summary.json, report.html / report.md with plots, tables/*.parquet and csv/*.csv.

This module runs the job (the rounds of advice and replay, the tables, the command line);
the steps it runs are in advise_problem (options, the capture's series, the limits and the
problem), advise_verify (the replay), advise_yaml (quotas.yaml) and advise_report (the
outputs and plots).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from kqp.config.capacity_file import load_capacity
from kqp.config.models import entity_text as entity_label
from kqp.quotas import capacity as cap
from kqp.quotas.settings import QuotaEntity, QuotaSettings
from kqp.spark_jobs.advice_math import (
    BYTE_RATE_TYPES,
    FETCH,
    GRANULARITIES,
    PRODUCE,
    STATS,
    Advice,
    Entry,
    Problem,
    Resource,
    choose_entries,
    next_planned_limit,
    replication_shares,
    water_fill,
)
from kqp.spark_jobs.advise_problem import (
    ADVISE_RESOLUTIONS,
    SUMMARY_SCHEMA,
    TRAFFIC_COLUMNS,
    WINDOW_RESOLUTION,
    AdviseOptions,
    Series,
    aggregate,
    bucket_seconds,
    build_problem,
    guarantee,
    limits_of,
    resolution_text,
)
from kqp.spark_jobs.advise_report import AdviseResult, write_advise_outputs
from kqp.spark_jobs.advise_verify import Verification, throttled_shares, verify
from kqp.spark_jobs.advise_yaml import render_quotas_yaml
from kqp.spark_jobs.analyze_transform import aggregate_traffic, prepare_requests
from kqp.spark_jobs.capture_source import read_capture
from kqp.spark_jobs.common import BUDGET_EXIT_CODE, HelpFormatter, Progress
from kqp.spark_jobs.session import fit_shuffle_partitions, to_pandas

if TYPE_CHECKING:
    from kqp.spark_jobs.whatif import ReplayTraffic


def _before_series(series: Series, problem: Problem) -> dict[Resource, np.ndarray]:
    """The brokers' NW_IN / NW_OUT as captured (analyze's nw_in / nw_out)."""
    followers, spread = replication_shares(problem.replication_factor, len(series.brokers))
    cluster_produce = sum(series.broker_rates[b]["produce_bytes"] for b in series.brokers)
    result = {}
    for broker in series.brokers:
        rates = series.broker_rates[broker]
        result[(broker, cap.NW_IN)] = rates["bytes_in"] + spread * (cluster_produce - rates["produce_bytes"])
        result[(broker, cap.NW_OUT)] = rates["bytes_out"] + followers * rates["produce_bytes"]
    return result


def _windows(current: QuotaSettings | None, options: AdviseOptions) -> dict[str, int]:
    """The quota window of the advised file: --window-num / --window-size-seconds, else
    today's (--current), else Kafka's default (11 x 1 s).

    Written out, because the advice depends on it: a quota is measured over this window, and
    a client may burst above its quota for a part of it.
    """
    settings = current if current is not None else QuotaSettings()
    return {
        "window_num": options.window_num or settings.window_num,
        "window_size_seconds": options.window_size_seconds or settings.window_size_s,
    }


def run_advise(spark: SparkSession, options: AdviseOptions, progress: Progress | None = None) -> AdviseResult:
    """Aggregate, optimise, write and load the advised file, verify it; returns what `load` writes."""
    from kqp.spark_jobs.whatif import load_quota_settings, replay_traffic
    from kqp.spark_jobs.whatif import prepare_requests as whatif_requests

    progress = progress or Progress("advise", 3 + 2 * options.rounds)
    if options.headroom_stat not in STATS:
        raise ValueError(f"headroom stat must be one of {STATS}")
    if options.headroom_resolution not in ADVISE_RESOLUTIONS:
        raise ValueError(f"headroom resolution must be one of {ADVISE_RESOLUTIONS}")
    capacity_file = load_capacity(options.capacity)
    current = load_quota_settings(options.current) if options.current else None

    fit_shuffle_partitions(spark, options.capture)
    raw = read_capture(spark, options.capture)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kqp-advise-replay-traffic") as pool:
        # What the verification plans its replay with (the pairs and the per-second byte bounds)
        # depends on the capture alone: a second driver thread reads it while this one
        # aggregates the capture and solves, so its pass fills the cores the small queries here
        # leave idle. Its result is the same: a query's result does not depend on what else the
        # session runs.
        requests = whatif_requests(raw)
        planned_traffic = pool.submit(replay_traffic, requests) if options.verify else None
        return _run_advise(spark, options, progress, capacity_file, current, raw, requests, planned_traffic)


def _run_advise(
    spark: SparkSession,
    options: AdviseOptions,
    progress: Progress,
    capacity_file: cap.CapacityFile,
    current: QuotaSettings | None,
    raw: DataFrame,
    requests: DataFrame,
    planned_traffic: Future[ReplayTraffic] | None,
) -> AdviseResult:
    """run_advise's steps after the capture is read, the verification's replay plan arriving as a future."""
    from kqp.spark_jobs.replay_rounds import ChargedReplays
    from kqp.spark_jobs.whatif import load_quota_settings

    # The traffic sums come to the driver once; the series are pandas over them (no cache, no small Spark jobs).
    traffic = to_pandas(aggregate_traffic(prepare_requests(raw)).select(*TRAFFIC_COLUMNS))
    windows = _windows(current, options)
    series = aggregate(traffic, options, bucket_seconds(options, windows))
    progress.step(f"aggregated {len(series.demand)} flows over {len(series.brokers)} brokers")

    limits = limits_of(capacity_file, series.brokers, options)
    problem = build_problem(series, limits, options, windows)
    before = _before_series(series, problem)
    out = Path(options.output)
    out.mkdir(parents=True, exist_ok=True)
    header = [
        f"Quotas advised by `kqp replay advise` for capture {options.capture}",
        f"capacity {options.capacity}, limits = capacity x threshold (NW_IN {options.nw_in_threshold}, "
        f"NW_OUT {options.nw_out_threshold}), judged at the {options.headroom_stat} of "
        f"{resolution_text(series.unit)} buckets, replication factor {options.replication_factor} (modelled), "
        f"entities by {options.entity}, floor {options.floor:,.0f} B/s.",
        guarantee(options.headroom_stat, series.unit, windows, problem.burst_factor),
        "Check it with `kqp check-config`; load it with `kqp serve --config` (live reload picks up a change).",
    ]
    quotas_path = out / "quotas.yaml"

    # Round 1 plans for the limits themselves. The model clips each bucket at the quota, but
    # Kafka measures a quota over its whole window (11 x 1 s by default), so a limited client
    # still bursts above it within a window; when the replay shows a resource over its limit,
    # the next round plans for the limit less that overshoot.
    planned = dict(limits)
    worst_replayed: dict[Resource, float] = {}
    rounds: list[dict[str, Any]] = []
    replays: ChargedReplays | None = None
    for round_number in range(1, options.rounds + 1):
        advice = water_fill(replace(problem, limits=planned))
        entries = choose_entries(advice.flows, options.entity)
        progress.step(
            f"round {round_number}: {sum(f.limited for f in advice.flows)} flows limited in {len(entries)} entries"
        )
        quotas_path.write_text(
            render_quotas_yaml(entries, advice.flows, {}, header, options.scope, windows, options.headroom_stat)
        )
        # Loaded exactly as `kqp serve` loads it: the replay runs what the proxy would run.
        settings = load_quota_settings(str(quotas_path))
        if not options.verify or advice.unmet:
            verification = None
            break
        # The replay's sensors start empty: its first quota window is warm-up (a bucket longer than
        # the window is kept, or a short capture judged at 1 min would be judged on its spill alone).
        warm_up = windows["window_num"] * windows["window_size_seconds"] // series.unit
        assert planned_traffic is not None  # submitted whenever options.verify
        if replays is None:
            # The same rows for every round: the capture's charges and replay tasks do not
            # depend on the quota values (kqp.spark_jobs.replay_rounds), nor does the plan.
            replays = ChargedReplays(spark, requests, planned_traffic.result())
        verification = verify(settings, series, options, before, warm_up, replays)
        over = {res: load for res, load in verification.loads.items() if load > limits[res] * (1 + 1e-9)}
        rounds.append(
            {
                "round": round_number,
                "planned_limits": {f"{b} {r}": v for (b, r), v in planned.items()},
                "replayed": {f"{b} {r}": v for (b, r), v in verification.loads.items()},
                "over": sorted(f"{b} {r}" for b, r in over),
            }
        )
        progress.step(f"round {round_number}: replayed the advice through kqp.quotas (deferral), {len(over)} over")
        if not over:
            break
        for res, load in over.items():
            worst_replayed[res] = max(load, worst_replayed.get(res, load))
            planned[res] = next_planned_limit(planned[res], limits[res], worst_replayed[res], round_number)
    if replays is not None:
        replays.release()
    # The last round's advice is the one written, now with the replay's throttled share per entry.
    throttled = throttled_shares(verification.clients, options.entity) if verification is not None else {}
    quotas_yaml = render_quotas_yaml(
        entries, advice.flows, throttled, header, options.scope, windows, options.headroom_stat
    )
    quotas_path.write_text(quotas_yaml)

    # A violation is either a limit no quota can meet (unmet) or one the replay still finds exceeded
    # after the last round; either makes the job exit with BUDGET_EXIT_CODE.
    violations = list(advice.unmet)
    loads_table = _loads_table(advice, limits, verification)
    if verification is not None:
        for row in loads_table.itertuples():
            if row.verified_after > row.limit * (1 + 1e-9) and not any(
                v.startswith(f"broker {row.broker} {row.resource}:") for v in violations
            ):
                violations.append(
                    f"broker {row.broker} {row.resource}: the replay of the advised quotas leaves its "
                    f"{options.headroom_stat} at {row.verified_after:,.0f} B/s, over the limit of {row.limit:,.0f} B/s "
                    f"after {len(rounds)} rounds"
                )
    tables = {
        "advice": _advice_table(advice, throttled, verification),
        "entries": _entries_table(entries),
        "broker_loads": loads_table,
    }
    if verification is not None:
        tables["replay_clients"] = verification.clients.sort_values(["principal", "client_id"]).reset_index(drop=True)
    if current is not None:
        tables["diff"] = _diff(series.pairs, current, settings)
    summary = _summary(options, series, advice, entries, tables, violations, verification is not None)
    summary["rounds"] = rounds
    summary["burst_factor"] = problem.burst_factor
    summary["bucket_seconds"] = series.unit
    summary["guarantee"] = guarantee(options.headroom_stat, series.unit, windows, problem.burst_factor)
    progress.step("tables and summary")
    return AdviseResult(
        summary=summary,
        tables=tables,
        quotas_yaml=quotas_yaml,
        advice=advice,
        series_before=before,
        series_after=verification.series if verification else None,
        violations=violations,
    )


def _advice_table(
    advice: Advice, throttled: Mapping[QuotaEntity, float], verification: Verification | None
) -> pd.DataFrame:
    """One row per flow: demand, the advised quota and why, and the replay's throttled share."""
    rows = []
    for flow in advice.flows:
        rows.append(
            {
                "entity": entity_label(flow.entity),
                "quota_type": flow.quota_type,
                "weight": flow.weight,
                "protected": flow.protected,
                "demand_stat_bytes_per_s": flow.demand_stat,
                "demand_peak_bytes_per_s": flow.demand_peak,
                "limited": flow.limited,
                "quota_bytes_per_s": flow.quota,
                "fair_share_bytes_per_s": flow.fair_share,
                "binding": None if flow.binding is None else f"broker {flow.binding[0]} {flow.binding[1]}",
                "reason": flow.reason,
                "replay_throttled_share": throttled.get(flow.entity) if verification is not None else None,
            }
        )
    return pd.DataFrame(rows)


def _entries_table(entries: Sequence[Entry]) -> pd.DataFrame:
    """The entries as written to quotas.yaml; None in a column means the entry leaves that type alone."""
    return pd.DataFrame(
        [
            {
                "entity": entity_label(entry.entity),
                PRODUCE: entry.limits.get(PRODUCE),
                FETCH: entry.limits.get(FETCH),
            }
            for entry in entries
        ],
        columns=["entity", PRODUCE, FETCH],
    )


def _loads_table(advice: Advice, limits: Mapping[Resource, float], verification: Verification | None) -> pd.DataFrame:
    """Per resource: the true limit, the limit planned in the last round, and the load as captured,
    as modelled under the advice, and as replayed (NaN without --verify), all in bytes/s.
    """
    return pd.DataFrame(
        [
            {
                "broker": load.broker,
                "resource": load.resource,
                "limit": limits[(load.broker, load.resource)],
                "planned_limit": load.limit,
                "before": load.before,
                "modelled_after": load.after,
                "verified_after": verification.loads[(load.broker, load.resource)] if verification else math.nan,
                "background": load.background,
                "protected": load.protected,
            }
            for load in advice.loads
        ]
    )


def _diff(pairs: pd.DataFrame, current: QuotaSettings, advised: QuotaSettings) -> pd.DataFrame:
    """Per captured (principal, client-id): the limit it gets today and with the advice."""
    from kqp.quotas import QuotaEngine

    engines = {"current": QuotaEngine(current), "advised": QuotaEngine(advised)}
    rows = []
    for pair in pairs.sort_values(["principal", "client_id"]).itertuples():
        row: dict[str, Any] = {"principal": pair.principal, "client_id": pair.client_id}
        for quota_type in BYTE_RATE_TYPES:
            for name, engine in engines.items():
                row[f"{name}_{quota_type}"] = engine.quota(quota_type, pair.principal, pair.client_id)
            row[f"{quota_type}_changed"] = row[f"current_{quota_type}"] != row[f"advised_{quota_type}"]
        rows.append(row)
    return pd.DataFrame(rows)


def _summary(
    options: AdviseOptions,
    series: Series,
    advice: Advice,
    entries: Sequence[Entry],
    tables: Mapping[str, pd.DataFrame],
    violations: list[str],
    verified: bool,
) -> dict[str, Any]:
    return {
        "schema": SUMMARY_SCHEMA,
        "generated_at": pd.Timestamp.now(tz="UTC").isoformat(),
        "options": {
            "capture": options.capture,
            "capacity": options.capacity,
            "current": options.current,
            "entity": options.entity,
            "scope": options.scope,
            "weights": dict(options.weights),
            "protect": list(options.protect),
            "floor": options.floor,
            "replication_factor": options.replication_factor,
            "thresholds": {cap.NW_IN: options.nw_in_threshold, cap.NW_OUT: options.nw_out_threshold},
            "basis": f"{options.headroom_stat} of {resolution_text(series.unit)} buckets",
            "top_n": options.top_n,
        },
        "brokers": list(series.brokers),
        "buckets": len(series.covered),
        "fits": not violations,
        "unmet": violations,
        "limited": [
            {"entity": entity_label(f.entity), "quota_type": f.quota_type, "quota": f.quota, "reason": f.reason}
            for f in advice.flows
            if f.limited
        ],
        "entries": len(entries),
        "broker_loads": tables["broker_loads"].to_dict(orient="records"),
        "verified": verified,
        "not_advised": [
            "request_percentage (broker CPU cannot be judged from the capture)",
            "controller_mutation_rate",
            "connection_creation_rate",
        ],
    }


def _weight(text: str) -> tuple[str, float]:
    name, sep, value = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected ENTITY=WEIGHT, got {text!r}")
    try:
        weight = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"weight of {name!r} is not a number: {value!r}") from None
    if not weight > 0 or math.isinf(weight):
        raise argparse.ArgumentTypeError(f"weight of {name!r} must be a positive number, got {value!r}")
    return name, weight


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kqp replay advise",
        description="Propose byte-rate quotas that keep every broker under its capacity.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("capture", help="capture directory (local path or Hadoop-compatible URI)")
    parser.add_argument("--capacity", required=True, help="Cruise Control capacity JSON file")
    parser.add_argument("--output", required=True, help="output directory (local to the driver)")
    parser.add_argument(
        "--current",
        help="the quota config in force today: the report shows the difference, and its quota window is "
        "the advice's (default: none, Kafka's 11 x 1 s window)",
    )
    parser.add_argument(
        "--weight", action="append", type=_weight, default=[], metavar="ENTITY=W", help="share weight (default 1)"
    )
    parser.add_argument(
        "--protect", action="append", default=[], metavar="ENTITY", help="never limit this entity (default: none)"
    )
    parser.add_argument("--floor", type=float, default=0.0, metavar="BYTES_PER_S", help="never limit below this")
    parser.add_argument(
        "--entity",
        choices=GRANULARITIES,
        default="client-id",
        help="quota entities: ENTITY names are CLIENT-ID, USER or USER/CLIENT-ID",
    )
    parser.add_argument(
        "--scope",
        choices=("broker", "cluster"),
        default="broker",
        help="broker: every broker enforces the quota on its own (Kafka's way); cluster: one budget over brokers",
    )
    parser.add_argument(
        "--replication-factor",
        type=int,
        default=3,
        help="replicas per partition, to model the followers' NW_IN and the leaders' NW_OUT",
    )
    parser.add_argument(
        "--nw-in-threshold",
        type=float,
        default=cap.DEFAULT_NETWORK_THRESHOLD,
        help="share of a broker's NW_IN capacity it may use (the limit is capacity x threshold)",
    )
    parser.add_argument(
        "--nw-out-threshold",
        type=float,
        default=cap.DEFAULT_NETWORK_THRESHOLD,
        help="share of a broker's NW_OUT capacity it may use",
    )
    parser.add_argument(
        "--headroom-stat", choices=STATS, default="p99", help="statistic of a broker's series judged against its limit"
    )
    parser.add_argument(
        "--headroom-resolution",
        choices=ADVISE_RESOLUTIONS,
        default=WINDOW_RESOLUTION,
        help="bucket length of the judged series: window = the quota window (window-num x window-size-seconds, "
        "the finest a quota holds a client to; default), 1s or 1min as analyze",
    )
    parser.add_argument(
        "--window-num", type=int, help="quota.window.num of the advised file (default: --current's, else 11)"
    )
    parser.add_argument(
        "--window-size-seconds", type=int, help="quota.window.size.seconds (default: --current's, else 1)"
    )
    parser.add_argument(
        "--burst-factor",
        type=float,
        help="how far above its quota a throttled client may go within one bucket "
        "(default: quota window / bucket, at least 1: 1 at the window resolution, 11 for 11 x 1 s at 1 s)",
    )
    parser.add_argument("--no-verify", action="store_true", help="skip the replay of the advice")
    parser.add_argument(
        "--rounds", type=int, default=4, help="replays at most, each planning for the overshoot the last one showed"
    )
    parser.add_argument("--top-n", type=int, default=20, help="entities in the offered-vs-allowed plot")
    parser.add_argument("--master", help="Spark master URL (default: spark-submit's, else local[*])")
    return parser


def options_from_args(args: argparse.Namespace) -> AdviseOptions:
    if args.floor < 0:
        raise SystemExit("kqp replay advise: --floor must be >= 0")
    return AdviseOptions(
        capture=args.capture,
        capacity=args.capacity,
        output=args.output,
        current=args.current,
        weights=dict(args.weight),
        protect=tuple(args.protect),
        floor=args.floor,
        entity=args.entity,
        scope=args.scope,
        replication_factor=args.replication_factor,
        nw_in_threshold=args.nw_in_threshold,
        nw_out_threshold=args.nw_out_threshold,
        headroom_stat=args.headroom_stat,
        headroom_resolution=args.headroom_resolution,
        verify=not args.no_verify,
        rounds=max(1, args.rounds),
        window_num=args.window_num,
        window_size_seconds=args.window_size_seconds,
        burst_factor=args.burst_factor,
        top_n=args.top_n,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run advise; exit 0, or 3 when the advice cannot keep some broker under its limit."""
    from kqp.spark_jobs.session import get_spark

    args = build_parser().parse_args(argv)
    options = options_from_args(args)
    spark = get_spark("kqp-advise", args.master)
    progress = Progress("advise", 4 + 2 * options.rounds)
    result = run_advise(spark, options, progress)
    write_advise_outputs(result, options.output, int(result.summary["bucket_seconds"]))
    progress.step(f"wrote {options.output}/quotas.yaml, report.html and summary.json")
    for violation in result.violations:
        print(f"ADVICE DOES NOT FIT: {violation}", file=sys.stderr)
    return BUDGET_EXIT_CODE if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
