"""Names the replay jobs share: progress lines, the budget exit code, the anonymous principal."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

# The principal name of unauthenticated connections, as the capture writes it.
ANONYMOUS = "ANONYMOUS"
# `analyze` and `whatif` exit with it when a budget is violated, so a change can gate CI.
BUDGET_EXIT_CODE = 3


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` with every option's default, as argparse's ArgumentDefaultsHelpFormatter appends
    it, except where that would read wrong: a help text that already says its default is left
    alone, a flag reads "(default: off)" rather than "False", and an option without a value by
    default (None, an empty list: computed, or "not set"), a required one or a positional gets
    nothing appended; such an option must say in its own help what happens without it
    (tests/unit/test_replay_cli_help.py checks every option of every `kqp replay` command).
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or action.required or "default" in text.lower():
            return text
        if isinstance(action, argparse._StoreTrueAction):
            return f"{text} (default: off)"
        if action.default is None or action.default == []:
            return text
        return super()._get_help_string(action) or text


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
