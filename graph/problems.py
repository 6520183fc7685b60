"""What a workflow problem is, and how it is phrased.

A `Problem` names file, YAML line, node and field so the reader can go straight to the spot;
`WorkflowError` carries all of them, because fixing one problem per run is a slow way to
fix a file.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a workflow. `node` is None for problems outside `nodes:`."""

    file: str
    line: int | None
    node: str | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        parts = [where]
        if self.node is not None:
            parts.append(f"node '{self.node}'")
        if self.field:
            parts.append(f"field '{self.field}'")
        return ", ".join(parts) + f": {self.message}"


class WorkflowError(Exception):
    """A workflow failed to load; `problems` lists everything found, in file order."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__(
            f"{len(self.problems)} problem(s) in workflow:\n" + "\n".join(f"  - {p}" for p in self.problems)
        )


def node_of(parts: Sequence[Any]) -> str | None:
    """The node a raw-mapping path points into (`("nodes", NAME, ...)`), else None."""
    return str(parts[1]) if len(parts) > 1 and parts[0] == "nodes" else None


def suggest(word: Any, options: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest option, or '' when nothing is close."""
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
