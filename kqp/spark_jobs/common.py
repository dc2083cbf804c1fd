"""Names the replay jobs share: progress lines, the budget exit code, the anonymous principal."""

from __future__ import annotations

import sys
import time
from typing import Any

# The principal name of unauthenticated connections, as the capture writes it.
ANONYMOUS = "ANONYMOUS"
# `analyze` and `whatif` exit with it when a budget is violated, so a change can gate CI.
BUDGET_EXIT_CODE = 3


class Progress:
    """Step-by-step progress on stderr, with elapsed time, for long jobs."""

    def __init__(self, job: str, steps: int, stream: Any = None) -> None:
        self.job = job
        self.steps = steps
        self.done = 0
        self.started = time.monotonic()
        self.stream = stream if stream is not None else sys.stderr

    def step(self, what: str) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.started
        print(f"[{self.job} {self.done}/{self.steps} {elapsed:6.1f}s] {what}", file=self.stream, flush=True)
