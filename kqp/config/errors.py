"""Configuration problems, each pinned to a file, a position and a field path."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    """One thing wrong, said where an editor can jump to it ("FILE:LINE:COLUMN: path: why").
    Every problem is collected before raising, so a user fixes a file in one pass."""

    # The file the problem is in; several when no single file holds the field (a missing key).
    files: tuple[str, ...]
    # Dotted path with list indexes, e.g. "quotas.entries[2].producer_byte_rate"; "" for the whole file.
    path: str
    message: str
    line: int | None = None  # 1-based
    column: int | None = None  # 1-based

    def __str__(self) -> str:
        where = ", ".join(self.files) if self.files else "<no file>"
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        if self.path:
            return f"{where}: {self.path}: {self.message}"
        return f"{where}: {self.message}"


class ConfigError(Exception):
    """A configuration that cannot be used; the message lists every problem found."""

    def __init__(self, problems: Sequence[ConfigProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__(self._render())

    def _render(self) -> str:
        if len(self.problems) == 1:
            return f"invalid configuration: {self.problems[0]}"
        lines = [f"invalid configuration ({len(self.problems)} problems):"]
        lines.extend(f"  {problem}" for problem in self.problems)
        return "\n".join(lines)
