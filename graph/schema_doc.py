"""A field reference for workflow YAML, generated from the spec dataclasses.

Generated rather than written so it can never disagree with what the loader accepts:
names, types, defaults and help all come from `spec.py` / `kinds/`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from areal_graph.api.sampling import SamplingParams
from areal_graph.graph import spec as S
from areal_graph.graph.kinds.common import IMPLICIT_ROLLOUT_KEYS, ROLLOUT_WRITES
from areal_graph.graph.kinds.registry import BUILTIN_KINDS


def _type_text(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " or ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return " or ".join(_type_text(a) for a in inner) + (" or null" if len(inner) < len(args) else "")
    if origin is list and args and typing.get_origin(args[0]) is typing.Literal:
        return "list of " + ", ".join(str(a) for a in typing.get_args(args[0]))
    if origin in (list, tuple):
        return "list"
    if origin is dict:
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return "null" if f.default is None else repr(f.default)
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        return "(see below)" if dataclasses.is_dataclass(value) else repr(value)
    return "required"


def field_rows(cls: type, skip: tuple[str, ...] = ()) -> list[tuple[str, str, str, str]]:
    """(name, type, default, help) for each field of a spec dataclass."""
    hints = typing.get_type_hints(cls)
    return [
        (f.name, _type_text(hints[f.name]), _default_text(f), f.metadata.get("help", ""))
        for f in dataclasses.fields(cls)
        if f.name not in skip
    ]


def schema_markdown() -> str:
    """Markdown tables of every section and node kind."""
    out = ["# Workflow fields", ""]

    def table(title: str, cls: type, skip: tuple[str, ...] = ()) -> None:
        out.extend([f"## {title}", "", "| field | type | default | meaning |", "|---|---|---|---|"])
        out.extend(f"| {n} | {t} | {d} | {h} |" for n, t, d, h in field_rows(cls, skip))
        out.append("")

    table("models.NAME", S.ModelSpec, skip=("name",))
    table("models.NAME.train", S.OptimConfig)
    table("models.NAME.lagged", S.LaggedSpec)
    table("data", S.DataSpec)
    table("inference", S.InferenceSpec)
    table("inference.speculative", S.SpeculativeSpec)
    table("runtime", S.RuntimeSpec)
    table("runtime.no_signal", S.NoSignalSpec)
    out.extend(
        [
            "## nodes.NAME",
            "",
            "Every node has `kind`, `reads` and `writes` (lists of keys) and, for model kinds, `model`.",
            f"The rollout writes {', '.join(ROLLOUT_WRITES)} (the default `writes`) and provides "
            f"{', '.join(IMPLICIT_ROLLOUT_KEYS)} implicitly.",
            "",
        ]
    )
    for kind, info in BUILTIN_KINDS.items():
        title = f"kind: {kind} ({info.doc}; model {info.model}; {info.phase} side)"
        if dataclasses.fields(info.params):
            table(title, info.params)
        else:
            out.extend([f"## {title}", "", "No parameters.", ""])
    table("kind: rollout, sampling", SamplingParams)
    out.extend(
        [
            "## kind: package.module:NAME",
            "",
            "A node kind of your own: a module-level `areal_graph.graph.kind.NodeKind` (see graph/kind.py).",
            "",
        ]
    )
    return "\n".join(out)
