"""YAML values into typed dataclasses, every problem reported with its file, line and path.

Why its own module: the conversion knows nothing of workflows. It reads field names, type
hints, defaults and `check` metadata off any dataclass (graph/spec.py, graph/kinds/,
api/fields.py) and records a `Problem` for each value that does not fit, so that the loader
(graph/loader.py) can report them all at once.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Union

from areal_graph.graph.problems import Problem, node_of, suggest
from areal_graph.graph.yaml_lines import Path_


class BadValue(Exception):
    """Internal: a value does not fit its declared type."""


def type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return " or ".join(type_name(a) for a in inner) + (" or null" if len(inner) < len(args) else "")
    if origin in (list, tuple):
        return "a list"
    if origin is dict or tp is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false"}.get(tp, str(tp))


def described(value: Any) -> str:
    kind = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
        type(None): "null",
    }.get(type(value), type(value).__name__)
    shown = "" if value is None else repr(value) if not isinstance(value, (list, dict)) or len(repr(value)) < 40 else ""
    return f"{kind} {shown}".strip()


class Validator:
    """Converts values and collects the problems. `moved`: fields that now live elsewhere,
    (path) -> where, and how to write it; such a field gets that message, not "unknown"."""

    def __init__(
        self,
        file: str,
        lines: Mapping[Path_, int],
        origins: Mapping[Path_, str],
        moved: Mapping[Path_, str] | None = None,
    ) -> None:
        self.file = file
        self.lines = lines
        self.origins = origins
        self.moved = dict(moved or {})
        self.problems: list[Problem] = []

    # ------------------------------------------------------------------ reporting
    def line(self, path: Path_) -> int | None:
        for cut in range(len(path), -1, -1):
            if path[:cut] in self.lines:
                return self.lines[path[:cut]]
        return None

    def report(self, path: Path_, message: str) -> None:
        """Record a problem at `path` (a tuple into the raw mapping)."""
        node = node_of(path)
        fld = ".".join(str(p) for p in (path[2:] if node is not None else path)) or None
        origin = next((self.origins[path[:c]] for c in range(len(path), 0, -1) if path[:c] in self.origins), None)
        if origin:
            message += f" (set by override '{origin}')"
        self.problems.append(Problem(self.file, self.line(path), node, fld, message))

    # ------------------------------------------------------------------ values
    def convert(self, tp: Any, value: Any, path: Path_) -> Any:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if tp is Any:
            return value
        if origin in (Union, types.UnionType):
            if value is None and type(None) in args:
                return None
            inner = [a for a in args if a is not type(None)]
            return self.convert(inner[0], value, path) if len(inner) == 1 else value
        if origin is Literal:
            if value not in args:
                raise BadValue(f"must be {type_name(tp)}, got {described(value)}{suggest(value, map(str, args))}")
            return value
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise BadValue(f"expected a mapping of {tp.__name__} fields, got {described(value)}")
            built = self.build(tp, value, path)
            if built is None:
                raise Reported()
            return built
        if origin in (list, tuple) or tp in (list, tuple):
            if not isinstance(value, (list, tuple)):
                raise BadValue(f"expected a list, got {described(value)}")
            if origin is tuple and args and args[-1] is not Ellipsis:
                if len(value) != len(args):
                    raise BadValue(f"expected a list of {len(args)} items, got {len(value)}")
                elem_types = list(args)
            else:
                elem_types = [args[0] if args else Any] * len(value)
            items = []
            for i, (et, item) in enumerate(zip(elem_types, value)):
                try:
                    items.append(self.convert(et, item, path + (i,)))
                except BadValue as err:
                    raise BadValue(f"item {i}: {err}") from None
            return tuple(items) if origin is tuple else items
        if origin is dict or tp is dict:
            if not isinstance(value, dict):
                raise BadValue(f"expected a mapping, got {described(value)}")
            return dict(value)
        if tp is bool or tp is str:
            if not isinstance(value, tp):
                raise BadValue(f"expected {type_name(tp)}, got {described(value)}")
            return value
        if tp is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise BadValue(f"expected an integer, got {described(value)}")
            return value
        if tp is float:
            if isinstance(value, str):
                # YAML 1.1 reads `2e-5` (no dot) as a string; accept it as the number it means.
                try:
                    return float(value)
                except ValueError:
                    pass
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise BadValue(f"expected a number, got {described(value)}")
            return float(value)
        return value

    def build(
        self,
        cls: type,
        raw: Mapping[str, Any],
        path: Path_,
        inject: Mapping[str, Any] | None = None,
        also_allowed: Sequence[str] = (),
    ) -> Any:
        """Validate `raw` against dataclass `cls`; returns the instance, or None if it had problems."""
        inject = dict(inject or {})
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in inject}
        before = len(self.problems)
        for key in raw:
            if path + (key,) in self.moved:
                self.report(path + (key,), f"moved: {self.moved[path + (key,)]}")
            elif key not in fields and key not in also_allowed:
                options = list(fields) + list(also_allowed)
                self.report(
                    path + (key,),
                    f"unknown field '{key}'{suggest(key, options)}; allowed: {', '.join(options) or 'none'}",
                )
        values: dict[str, Any] = {}
        for name, f in fields.items():
            if name not in raw:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    self.report(path + (name,), f"missing required field '{name}'")
                continue
            try:
                value = self.convert(hints[name], raw[name], path + (name,))
            except BadValue as err:
                self.report(path + (name,), f"{err}")
                continue
            except Reported:
                continue
            check = f.metadata.get("check")
            if check is not None and value is not None:
                why = check(value)
                if why:
                    self.report(path + (name,), f"{why}, got {value!r}")
                    continue
            values[name] = value
        if len(self.problems) > before:
            return None
        return cls(**inject, **values)


class Reported(Exception):
    """Internal: a nested value had problems, already reported."""
