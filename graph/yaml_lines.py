"""YAML that remembers where each key was written, read within bounds.

`yaml.safe_load` drops positions; composing the node tree keeps them, so validation can say
"line 42" instead of making the user search. Keys are recorded as paths into the data:
`("nodes", "train", "clip_eps") -> 42`. Sequence items are recorded by index.

A workflow file may come from anywhere, so reading it is bounded: at most `MAX_FILE_BYTES`,
UTF-8 text only, nesting at most `MAX_DEPTH` deep, at most `MAX_VALUES` values after alias
expansion (an "alias bomb" of a few lines would otherwise expand to billions), no alias that
contains itself, and no key given twice in one mapping (YAML says keys are unique; PyYAML
silently keeps the last). Each is a `WorkflowError` naming the file and line, in well under
a second.
"""

from __future__ import annotations

from typing import Any

import yaml

from areal_graph.graph.problems import Problem, WorkflowError

Path_ = tuple  # a path into the raw mapping, e.g. ("nodes", "train", "clip_eps")

MAX_FILE_BYTES = 1 << 20  # a workflow is a few KiB; this leaves room for big comments
MAX_DEPTH = 64  # mappings/sequences inside each other; workflows use fewer than 6
MAX_VALUES = 100_000  # scalars, mappings and sequences after alias expansion
PLAIN_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")


def decode_text(data: bytes, file: str, what: str = "workflow file", limit: int = MAX_FILE_BYTES) -> str:
    """`data` as UTF-8 text, or a `WorkflowError` saying why it is not a text file we read."""
    if len(data) > limit:
        raise WorkflowError([Problem(file, None, None, None, f"{what} is larger than the limit of {limit:,} bytes")])
    if b"\x00" in data[:8192]:
        raise WorkflowError(
            [Problem(file, None, None, None, f"{what} is binary (it contains NUL bytes), not YAML text")]
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise WorkflowError(
            [
                Problem(
                    file,
                    line,
                    None,
                    None,
                    f"{what} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})",
                )
            ]
        ) from None


class _TooDeep(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


class _BoundedLoader(yaml.SafeLoader):
    """Composes at most `MAX_DEPTH` levels deep: PyYAML's composer recurses once per level,
    so a file of 100k opening brackets would otherwise run into Python's stack limit slowly."""

    depth = 0

    def compose_node(self, parent, index):  # type: ignore[override]
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH + 1:
                raise _TooDeep(self.peek_event().start_mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _compose(text: str, file: str) -> yaml.Node | None:
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_node()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        line = mark.line + 1 if mark else None
        what = getattr(err, "problem", None) or str(err)
        raise WorkflowError([Problem(file, line, None, None, f"YAML syntax error: {what}")]) from None
    except _TooDeep as err:
        raise WorkflowError(
            [Problem(file, err.line, None, None, f"nested more than {MAX_DEPTH} levels deep")]
        ) from None
    finally:
        loader.dispose()


def compose_with_lines(text: str, file: str) -> tuple[Any, dict[Path_, int]]:
    """Parse YAML, returning the plain data and path -> 1-based line of each key."""
    root = _compose(text, file)
    lines: dict[Path_, int] = {}
    problems: list[Problem] = []
    count = 0
    open_nodes: set[int] = set()  # nodes being converted: an alias back to one is a cycle

    def fail(node: yaml.Node, message: str) -> WorkflowError:
        return WorkflowError([Problem(file, node.start_mark.line + 1, None, None, message)])

    def convert(node: yaml.Node, path: Path_) -> Any:
        nonlocal count
        count += 1
        if count > MAX_VALUES:
            raise fail(node, f"more than {MAX_VALUES:,} values after expanding aliases (an alias bomb?)")
        if len(path) > MAX_DEPTH:
            raise fail(node, f"nested more than {MAX_DEPTH} levels deep")
        if id(node) in open_nodes:
            raise fail(node, "an alias refers to a mapping or list that contains it (a recursive alias)")
        if not isinstance(node, yaml.ScalarNode) and node.tag not in PLAIN_TAGS:
            raise fail(node, f"YAML tag {node.tag!r} is not allowed (plain mappings and lists only)")
        if isinstance(node, yaml.MappingNode):
            open_nodes.add(id(node))
            out: dict[Any, Any] = {}
            merged_keys: set[Any] = set()
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`
                    merged = convert(value_node, path)
                    for part in merged if isinstance(merged, list) else [merged]:
                        if isinstance(part, dict):
                            new = {k: v for k, v in part.items() if k not in out}
                            out.update(new)
                            merged_keys.update(new)
                    continue
                key = convert(key_node, path)
                if not isinstance(key, (str, int, float, bool)) and key is not None:
                    raise fail(key_node, f"a mapping key must be a plain value, got a {type(key).__name__}")
                line = key_node.start_mark.line + 1
                if key in out and key not in merged_keys:
                    first = lines.get(path + (key,))
                    problems.append(
                        Problem(
                            file,
                            line,
                            None,
                            None,
                            f"key '{key}' is given twice in one mapping"
                            + (f" (first at line {first})" if first else ""),
                        )
                    )
                merged_keys.discard(key)  # an explicit key overrides a merged one, once
                lines.setdefault(path + (key,), line)
                out[key] = convert(value_node, path + (key,))
            open_nodes.discard(id(node))
            return out
        if isinstance(node, yaml.SequenceNode):
            open_nodes.add(id(node))
            items = []
            for i, item in enumerate(node.value):
                lines[path + (i,)] = item.start_mark.line + 1
                items.append(convert(item, path + (i,)))
            open_nodes.discard(id(node))
            return items
        return _construct_scalar(node, file)

    if root is None:
        return None, lines
    lines[()] = root.start_mark.line + 1
    data = convert(root, ())
    if problems:
        raise WorkflowError(problems)
    return data, lines


def _construct_scalar(node: yaml.Node, file: str) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    except yaml.YAMLError as err:  # e.g. a bad !!binary or an unknown tag
        what = getattr(err, "problem", None) or str(err)
        raise WorkflowError(
            [Problem(file, node.start_mark.line + 1, None, None, f"YAML value error: {what}")]
        ) from None
    finally:
        loader.dispose()
