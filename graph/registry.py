"""Look up a node kind by the name a workflow gives it: a built-in name, or `package.module:NAME`.

The one place kinds are resolved, so `validate` and the runtime agree on what a node is.
"""

from __future__ import annotations

from areal_graph.api.imports import ImportPathError, import_object
from areal_graph.graph.kind import NodeKind
from areal_graph.graph.node_kinds import BUILTIN_KINDS
from areal_graph.graph.problems import suggest


class UnknownKind(ValueError):
    """A `kind:` that is neither built in nor an import path to a `NodeKind`."""


def resolve_kind(name: object) -> NodeKind:
    """The `NodeKind` for `name`; raises UnknownKind with a message a YAML author can act on."""
    if isinstance(name, str) and name in BUILTIN_KINDS:
        return BUILTIN_KINDS[name]
    if not isinstance(name, str) or ":" not in name:
        raise UnknownKind(f"unknown node kind {name!r}{suggest(name, BUILTIN_KINDS)}; known kinds: "
                          f"{', '.join(BUILTIN_KINDS)}, or an import path 'package.module:NAME' of a NodeKind")
    try:
        kind = import_object(name, what="node kind")
    except ImportPathError as err:
        raise UnknownKind(str(err)) from None
    if not isinstance(kind, NodeKind):
        raise UnknownKind(f"node kind {name!r} is a {type(kind).__name__}, not an areal_graph.graph.kind.NodeKind")
    return kind


def kind_of(node: object) -> NodeKind:
    """The kind of a validated `NodeSpec` (its `kind` was resolved once, at load time)."""
    return resolve_kind(getattr(node, "kind"))
