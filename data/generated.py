"""Datasets named by what generates them rather than by a file: `reasoning_gym:<task>?...`
(data/reasoning_gym.py), `textarena:<game>?...` (data/textarena_games.py) and
`verifiers:<taskset>?...` (data/verifiers_tasks.py).

The one place that says which names are generated: `validate` checks them (`check`), and the
run and `eval` turn them into an ordinary JSONL file in the kit cache (`materialize`, written
once), so everything after sees a file. A new source is a module with SCHEME, `check_spec` and
`materialize`, listed in SOURCES.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from areal_graph.data import reasoning_gym, textarena_games, verifiers_tasks

SOURCES = (reasoning_gym, textarena_games, verifiers_tasks)
SCHEMES: tuple[str, ...] = tuple(source.SCHEME for source in SOURCES)


def source_of(spec: Any) -> Any:
    """The module that generates `spec`, or None for a file path (or a builtin: name)."""
    return next((source for source in SOURCES if str(spec).startswith(source.SCHEME)), None)


def check(spec: str) -> str | None:
    """What is wrong with generated dataset `spec` (None: it can be generated here)."""
    return source_of(spec).check_spec(spec)


def materialize(spec: str, root: Path) -> Path:
    """The JSONL file holding `spec`'s rows under `root` (generated on first use)."""
    return source_of(spec).materialize(spec, root)
