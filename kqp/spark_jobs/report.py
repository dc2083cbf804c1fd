"""Load: write job results as Parquet tables, CSV summaries, summary.json, report.md and plots.

Layout of an output directory (see docs/replay.md):

    OUT/summary.json            versioned machine-readable summary ("schema": "kqp.replay.<job>/1")
    OUT/report.md               human-readable report, linking the plots
    OUT/plots/*.png             matplotlib figures
    OUT/tables/<name>.parquet   small result tables (written on the driver)
    OUT/tables/<name>/          large series (written by Spark, one directory per table)
    OUT/csv/<name>.csv          every small table, for spreadsheets

The small tables were collected to the driver already (they are the report's content), so
they are written from pandas; the per-second series can be large and stay in Spark.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on executors or CI
import matplotlib.pyplot as plt
import pandas as pd

from kqp.spark_jobs.session import to_pandas

# Series longer than this are plotted at 1 min: a day at 1 s is 86,400 points per line.
MAX_PLOT_POINTS = 3_600


def _json_default(value: Any) -> Any:
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _clean(value: Any) -> Any:
    """NaN and infinities are not JSON: write them as null."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        return _clean(value.item())
    return value


def write_json(path: Path, document: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(_clean(document), indent=2, default=_json_default, allow_nan=False) + "\n")


def write_tables(output: Path, tables: Mapping[str, pd.DataFrame]) -> None:
    (output / "tables").mkdir(parents=True, exist_ok=True)
    (output / "csv").mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        frame = frame.reset_index(drop=True)
        frame.to_parquet(output / "tables" / f"{name}.parquet", index=False)
        frame.to_csv(output / "csv" / f"{name}.csv", index=False)


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        if math.isinf(value):
            return "∞"
        if abs(value) >= 100 or value == int(value):
            return f"{value:,.0f}"
        return f"{value:,.3g}"
    if isinstance(value, pd.Timestamp):
        return str(value.strftime("%Y-%m-%d %H:%M:%S"))
    return str(value)


def markdown_table(frame: pd.DataFrame, columns: Sequence[str] | None = None, limit: int | None = None) -> str:
    """A GitHub-flavoured markdown table of `frame` (numbers formatted for reading)."""
    columns = list(columns or frame.columns)
    rows = frame[columns].head(limit) if limit else frame[columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows.itertuples(index=False):
        lines.append("| " + " | ".join(_fmt(v) for v in row) + " |")
    return "\n".join(lines)


def human_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:,.1f} {unit}"
        value /= 1000
    return f"{value:,.1f} TB"


# ---------------------------------------------------------------- analyze


