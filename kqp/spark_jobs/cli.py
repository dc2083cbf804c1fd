"""`kqp replay analyze|whatif|advise|live|generate ...`: the Spark jobs' command line.

`kqp replay --package OUT.zip` writes the kqp package as a zip for `spark-submit --py-files`.

Each sub-command hands its arguments to the job module's own `main`, so
`kqp replay analyze ARGS` and `spark-submit ... kqp/spark_jobs/analyze.py ARGS` accept the
same arguments. `--master` defaults to local[*] (or to spark-submit's choice).
"""

from __future__ import annotations

import importlib
import sys
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

JobMain = Callable[[Sequence[str] | None], int]

USAGE = """usage: kqp replay {analyze,whatif,advise,live,generate} ...
       kqp replay --package OUT.zip

  analyze   capacity analysis of a capture (throughput percentiles, shares, hot spots, headroom)
  whatif    replay a capture through kqp.quotas with a quota config (who would be throttled)
  advise    propose fair byte-rate quotas that keep every broker under its capacity, and verify them
  live      re-send a capture's produce/fetch load to a target cluster, time-scaled
  generate  write a synthetic capture (for demos, tests and benchmarks)

  --package OUT.zip  write the kqp package as a zip for spark-submit --py-files

Run `kqp replay <command> --help` for the options of each."""


# Sub-command -> module whose `main(argv)` runs it; imported lazily (pyspark is heavy).
JOB_MODULES = {
    "analyze": "kqp.spark_jobs.analyze",
    "whatif": "kqp.spark_jobs.whatif",
    "advise": "kqp.spark_jobs.advise",
    "live": "kqp.spark_jobs.live",
    "generate": "kqp.spark_jobs.synthetic",
}


def _job(name: str) -> JobMain:
    module = importlib.import_module(JOB_MODULES[name])
    job_main: JobMain = module.main
    return job_main


def write_package_zip(target: Path) -> int:
    """Zip the kqp package this process runs (a checkout or an installed one); returns the file count.

    Entries are `kqp/...`, so the zip on an executor's PYTHONPATH makes `import kqp` work.
    """
    package = Path(__file__).resolve().parents[1]
    files = sorted(path for path in package.rglob("*")
                   if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc")
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            archive.write(path, path.relative_to(package.parent).as_posix())
    return len(files)


def main(argv: list[str]) -> int:
    """Dispatch `kqp replay <job> ...`; returns the job's exit code (2 on a usage error)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "--package":
        if len(argv) != 2:
            print(f"kqp replay: --package takes one argument, the zip to write\n\n{USAGE}", file=sys.stderr)
            return 2
        count = write_package_zip(Path(argv[1]))
        jobs = Path(__file__).resolve().parent
        print(f"wrote {argv[1]} ({count} files); submit a job with\n"
              f"  spark-submit --master URL --py-files {argv[1]} {jobs / 'analyze.py'} ARGS")
        return 0
    try:
        job = _job(argv[0])
    except KeyError:
        print(f"kqp replay: unknown command {argv[0]!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return job(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
