"""The one read of a Cruise Control capacity file, for the cluster guard and the Spark jobs.

The guard's section reads it when the configuration is loaded or reloaded (never at a
control step of the running guard), and analyze and advise when they start; the parsing
and the arithmetic are kqp.quotas.capacity's, which reads no file itself.
"""

from __future__ import annotations

from pathlib import Path

from kqp.quotas.capacity import CapacityFile, parse_capacity_json


def load_capacity(path: str | Path) -> CapacityFile:
    """Read and parse a capacity JSON file (OSError when it cannot be read, CapacityFileError
    when it is not a capacity file)."""
    return parse_capacity_json(Path(path).read_text(), str(path))
