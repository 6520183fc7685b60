"""YAML that remembers where each key was written.

`yaml.safe_load` drops positions; composing the node tree keeps them, so validation can say
"line 42" instead of making the user search. Keys are recorded as paths into the data:
`("nodes", "train", "clip_eps") -> 42`. Sequence items are recorded by index.
"""

from __future__ import annotations

from typing import Any

import yaml

from areal_graph.graph.problems import Problem, WorkflowError

Path_ = tuple  # a path into the raw mapping, e.g. ("nodes", "train", "clip_eps")


def compose_with_lines(text: str, file: str) -> tuple[Any, dict[Path_, int]]:
    """Parse YAML, returning the plain data and path -> 1-based line of each key."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        line = mark.line + 1 if mark else None
        what = getattr(err, "problem", None) or str(err)
        raise WorkflowError([Problem(file, line, None, None, f"YAML syntax error: {what}")]) from None
    finally:
        loader.dispose()
    lines: dict[Path_, int] = {}

    def convert(node: yaml.Node, path: Path_) -> Any:
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`
                    merged = convert(value_node, path)
                    for part in merged if isinstance(merged, list) else [merged]:
                        if isinstance(part, dict):
                            out.update({k: v for k, v in part.items() if k not in out})
                    continue
                key = convert(key_node, path)
                lines[path + (key,)] = key_node.start_mark.line + 1
                out[key] = convert(value_node, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            items = []
            for i, item in enumerate(node.value):
                lines[path + (i,)] = item.start_mark.line + 1
                items.append(convert(item, path + (i,)))
            return items
        return _construct_scalar(node)

    if root is None:
        return None, lines
    lines[()] = root.start_mark.line + 1
    return convert(root, ()), lines


def _construct_scalar(node: yaml.Node) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()
