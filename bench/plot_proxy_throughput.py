"""Draw a proxy_throughput report's CPU figures as bars: each hop's CPU per GB, per workload and
side, as a multiple of the bare relay's, with issue 40's bounds where it sets one.

    .venv/bin/python bench/plot_proxy_throughput.py out/proxy_throughput.md docs/img/proxy_cpu_by_path.png

Reads the report's "paths side by side" table (medians over rounds), the one
bench/proxy_throughput.py writes; a table of twelve ratios hides which hop costs what where,
a bar chart shows it at a glance (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

# Issue 40, acceptance 1: kqp's CPU at most this multiple of the relay's. The unbatched
# producer's bound is per 100 B record, which is its CPU per GB times a constant.
BOUNDS = {
    ("batched-1KB", "producer"): 1.5,
    ("batched-1KB", "consumer"): 1.1,
    ("unbatched-100B", "producer"): 1.25,
}
HOPS = (("relay", "bare relay"), ("proxy", "kqp"), ("kroxylicious", "Kroxylicious 0.12.0"))


def cpu_per_gb(report: str) -> dict[tuple[str, str, str], float]:
    """(workload, side, path) -> CPU s/GB, from the side-by-side table."""
    figures: dict[tuple[str, str, str], float] = {}
    in_table = False
    for line in report.splitlines():
        if line.startswith("### The paths side by side"):
            in_table = True
            continue
        if in_table and line.startswith("###"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if in_table and len(cells) == 8 and cells[5] not in ("-", "CPU s/GB") and not cells[5].startswith("--"):
            workload, side, path = cells[:3]
            figures[workload, side, path] = float(cells[5])
    if not figures:
        raise SystemExit("no 'paths side by side' table in the report")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path)
    parser.add_argument("png", type=Path)
    args = parser.parse_args()
    figures = cpu_per_gb(args.report.read_text())

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(workload, side) for workload, side, _ in figures}, key=lambda g: (g[0], g[1] != "producer"))
    width = 0.8 / len(HOPS)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    highest = 0.0
    for index, (path, label) in enumerate(HOPS):
        ratios = [figures.get((w, s, path), float("nan")) / figures[w, s, "relay"] for w, s in groups]
        bars = ax.bar([g + (index - 1) * width for g in range(len(groups))], ratios, width, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
        highest = max([highest, *(r for r in ratios if r == r)])
    for position, group in enumerate(groups):
        bound = BOUNDS.get(group)
        if bound is not None:
            ax.hlines(bound, position - 0.45, position + 0.45, colors="black", linestyles="dashed")
    ax.plot([], [], "k--", label="issue 40's bound for kqp")
    ax.set_xticks(range(len(groups)), [f"{w}\n{s}" for w, s in groups])
    ax.set_ylabel("hop CPU per GB, x the bare relay's")
    ax.set_title("CPU of each hop, medians over rounds (bench/proxy_throughput.py)")
    ax.set_ylim(0, highest * 1.3)  # room above the bars for the legend
    ax.legend(fontsize=8, ncol=2, loc="upper left")
    fig.tight_layout()
    args.png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=100)


if __name__ == "__main__":
    main()
