"""Load: write job results as Parquet tables, CSV summaries, summary.json and report.html.

Layout of an output directory (see docs/replay.md):

    OUT/summary.json            versioned machine-readable summary ("schema": "kqp.replay.<job>/1")
    OUT/report.html             self-contained report: tables and plots embedded, no other file needed
    OUT/report.md               the same report as markdown, linking the plots
    OUT/plots/*.png             the plots, for the markdown report and for reuse
    OUT/tables/<name>.parquet   small result tables (written on the driver)
    OUT/tables/<name>/          large series (written by Spark, one directory per table)
    OUT/csv/<name>.csv          every small table, for spreadsheets

The small tables were collected to the driver already (they are the report's content), so
they are written from pandas; the per-second series can be large and stay in Spark.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on executors or CI
import matplotlib.pyplot as plt
import pandas as pd

# Series longer than this are plotted at 1 min: a day at 1 s is 86,400 points per line.
MAX_PLOT_POINTS = 3_600


def _json_default(value: Any) -> Any:
    """json.dumps' fallback for what pandas and numpy hand back: timestamps as ISO 8601, numpy
    scalars and arrays as Python values, anything else as its text (a summary never fails to write).
    """
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
    """summary.json: strict JSON (allow_nan=False, NaN already null), readable by any consumer."""
    path.write_text(json.dumps(_clean(document), indent=2, default=_json_default, allow_nan=False) + "\n")


def write_tables(output: Path, tables: Mapping[str, pd.DataFrame]) -> None:
    """Each table twice: Parquet under tables/ (types kept, for Spark or pandas) and CSV under csv/
    (for a spreadsheet). The index is dropped: every table carries its keys as columns.
    """
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


def write_series_table(directory: Path, frame: pd.DataFrame) -> None:
    """A series table as a Parquet directory holding one part file: the layout Spark writes, so
    `spark.read.parquet(directory)` and `pandas.read_parquet(directory)` read it as before."""
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("part-*"):
        stale.unlink()
    frame.reset_index(drop=True).to_parquet(directory / "part-00000.parquet", index=False)


def markdown_table(frame: pd.DataFrame, columns: Sequence[str] | None = None, limit: int | None = None) -> str:
    """A GitHub-flavoured markdown table of `frame` (numbers formatted for reading)."""
    columns = list(columns or frame.columns)
    rows = frame[columns].head(limit) if limit else frame[columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows.itertuples(index=False):
        lines.append("| " + " | ".join(_fmt(v) for v in row) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- report builder

_INLINE = re.compile(r"\*\*(.+?)\*\*|`(.+?)`")
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 2px 8px; text-align: right; }
th { background: #f0f0f0; } td:first-child, th:first-child { text-align: left; }
img { max-width: 100%; } code { background: #f4f4f4; padding: 0 3px; }
"""


def _inline_html(text: str) -> str:
    """Escape text, keeping the two inline marks the reports use: **bold** and `code`."""
    parts: list[str] = []
    position = 0
    for match in _INLINE.finditer(text):
        parts.append(html.escape(text[position : match.start()]))
        bold, code = match.groups()
        parts.append(
            f"<strong>{html.escape(bold)}</strong>" if bold is not None else f"<code>{html.escape(code)}</code>"
        )
        position = match.end()
    parts.append(html.escape(text[position:]))
    return "".join(parts)