def _plot_throughput(
    series: pd.DataFrame, limits: Mapping[int, Mapping[str, float]], path: Path, resolution: str
) -> None:
    figure, axes = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for metric, axis, title in (
        ("nw_in", axes[0], "network in (clients + replication)"),
        ("nw_out", axes[1], "network out"),
    ):
        for broker, rows in series.groupby("broker"):
            line = axis.plot(rows["window_start"], rows[metric] / 1e6, label=f"broker {broker}", linewidth=0.8)
            limit = limits.get(int(broker), {}).get(metric)
            if limit is not None:
                axis.axhline(limit / 1e6, color=line[0].get_color(), linestyle="--", linewidth=0.8)
        axis.set_ylabel("MB/s")
        axis.set_title(f"{title}, {resolution} (dashed: capacity x threshold)")
        axis.legend(loc="upper right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _plot_bars(labels: Sequence[str], values: Sequence[float], title: str, xlabel: str, path: Path) -> None:
    figure, axis = plt.subplots(figsize=(9, max(2.5, 0.35 * len(labels) + 1)))
    axis.barh(list(reversed(labels)), list(reversed(values)))
    axis.set_title(title)
    axis.set_xlabel(xlabel)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _plot_partition_heat(partitions: pd.DataFrame, path: Path, max_topics: int = 20) -> None:
    top_topics = partitions.groupby("topic")["bytes"].sum().sort_values(ascending=False).head(max_topics).index
    heat = partitions[partitions["topic"].isin(top_topics)].pivot_table(
        index="topic", columns="partition", values="mean_bytes_per_s", fill_value=0.0
    )
    heat = heat.loc[list(top_topics)]
    figure, axis = plt.subplots(figsize=(min(14, 2 + 0.5 * heat.shape[1]), 1 + 0.4 * heat.shape[0]))
    image = axis.imshow(heat.to_numpy() / 1e3, aspect="auto", cmap="inferno")
    axis.set_yticks(range(len(heat.index)), list(heat.index))
    axis.set_xticks(range(len(heat.columns)), [str(c) for c in heat.columns])
    axis.set_xlabel("partition")
    axis.set_title("mean KB/s per partition (produce + fetch)")
    figure.colorbar(image, ax=axis)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _plot_latency(latency: pd.DataFrame, path: Path) -> None:
    figure, axis = plt.subplots(figsize=(9, 4))
    positions = range(len(latency))
    width = 0.25
    for offset, column in enumerate(("p50_ms", "p99_ms", "p99_9_ms")):
        axis.bar([p + offset * width for p in positions], latency[column].clip(lower=1e-3), width, label=column)
    axis.set_xticks([p + width for p in positions], list(latency["api"]), rotation=30, ha="right")
    axis.set_yscale("log")
    axis.set_ylabel("ms (at the proxy)")
    axis.set_title("request latency by API")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _analyze_markdown(result: Any, plots: Mapping[str, str]) -> str:
    summary = result.summary
    tables = result.tables
    coverage = summary["coverage"]
    options = summary["options"]
    lines = [
        "# kqp capacity analysis",
        "",
        f"Capture `{options['capture']}`: {coverage['first_request']} .. {coverage['last_request']} "
        f"({coverage['duration_s']:,.0f} s), {coverage['requests']:,.0f} requests from {coverage['client_ids']} "
        f"client-ids, {coverage['principals']} principals, {coverage['connections']} connections, "
        f"{coverage['topics']} topics, brokers {coverage['brokers']}.",
        f"Sampling 1 in {coverage['sampling_one_in']} connections; capture coverage "
        + (f"{coverage['capture_coverage']:.2%}" if coverage["capture_coverage"] is not None else "unknown")
        + (
            f" ({coverage['records_dropped']:,} records dropped by the writer)." if coverage["records_dropped"] else "."
        ),
        f"Replication factor {options['replication_factor']} (modelled), headroom basis: {options['headroom_basis']}, "
        f"monthly growth x{options['monthly_growth']}.",
        "",
    ]
    headroom = summary["headroom"]
    lines += ["## Verdict", ""]
    binding = headroom["binding_constraint"]
    if binding:
        lines.append(
            f"* Binding constraint: broker {binding['broker']} {binding['resource']} at "
            f"{binding['utilisation']:.1%} of capacity (limit {binding['threshold']:.0%}); traffic can grow "
            f"x{_fmt(binding['growth_to_limit'])} before it reaches the limit."
        )
        months = headroom["runway_months"]
        lines.append(
            "* Growth runway: "
            + (f"{months:.1f} months" if months is not None else "unlimited (no growth)")
            + f" at x{options['monthly_growth']} per month."
        )
        lost = headroom["binding_constraint_broker_lost"]
        if lost:
            lines.append(
                f"* If broker {headroom['broker_lost']} (the busiest) is lost, broker {lost['broker']} "
                f"{lost['resource']} runs at {lost['utilisation']:.1%} of capacity "
                + ("(above the limit)." if lost["utilisation"] > lost["threshold"] else "(within the limit).")
            )
    else:
        lines.append("* No capacity file given: headroom not assessed (pass `--capacity`).")
    for violation in summary["budget"]["violations"]:
        lines.append(f"* **Budget violated:** {violation}")
    lines.append("")

    stats = tables["throughput_stats"]
    observed = stats[(stats["scenario"] == "observed") & (stats["resolution"] == "1s")]
    lines += ["## Throughput (per second)", ""]
    if "throughput" in plots:
        lines += [f"![throughput]({plots['throughput']})", ""]
    for scope in ("cluster", "broker"):
        rows = observed[(observed["scope"] == scope) & ~observed["metric"].str.startswith("requests:")].copy()
        rows["max_at"] = pd.to_datetime(rows["max_at"])
        lines += [
            f"### {'Cluster' if scope == 'cluster' else 'Per broker'} (bytes/s, requests/s, connections)",
            "",
            markdown_table(
                rows, ["broker", "metric", "mean", "p50", "p95", "p99", "p99_9", "max", "max_at", "seconds_above_limit"]
            ),
            "",
        ]
    api_rows = observed[(observed["scope"] == "cluster") & observed["metric"].str.startswith("requests:")]
    lines += [
        "### Request rate by API (cluster, requests/s)",
        "",
        markdown_table(api_rows, ["metric", "mean", "p50", "p99", "max"]),
        "",
    ]
    if "headroom" in tables:
        lines += ["## Headroom against the capacity file", "", markdown_table(tables["headroom"]), ""]
    if "headroom_broker_lost" in tables:
        lines += [
            f"### If broker {headroom['broker_lost']} is lost (its leaders re-homed evenly)",
            "",
            markdown_table(tables["headroom_broker_lost"]),
            "",
        ]
    lines += ["## Who carries the traffic", ""]
    for dimension, pareto in summary["shares"].items():
        if not pareto.get("entities"):
            continue
        lines.append(
            f"* **{dimension}**: {pareto['entities']} in all; top 1 `{pareto['top1']['entity']}` carries "
            f"{pareto['top1']['share_bytes']:.1%} of bytes, {pareto['entities_for_80pct_bytes']} carry 80 %, "
            f"the top 20 % carry {pareto['top_20pct_entities_share_bytes']:.1%}."
        )
    shares = tables["shares"]
    for dimension in ("client_id", "topic"):
        rows = shares[shares["dimension"] == dimension]
        lines += ["", f"### Top {dimension}s by bytes", ""]
        if f"top_{dimension}" in plots:
            lines += [f"![top {dimension}]({plots[f'top_{dimension}']})", ""]
        lines.append(
            markdown_table(
                rows,
                ["rank", "entity", "requests", "bytes", "share_bytes", "cumulative_share_bytes"],
                limit=options["top_n"],
            )
        )
    lines += ["", "### Burstiness of client-ids (p99 / median bytes/s over active seconds)", ""]
    lines += [
        markdown_table(tables["client_burstiness"].sort_values("burstiness", ascending=False), limit=options["top_n"]),
        "",
    ]
    lines += ["## Partition hot spots", ""]
    if "partition_heat" in plots:
        lines += [f"![partition heat]({plots['partition_heat']})", ""]
    lines += [
        markdown_table(
            tables["partitions"],
            ["rank", "topic", "partition", "leader", "bytes", "mean_bytes_per_s", "peak_bytes_per_s"],
            limit=options["top_n"],
        ),
        "",
        f"Broker skew (max / mean client bytes): {_fmt(summary['skew']['broker_bytes_max_over_mean'])}.",
        "",
        "### Topic skew (max / mean partition bytes)",
        "",
        markdown_table(tables["topic_skew"], limit=options["top_n"]) if len(tables["topic_skew"]) else "no partitions",
        "",
        "## Produce batch sizes",
        "",
        markdown_table(tables["batch_mix"]),
        "",
        markdown_table(tables["batch_mix_by_client"], limit=options["top_n"] * 3),
        "",
        "## Latency by API (at the proxy; broker = proxy-to-broker round trip)",
        "",
    ]
    if "latency" in plots:
        lines += [f"![latency]({plots['latency']})", ""]
    lines += [
        markdown_table(
            tables["latency_by_api"],
            ["api", "responses", "p50_ms", "p95_ms", "p99_ms", "p99_9_ms", "max_ms", "broker_p99_ms"],
        ),
        "",
        "## Errors",
        "",
        markdown_table(tables["errors"]) if len(tables["errors"]) else "No error responses.",
        "",
        "## Throttles (broker-returned vs proxy-applied)",
        "",
        markdown_table(tables["throttles"]) if len(tables["throttles"]) else "No throttled requests.",
        "",
    ]
    return "\n".join(lines)


def write_analyze_outputs(result: Any, output: str | Path) -> None:
    """Write every analyze output under `output` (a driver-local directory)."""
    out = Path(output)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    for name, frame in result.spark_tables.items():
        frame.write.mode("overwrite").parquet(str(out / "tables" / name))
    write_tables(out, result.tables)

    plots: dict[str, str] = {}
    resolution = "1s"
    seconds = result.summary["coverage"]["duration_s"]
    if seconds > MAX_PLOT_POINTS:
        resolution = "1min"
    series = to_pandas(
        result.spark_tables[f"broker_series_{resolution}"].select("broker", "window_start", "nw_in", "nw_out")
    )
    limits: dict[int, dict[str, float]] = {}
    for row in result.summary["headroom"]["rows"]:
        metric = "nw_in" if row["resource"] == "NW_IN" else "nw_out"
        limits.setdefault(int(row["broker"]), {})[metric] = row["limit_bytes_per_s"]
    _plot_throughput(series.sort_values("window_start"), limits, out / "plots" / "throughput.png", resolution)
    plots["throughput"] = "plots/throughput.png"
    shares = result.tables["shares"]
    top_n = result.summary["options"]["top_n"]
    for dimension in ("client_id", "topic"):
        rows = shares[shares["dimension"] == dimension].head(top_n)
        if len(rows):
            _plot_bars(
                list(rows["entity"]),
                list(rows["bytes"] / 1e6),
                f"top {dimension}s by bytes",
                "MB",
                out / "plots" / f"top_{dimension}.png",
            )
            plots[f"top_{dimension}"] = f"plots/top_{dimension}.png"
    if len(result.tables["partitions"]):
        _plot_partition_heat(result.tables["partitions"], out / "plots" / "partition_heat.png")
        plots["partition_heat"] = "plots/partition_heat.png"
    if len(result.tables["latency_by_api"]):
        _plot_latency(result.tables["latency_by_api"], out / "plots" / "latency.png")
        plots["latency"] = "plots/latency.png"

    result.summary["outputs"] = {
        "tables": sorted([*result.tables, *result.spark_tables]),
        "plots": sorted(plots.values()),
        "report": "report.md",
    }
    write_json(out / "summary.json", result.summary)
    (out / "report.md").write_text(_analyze_markdown(result, plots))
