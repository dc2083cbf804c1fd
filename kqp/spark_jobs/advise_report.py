"""advise's outputs: quotas.yaml, the tables (Parquet and CSV), summary.json and the report
(HTML and Markdown) with its plots, from the job's `AdviseResult`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kqp.spark_jobs.advice_math import (
    BYTE_RATE_TYPES,
    PRODUCE,
    Advice,
    Resource,
)


@dataclass
class AdviseResult:
    summary: dict[str, Any]
    tables: dict[str, pd.DataFrame]
    quotas_yaml: str
    advice: Advice
    series_before: dict[Resource, np.ndarray]
    series_after: dict[Resource, np.ndarray] | None
    violations: list[str]


def _plot_loads(loads: pd.DataFrame) -> Any:
    """Each broker resource's load at the headroom statistic as a share of its limit (100 %)."""
    import matplotlib.pyplot as plt

    labels = [f"broker {b} {r}" for b, r in zip(loads["broker"], loads["resource"], strict=True)]
    positions = np.arange(len(loads))
    figure, axis = plt.subplots(figsize=(max(6, 1.4 * len(loads) + 2), 4))
    columns = [("before", "as captured"), ("modelled_after", "advised (modelled)")]
    if loads["verified_after"].notna().any():
        columns.append(("verified_after", "advised (replayed through kqp.quotas)"))
    width = 0.8 / len(columns)
    for offset, (column, label) in enumerate(columns):
        share = 100 * loads[column] / loads["limit"]
        axis.bar(positions + (offset - (len(columns) - 1) / 2) * width, share, width, label=label)
    axis.axhline(100, color="black", linestyle="--", linewidth=0.8)
    axis.set_xticks(list(positions), labels, rotation=20, ha="right")
    axis.set_ylabel("% of the limit (capacity x threshold)")
    axis.set_title("broker load at the headroom statistic, before and after the advice")
    axis.legend(fontsize="small")
    return figure


def _plot_series(result: AdviseResult, unit: int) -> Any:
    import matplotlib.pyplot as plt

    resources = sorted(result.series_before)
    figure, axes = plt.subplots(len(resources), 1, figsize=(11, 2.2 * len(resources) + 0.5), sharex=True)
    axes = np.atleast_1d(axes)
    limits = {(row.broker, row.resource): row.limit for row in result.tables["broker_loads"].itertuples()}
    for axis, resource in zip(axes, resources, strict=True):
        before = result.series_before[resource]
        axis.plot(np.arange(len(before)) * unit, before / 1e6, linewidth=0.8, label="as captured")
        if result.series_after is not None:
            after = result.series_after[resource]
            axis.plot(np.arange(len(after)) * unit, after / 1e6, linewidth=0.8, label="replayed with the advice")
        axis.axhline(limits[resource] / 1e6, color="black", linestyle="--", linewidth=0.8)
        axis.set_ylabel("MB/s")
        axis.set_title(f"broker {resource[0]} {resource[1]}", fontsize="small")
    axes[0].legend(loc="upper right", fontsize="small")
    axes[-1].set_xlabel("seconds from the start of the capture")
    return figure


def _plot_entities(advice: pd.DataFrame, top_n: int) -> Any:
    import matplotlib.pyplot as plt

    rows = advice.sort_values("demand_stat_bytes_per_s", ascending=False).head(top_n)
    kinds = ["produce" if t == PRODUCE else "fetch" for t in rows["quota_type"]]
    labels = [f"{entity} ({kind})" for entity, kind in zip(rows["entity"], kinds, strict=True)]
    allowed = [
        q if q is not None and not pd.isna(q) else d
        for q, d in zip(rows["quota_bytes_per_s"], rows["demand_stat_bytes_per_s"], strict=True)
    ]
    positions = np.arange(len(rows))
    figure, axis = plt.subplots(figsize=(10, max(2.5, 0.4 * len(rows) + 1)))
    axis.barh(positions + 0.2, rows["demand_stat_bytes_per_s"] / 1e6, 0.4, label="offered (statistic)")
    axis.barh(positions - 0.2, np.array(allowed) / 1e6, 0.4, label="allowed (quota, or all when unlimited)")
    axis.set_yticks(list(positions), labels)
    axis.invert_yaxis()
    axis.set_xlabel("MB/s")
    axis.set_title("offered vs allowed per entity")
    axis.legend(fontsize="small")
    return figure


def write_advise_outputs(result: AdviseResult, output: str, unit: int) -> None:
    from kqp.spark_jobs.report import Report, write_summary_and_report, write_tables

    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quotas.yaml").write_text(result.quotas_yaml)
    write_tables(out, result.tables)
    summary = result.summary
    options = summary["options"]
    report = Report("kqp quota advice", out)
    limited = summary["limited"]
    report.paragraph(
        f"Capture `{options['capture']}`, capacity `{options['capacity']}`, basis {options['basis']}, "
        f"entities by {options['entity']}, scope {options['scope']}: {len(limited)} quotas advised in "
        f"{summary['entries']} entries (`quotas.yaml`). "
        + ("The advice fits every broker." if summary["fits"] else "**The advice does not fit.**")
    )
    report.paragraph(summary["guarantee"])
    report.bullets([f"**Cannot be met:** {reason}" for reason in summary["unmet"]])
    report.heading("Broker load before and after")
    loads = result.tables["broker_loads"]
    report.figure("broker_loads", _plot_loads(loads), "broker load at the headroom statistic, before and after")
    report.figure("broker_series", _plot_series(result, unit), "network per broker over time, before and after")
    report.table(loads)
    report.heading("Offered vs allowed per entity")
    advice = result.tables["advice"]
    if len(advice):
        report.figure("entities", _plot_entities(advice, options["top_n"]), "offered vs allowed per entity")
    report.table(advice)
    report.heading("Entries written")
    report.table(result.tables["entries"])
    if "diff" in result.tables:
        report.heading(f"Against the current quotas (`{options['current']}`)")
        diff = result.tables["diff"]
        changed = diff[diff[[f"{t}_changed" for t in BYTE_RATE_TYPES]].any(axis=1)]
        report.paragraph(f"{len(changed)} of {len(diff)} captured (principal, client-id) pairs change limits.")
        report.table(changed)
    report.paragraph("Not advised: " + "; ".join(summary["not_advised"]) + ".")
    write_summary_and_report(out, summary, report, list(result.tables))