@dataclass
class Report:
    """A report built once and written twice: self-contained HTML and markdown.

    Plots are saved under `plots/` (linked from the markdown) and embedded in the HTML as
    base64 PNG, so report.html can be mailed or attached to a CI run on its own.
    """

    title: str
    output: Path
    _markdown: list[str] = field(default_factory=list)
    _html: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.heading(self.title, 1)

    def heading(self, text: str, level: int = 2) -> None:
        """A heading in both renderings; the Markdown and the HTML report are built side by side."""
        self._markdown += ["#" * level + " " + text, ""]
        self._html.append(f"<h{level}>{_inline_html(text)}</h{level}>")

    def paragraph(self, text: str) -> None:
        self._markdown += [text, ""]
        self._html.append(f"<p>{_inline_html(text)}</p>")

    def bullets(self, items: Sequence[str]) -> None:
        if not items:
            return
        self._markdown += [*(f"* {item}" for item in items), ""]
        self._html.append("<ul>" + "".join(f"<li>{_inline_html(item)}</li>" for item in items) + "</ul>")

    def table(self, frame: pd.DataFrame, columns: Sequence[str] | None = None, limit: int | None = None) -> None:
        if frame.empty:
            self.paragraph("(none)")
            return
        columns = list(columns or frame.columns)
        rows = frame[columns].head(limit) if limit else frame[columns]
        self._markdown += [markdown_table(rows), ""]
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>"
            for row in rows.itertuples(index=False)
        )
        self._html.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")

    def figure(self, name: str, figure: Any, caption: str) -> None:
        """Save a matplotlib figure as plots/<name>.png and embed it."""
        (self.output / "plots").mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        figure.tight_layout()
        figure.savefig(buffer, format="png", dpi=100)
        plt.close(figure)
        relative = f"plots/{name}.png"
        (self.output / relative).write_bytes(buffer.getvalue())
        self.plots.append(relative)
        # Embedded as a data URI: report.html stays one file that can be attached to a ticket
        # or mailed without its plots/ folder; the PNG on disk serves the markdown report.
        encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
        self._markdown += [f"![{caption}]({relative})", ""]
        self._html.append(
            f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{encoded}">'
            f"<figcaption>{_inline_html(caption)}</figcaption></figure>"
        )

    def write(self) -> None:
        """Write report.html and report.md under the output directory."""
        self.output.mkdir(parents=True, exist_ok=True)
        (self.output / "report.md").write_text("\n".join(self._markdown) + "\n")
        page = (
            f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(self.title)}</title>'
            f"<style>{_STYLE}</style></head><body>\n" + "\n".join(self._html) + "\n</body></html>\n"
        )
        (self.output / "report.html").write_text(page)


def write_summary_and_report(output: Path, summary: dict[str, Any], report: Report, tables: Sequence[str]) -> None:
    """List the outputs in the summary, then write summary.json, report.html and report.md."""
    summary["outputs"] = {
        "tables": sorted(tables),
        "plots": sorted(report.plots),
        "report": "report.html",
        "report_markdown": "report.md",
    }
    write_json(output / "summary.json", summary)
    report.write()


# ---------------------------------------------------------------- analyze


def _plot_throughput(series: pd.DataFrame, limits: Mapping[int, Mapping[str, float]], resolution: str) -> Any:
    # Network in and out per broker with each broker's usable capacity as a dashed line in
    # the same colour: the gap between a line and its dash is the headroom.
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
    return figure


def _plot_bars(labels: Sequence[str], values: Sequence[float], title: str, xlabel: str) -> Any:
    figure, axis = plt.subplots(figsize=(9, max(2.5, 0.35 * len(labels) + 1)))
    axis.barh(list(reversed(labels)), list(reversed(values)))
    axis.set_title(title)
    axis.set_xlabel(xlabel)
    return figure


def _plot_partition_heat(partitions: pd.DataFrame, max_topics: int = 20) -> Any:
    # Topics by rows, partitions by columns: a keyed hot spot shows as one bright cell in an
    # otherwise even row, which a per-topic total would hide.
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
    return figure


def _plot_latency(latency: pd.DataFrame) -> Any:
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
    return figure


