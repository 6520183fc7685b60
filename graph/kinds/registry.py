"""Look up a node kind by the name a workflow gives it: a built-in name, or `package.module:NAME`.

The one place kinds are resolved, so `validate` and the runtime agree on what a node is.
`BUILTIN_KINDS` is filled by `graph/kinds/__init__.py` from the family modules, as the
package's first act: Python runs a package's `__init__` before any of its modules can be
used, so the table is complete wherever it is read, and the family modules can ask for the
kind of any node (`kind_of`, `model_role`) without importing each other or the package.
"""

from __future__ import annotations

from typing import Any, Literal

from areal_graph.api.imports import ImportPathError, import_object
from areal_graph.graph.kind import NodeKind
from areal_graph.graph.problems import suggest
from areal_graph.graph.spec import WorkflowSpec

BUILTIN_KINDS: dict[str, NodeKind] = {}  # name -> entry, in the order `graph/kinds/__init__.py` lists them


class UnknownKind(ValueError):
    """A `kind:` that is neither built in nor an import path to a `NodeKind`."""


def resolve_kind(name: object) -> NodeKind:
    """The `NodeKind` for `name`; raises UnknownKind with a message a YAML author can act on."""
    if isinstance(name, str) and name in BUILTIN_KINDS:
        return BUILTIN_KINDS[name]
    if not isinstance(name, str) or ":" not in name:
        raise UnknownKind(
            f"unknown node kind {name!r}{suggest(name, BUILTIN_KINDS)}; known kinds: "
            f"{', '.join(BUILTIN_KINDS)}, or an import path 'package.module:NAME' of a NodeKind"
        )
    try:
        kind = import_object(name, what="node kind")
    except ImportPathError as err:
        raise UnknownKind(str(err)) from None
    if not isinstance(kind, NodeKind):
        raise UnknownKind(f"node kind {name!r} is a {type(kind).__name__}, not an areal_graph.graph.kind.NodeKind")
    return kind


def kind_of(node: Any) -> NodeKind:
    """The kind of a validated `NodeSpec` (its `kind` was resolved once, at load time)."""
    return resolve_kind(node.kind)


def model_role(spec: WorkflowSpec, model: str) -> Literal["policy", "critic"]:
    """A model is a critic when a node uses it as one (a value node, the value loss)."""
    roles = {kind_of(n).model_role(n) for n in spec.nodes.values() if n.model == model}
    return "critic" if "critic" in roles else "policy"
