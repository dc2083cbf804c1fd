"""Whether two runs of a Spark job (`analyze`, `whatif`, `advise`) wrote the same outputs, value for value.

    .venv/bin/python bench/compare_outputs.py BEFORE_DIR AFTER_DIR

The check behind "outputs identical before and after" in docs/benchmarks.md (issue 43's
acceptance 3: advise's output on the 1M capture of bench/spark_replay.py): run the job from the
old tree and from the new one on the same capture with the same arguments, into two
directories, then compare them with this. It reads every table under tables/ (Parquet) back and
compares each column exactly (NaN equal to NaN, dtype included), in row order; compares the
CSVs byte for byte, and quotas.yaml, report.md and summary.json with each directory's own path
replaced by a placeholder and summary.json's `generated_at` left out (the only things two runs
may differ in). Plots are not compared: their PNG bytes carry the renderer's metadata.
`--same OLD NEW` (repeatable) treats two input paths as one, for runs that read the same capture
or capacity file under different paths.

Prints one line per difference and a last line with their count; exit status 1 when any.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

PLACEHOLDER = "<OUTPUT>"
# Keys of summary.json that say when the run was, not what it found.
RUN_KEYS = ("generated_at",)


def tables(root: Path) -> dict[str, pd.DataFrame]:
    directory = root / "tables"
    if not directory.exists():
        return {}
    return {path.name: pd.read_parquet(path) for path in sorted(directory.iterdir())}


def table_differences(before: Path, after: Path) -> list[str]:
    old, new = tables(before), tables(after)
    found = [f"table set: {sorted(old)} against {sorted(new)}"] if sorted(old) != sorted(new) else []
    for name in sorted(set(old) & set(new)):
        a, b = old[name], new[name]
        if list(a.columns) != list(b.columns) or len(a) != len(b):
            found.append(f"{name}: columns or rows differ ({a.shape} against {b.shape})")
            continue
        for column in a.columns:
            if not a[column].reset_index(drop=True).equals(b[column].reset_index(drop=True)):
                found.append(f"{name}.{column} differs")
    return found


def without_paths(value: Any, before: Path, after: Path, same: Sequence[tuple[str, str]] = ()) -> Any:
    """`value` with both output directories' paths replaced by PLACEHOLDER, each `same` pair's
    first path by its second, and run keys dropped."""
    if isinstance(value, dict):
        return {k: without_paths(v, before, after, same) for k, v in value.items() if k not in RUN_KEYS}
    if isinstance(value, list):
        return [without_paths(v, before, after, same) for v in value]
    if isinstance(value, str):
        for old, new in same:
            value = value.replace(old, new)
        return value.replace(str(before), PLACEHOLDER).replace(str(after), PLACEHOLDER)
    return value


def file_differences(before: Path, after: Path, same: Sequence[tuple[str, str]] = ()) -> list[str]:
    found = []
    names = sorted({p.relative_to(before) for p in (before / "csv").glob("*")} if (before / "csv").exists() else [])
    for name in names:
        a, b = before / name, after / name
        if not b.exists() or a.read_bytes() != b.read_bytes():
            found.append(str(name))
    for text in ("quotas.yaml", "report.md"):
        a, b = before / text, after / text
        if a.exists() != b.exists() or (
            a.exists()
            and without_paths(a.read_text(), before, after, same) != without_paths(b.read_text(), before, after, same)
        ):
            found.append(text)
    summary_a = without_paths(json.loads((before / "summary.json").read_text()), before, after, same)
    summary_b = without_paths(json.loads((after / "summary.json").read_text()), before, after, same)
    for key in sorted(set(summary_a) | set(summary_b)):
        if json.dumps(summary_a.get(key), sort_keys=True) != json.dumps(summary_b.get(key), sort_keys=True):
            found.append(f"summary.json: {key}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument(
        "--same", nargs=2, action="append", default=[], metavar=("OLD", "NEW"), help="input paths to treat as one"
    )
    args = parser.parse_args(argv)
    before, after = args.before.resolve(), args.after.resolve()
    same = [(old, new) for old, new in args.same]
    differences = table_differences(before, after) + file_differences(before, after, same)
    for difference in differences:
        print(f"DIFFERS {difference}")
    print(f"compared {before} and {after}: {len(tables(before))} tables, {len(differences)} differences")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