def _verdict(report: Report, summary: Mapping[str, Any]) -> None:
    """The answer first: which resource limits the cluster, how long growth can continue,
    what losing the busiest broker does, and how many brokers the load needs. Everything
    after it in the report is the evidence."""
    headroom = summary["headroom"]
    options = summary["options"]
    items = []
    binding = headroom["binding_constraint"]
    if binding:
        items.append(
            f"Binding constraint: broker {binding['broker']} {binding['resource']} at "
            f"{binding['utilisation']:.1%} of capacity (limit {binding['threshold']:.0%}); traffic can grow "
            f"x{_fmt(binding['growth_to_limit'])} before it reaches the limit."
        )
        months = headroom["runway_months"]
        items.append(
            "Growth runway: "
            + (f"{months:.1f} months" if months is not None else "unlimited (no growth)")
            + f" at x{options['monthly_growth']} per month."
        )
        lost = headroom["binding_constraint_broker_lost"]
        if lost:
            items.append(
                f"If broker {headroom['broker_lost']} (the busiest) is lost, broker {lost['broker']} "
                f"{lost['resource']} runs at {lost['utilisation']:.1%} of capacity "
                + ("(above the limit)." if lost["utilisation"] > lost["threshold"] else "(within the limit).")
            )
        sizing = headroom.get("brokers_needed")
        if sizing:
            items.append(
                f"Brokers needed for the {sizing['basis']} load at {sizing['target_utilisation']:.0%} network "
                f"utilisation: {sizing['now']} now, {sizing['in_12_months']} in 12 months at this growth."
            )
    else:
        items.append("No capacity file given: headroom not assessed (pass `--capacity`).")
    items += [f"**Budget violated:** {violation}" for violation in summary["budget"]["violations"]]
    report.heading("Verdict")
    report.bullets(items)


