"""Typed configuration fields: a default, a range check and a help line on each dataclass field.

Why in the field's metadata: the rule then sits next to the default it constrains, the
workflow loader derives its validation from the dataclasses alone (`graph/loader.py`), the
schema reference is generated from them (`graph/schema_doc.py`), and an object built in
Python (not from YAML) can be checked with the same rules (`field_problems`).

Torch-free and graph-free: engines, the graph and user code all use these.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import field
from functools import partial
from typing import Any

# A check returns None when the value is fine, else a short description of what is expected.
Check = Callable[[Any], str | None]


def positive(v: Any) -> str | None:
    return None if v > 0 else "must be > 0"


def non_negative(v: Any) -> str | None:
    return None if v >= 0 else "must be >= 0"


def unit_interval(v: Any) -> str | None:
    return None if 0 <= v <= 1 else "must be in [0, 1]"


def open_unit_interval_upper(v: Any) -> str | None:
    return None if 0 < v <= 1 else "must be in (0, 1]"


def top_k_check(v: Any) -> str | None:
    return None if v == -1 or v > 0 else "must be -1 (disabled) or > 0"


def dual_clip_check(v: Any) -> str | None:
    return None if v > 1 else "must be > 1 (the dual-clip bound c of Ye et al.)"


def greater_than_one(v: Any) -> str | None:
    return None if v >= 1 else "must be >= 1"


def import_path_check(v: Any) -> str | None:
    module, sep, attr = str(v).partition(":")
    return None if sep and module and attr else "must be an import path 'package.module:Name'"


def device_check(v: Any) -> str | None:
    return None if re.fullmatch(r"cpu|cuda(:\d+)?", str(v)) else "must be cpu, cuda or cuda:N"


def betas_check(v: Any) -> str | None:
    return None if all(0 <= b < 1 for b in v) else "both betas must be in [0, 1)"


def non_empty_strings(v: Any) -> str | None:
    return None if all(isinstance(s, str) and s for s in v) else "must be non-empty strings"


def non_empty_string(v: Any) -> str | None:
    return None if isinstance(v, str) and v.strip() else "must be a non-empty string"


def non_negative_ints(v: Any) -> str | None:
    return (
        None
        if all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v)
        else ("must be non-negative integers")
    )


def loggers_check(v: Any) -> str | None:
    """runtime.loggers: metrics.jsonl is required (`areal-graph trace` and `--resume` read it), and
    a name twice would log every step twice."""
    names = list(v)
    if "jsonl" not in names:
        return "must include 'jsonl' (metrics.jsonl is what `areal-graph trace` and `run --resume` read)"
    repeated = sorted({n for n in names if names.count(n) > 1})
    return f"names {', '.join(map(repr, repeated))} more than once" if repeated else None


def cfg(default: Any, check: Check | None = None, help: str = "") -> Any:
    """A dataclass field with a default, a range check and a one-line help text."""
    if isinstance(default, (list, dict)):
        return field(default_factory=partial(type(default), default), metadata={"check": check, "help": help})
    return field(default=default, metadata={"check": check, "help": help})


def field_problems(obj: Any) -> list[str]:
    """Every field of dataclass `obj` whose value fails its `check` ('name must be ..., got v').

    For objects built in Python rather than from YAML (the loader reports YAML problems with
    file and line itself). Type errors that make a check itself fail are reported too.
    """
    out = []
    for f in dataclasses.fields(obj):
        check = f.metadata.get("check")
        value = getattr(obj, f.name)
        if check is None or value is None:
            continue
        try:
            why = check(value)
        except TypeError:
            why = "has the wrong type"
        if why:
            out.append(f"{f.name} {why}, got {value!r}")
    return out
