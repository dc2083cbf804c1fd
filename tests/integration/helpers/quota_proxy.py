"""A proxy process started from a quota file, and the producer figures the quota tests read."""

from __future__ import annotations

import re
from pathlib import Path

from harness.proxy_process import ProxyProcess

QUOTA = 1024 * 1024  # bytes/s
RECORD_SIZE = 1024
WARMUP_S = 14.0
TOLERANCE = 0.10
# ProducerPerformance prints one of these every 5 s, then a summary with percentiles.
_WINDOW = re.compile(r"^(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\)", re.M)
_THROTTLE_AVG = re.compile(r"producer-metrics:produce-throttle-time-avg:\{client-id=([^}]*)\}\s*:\s*([\d.NaN]+)")


class ConfiguredProxy(ProxyProcess):
    """`kqp serve` with a config file on top of the harness's command-line flags."""

    def __init__(self, upstream: str, log_path: Path, config: Path, workers: int = 1) -> None:
        super().__init__(upstream, log_path, config=config, workers=workers)


def quota_file(path: Path, entries: str) -> Path:
    path.write_text(f"quotas:\n  entries:\n{entries}")
    return path


def producer_quota_entry(client_id: str, rate: int) -> str:
    return f"    - entity: {{client-id: {client_id}}}\n      producer_byte_rate: {rate}\n"


def steady_rate(output: str, interval_s: float = 5.0) -> float:
    """Bytes/s over ProducerPerformance's 5 s reports that start after the warm-up."""
    windows = [float(m[2]) * RECORD_SIZE for m in _WINDOW.finditer(output) if "th," not in m.group(0)]
    steady = windows[int(WARMUP_S // interval_s):]
    assert len(steady) >= 2, f"too few steady-state windows in:\n{output[-3000:]}"
    return sum(steady) / len(steady)


def throttle_avg(output: str, client_id: str) -> float:
    values = [float(v) for c, v in _THROTTLE_AVG.findall(output) if c == client_id and v != "NaN"]
    assert values, f"no produce-throttle-time-avg for {client_id} in the metrics printed"
    return values[0]
