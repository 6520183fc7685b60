"""Command-line overrides (`runtime.steps=10`, `nodes.train.clip_eps=0.1`).

They are applied to the raw mapping *before* validation, so an override is checked by
exactly the same rules as the file, and a bad one is reported like any other problem
(naming the override it came from).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

from areal_graph.graph.problems import Problem, node_of, suggest
from areal_graph.graph.spec import SECTIONS
from areal_graph.graph.yaml_lines import Path_


def parse_override(text: str) -> tuple[list[str], Any]:
    """'a.b.c=VALUE' -> (['a','b','c'], VALUE parsed as a YAML scalar)."""
    if "=" not in text:
        raise ValueError(f"override {text!r} must look like key.path=value")
    key, _, value = text.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise ValueError(f"override {text!r} has an empty path component")
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return parts, parsed


def apply_overrides(raw: dict, overrides: Iterable[str], file: str) -> tuple[list[Problem], dict[Path_, str]]:
    """Set each override in `raw` (in place); returns problems and path -> override text."""
    problems: list[Problem] = []
    origins: dict[Path_, str] = {}
    for text in overrides:
        try:
            parts, value = parse_override(text)
        except ValueError as err:
            problems.append(Problem(file, None, None, None, f"bad override: {err}"))
            continue
        node = node_of(parts)
        if parts[0] not in SECTIONS:
            problems.append(
                Problem(
                    file,
                    None,
                    node,
                    parts[0],
                    f"override {text!r}: unknown section "
                    f"'{parts[0]}'{suggest(parts[0], SECTIONS)} (sections: {', '.join(SECTIONS)})",
                )
            )
            continue
        target: Any = raw
        ok: bool | None = True  # None: a problem is reported already
        for depth, part in enumerate(parts[:-1]):
            if not isinstance(target, dict):
                ok = False
                break
            if part not in target:
                if depth == 1 and parts[0] in ("nodes", "models"):
                    what = "node" if parts[0] == "nodes" else "model"
                    fld = ".".join(parts[2:] if parts[0] == "nodes" else parts) or None
                    problems.append(
                        Problem(
                            file,
                            None,
                            node,
                            fld,
                            f"override {text!r}: the workflow has no {what} '{part}'{suggest(part, list(target))}",
                        )
                    )
                    ok = None  # reported
                    break
                target[part] = {}
            target = target[part]
        if ok is None:
            continue
        if not ok or not isinstance(target, dict):
            problems.append(
                Problem(
                    file,
                    None,
                    node,
                    ".".join(parts),
                    f"override {text!r}: '{'.'.join(parts[:-1])}' is not a mapping, cannot set '{parts[-1]}' in it",
                )
            )
            continue
        target[parts[-1]] = value
        origins[tuple(parts)] = text
    return problems, origins