def build_analyze_report(result: Any, output: Path, series: pd.DataFrame, resolution: str) -> Report:
    """The analyze report: verdict, throughput, headroom, shares, hot spots, batches, latency."""
    summary = result.summary
    tables = result.tables
    coverage = summary["coverage"]
    options = summary["options"]
    report = Report("kqp capacity analysis", output)
    report.paragraph(
        f"Capture `{options['capture']}`: {coverage['first_request']} .. {coverage['last_request']} "
        f"({coverage['duration_s']:,.0f} s), {coverage['requests']:,.0f} requests from {coverage['client_ids']} "
        f"client-ids, {coverage['principals']} principals, {coverage['connections']} connections, "
        f"{coverage['topics']} topics, brokers {coverage['brokers']}. "
        f"Sampling 1 in {coverage['sampling_one_in']} connections; capture coverage "
        + (f"{coverage['capture_coverage']:.2%}" if coverage["capture_coverage"] is not None else "unknown")
        + (f" ({coverage['records_dropped']:,} records dropped by the writer)." if coverage["records_dropped"] else ".")
        + f" Replication factor {options['replication_factor']} (modelled), headroom basis: "
        f"{options['headroom_basis']}, monthly growth x{options['monthly_growth']}."
    )
    _verdict(report, summary)

    limits: dict[int, dict[str, float]] = {}
    for row in summary["headroom"]["rows"]:
        metric = "nw_in" if row["resource"] == "NW_IN" else "nw_out"
        limits.setdefault(int(row["broker"]), {})[metric] = row["limit_bytes_per_s"]
    report.heading("Throughput")
    report.figure(
        "throughput",
        _plot_throughput(series.sort_values("window_start"), limits, resolution),
        f"network in/out per broker at {resolution}, with capacity x threshold",
    )
    stats = tables["throughput_stats"]
    observed = stats[(stats["scenario"] == "observed") & (stats["resolution"] == "1s")]
    columns = ["broker", "metric", "mean", "p50", "p95", "p99", "p99_9", "max", "max_at", "seconds_above_limit"]
    for scope in ("cluster", "broker"):
        rows = observed[(observed["scope"] == scope) & ~observed["metric"].str.startswith("requests:")].copy()
        rows["max_at"] = pd.to_datetime(rows["max_at"])
        report.heading(f"{'Cluster' if scope == 'cluster' else 'Per broker'}, per second (bytes/s, requests/s)", 3)
        report.table(rows, columns)
    api_rows = observed[(observed["scope"] == "cluster") & observed["metric"].str.startswith("requests:")]
    report.heading("Request rate by API (cluster, requests/s)", 3)
    report.table(api_rows, ["metric", "mean", "p50", "p99", "max"])

    headroom = summary["headroom"]
    if "headroom" in tables:
        report.heading("Headroom against the capacity file")
        report.table(tables["headroom"])
    if "headroom_broker_lost" in tables:
        report.heading(f"If broker {headroom['broker_lost']} is lost (its leaders re-homed evenly)", 3)
        report.table(tables["headroom_broker_lost"])

    report.heading("Who carries the traffic")
    report.bullets(
        [
            f"**{dimension}**: {pareto['entities']} in all; top 1 `{pareto['top1']['entity']}` carries "
            f"{pareto['top1']['share_bytes']:.1%} of bytes, {pareto['entities_for_80pct_bytes']} carry 80 %, "
            f"the top 20 % carry {pareto['top_20pct_entities_share_bytes']:.1%}."
            for dimension, pareto in summary["shares"].items()
            if pareto.get("entities")
        ]
    )
    shares = tables["shares"]
    for dimension in ("client_id", "topic"):
        rows = shares[shares["dimension"] == dimension]
        report.heading(f"Top {dimension}s by bytes", 3)
        top = rows.head(options["top_n"])
        if len(top):
            report.figure(
                f"top_{dimension}",
                _plot_bars(list(top["entity"]), list(top["bytes"] / 1e6), f"top {dimension}s by bytes", "MB"),
                f"top {dimension}s by bytes",
            )
        report.table(
            rows, ["rank", "entity", "requests", "bytes", "share_bytes", "cumulative_share_bytes"], options["top_n"]
        )
    report.heading("Burstiness of client-ids (p99 / median bytes/s over active seconds)", 3)
    report.table(tables["client_burstiness"].sort_values("burstiness", ascending=False), limit=options["top_n"])

    report.heading("Partition hot spots")
    if len(tables["partitions"]):
        report.figure("partition_heat", _plot_partition_heat(tables["partitions"]), "partition heat table")
    report.table(
        tables["partitions"],
        ["rank", "topic", "partition", "leader", "bytes", "mean_bytes_per_s", "peak_bytes_per_s"],
        options["top_n"],
    )
    report.paragraph(f"Broker skew (max / mean client bytes): {_fmt(summary['skew']['broker_bytes_max_over_mean'])}.")
    report.heading("Topic skew (max / mean partition bytes)", 3)
    report.table(tables["topic_skew"], limit=options["top_n"])

    report.heading("Produce batch sizes")
    report.table(tables["batch_mix"])
    report.table(tables["batch_mix_by_client"], limit=options["top_n"] * 3)

    report.heading("Latency by API (at the proxy; broker = proxy-to-broker round trip)")
    if len(tables["latency_by_api"]):
        report.figure("latency", _plot_latency(tables["latency_by_api"]), "request latency by API")
    report.table(
        tables["latency_by_api"],
        ["api", "responses", "p50_ms", "p95_ms", "p99_ms", "p99_9_ms", "max_ms", "broker_p99_ms"],
    )
    report.heading("Errors")
    report.table(tables["errors"])
    report.heading("Throttles (broker-returned vs proxy-applied)")
    report.table(tables["throttles"])
    return report


def write_analyze_outputs(result: Any, output: str | Path) -> None:
    """Write every analyze output under `output` (a driver-local directory)."""
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in result.series_tables.items():
        write_series_table(out / "tables" / name, frame)
    write_tables(out, result.tables)

    # A day at 1 s is 86,400 points per line: long captures are plotted at 1 min.
    resolution = "1min" if result.summary["coverage"]["duration_s"] > MAX_PLOT_POINTS else "1s"
    series = result.series_tables[f"broker_series_{resolution}"][["broker", "window_start", "nw_in", "nw_out"]]
    report = build_analyze_report(result, out, series, resolution)
    write_summary_and_report(out, result.summary, report, [*result.tables, *result.series_tables])
