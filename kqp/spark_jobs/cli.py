"""`kqp replay analyze|whatif|live|generate ...`: the Spark jobs' command line.

Each sub-command hands its arguments to the job module's own `main`, so
`kqp replay analyze ARGS` and `spark-submit ... kqp/spark_jobs/analyze.py ARGS` accept the
same arguments. `--master` defaults to local[*] (or to spark-submit's choice).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

JobMain = Callable[[Sequence[str] | None], int]

USAGE = """usage: kqp replay {analyze,whatif,live,generate} ...

  analyze   capacity analysis of a capture (throughput percentiles, shares, hot spots, headroom)
  whatif    replay a capture through kqp.quotas with a quota config (who would be throttled)
  live      re-send a capture's produce/fetch load to a target cluster, time-scaled
  generate  write a synthetic capture (for demos, tests and benchmarks)

Run `kqp replay <command> --help` for the options of each."""


# Sub-command -> module whose `main(argv)` runs it; imported lazily (pyspark is heavy).
JOB_MODULES = {
    "analyze": "kqp.spark_jobs.analyze",
    "whatif": "kqp.spark_jobs.whatif",
    "live": "kqp.spark_jobs.live",
    "generate": "kqp.spark_jobs.synthetic",
}


def _job(name: str) -> JobMain:
    module = importlib.import_module(JOB_MODULES[name])
    job_main: JobMain = module.main
    return job_main


def main(argv: list[str]) -> int:
    """Dispatch `kqp replay <job> ...`; returns the job's exit code (2 on a usage error)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    try:
        job = _job(argv[0])
    except KeyError:
        print(f"kqp replay: unknown command {argv[0]!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return job(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
