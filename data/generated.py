"""Datasets named by what generates them rather than by a file: `reasoning_gym:<task>?...`
(data/reasoning_gym.py), `textarena:<game>?...` (data/textarena_games.py) and
`verifiers:<taskset>?...` (data/verifiers_tasks.py).

The one place that says which names are generated: `validate` checks them (`check`), and the
run and `eval` turn them into an ordinary JSONL file in the kit cache (`materialize`, written
once), so everything after sees a file. `validate` renders a sample of them (`sample_rows`, the
first rows, or the file an earlier run wrote: `cached`) to see whether the prompts fit the model's
context. A new source is a module with SCHEME, `check_spec`, `materialize`, `cache_path` and
`sample_rows`, listed in SOURCES.
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


def cached(spec: str, root: Path) -> Path | None:
    """The file `materialize` wrote for `spec` under `root` earlier, if there is one."""
    path = source_of(spec).cache_path(spec, root)
    return path if path is not None and path.is_file() else None


def sample_rows(spec: str, n: int) -> list[dict[str, Any]]:
    """The first `n` rows of generated dataset `spec`, as `materialize` would write them, without writing."""
    return source_of(spec).sample_rows(spec, n)
