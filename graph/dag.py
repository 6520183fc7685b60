"""The dataflow graph derived from what nodes read and write.

Edges run from the node that writes a key to every node that reads it, labelled with the
keys. The train -> rollout weight update is *not* an edge: it would make every workflow
cyclic. It is kept as the graph attribute `weight_update` (a list of (train, rollout) pairs)
for renderers and the controller.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import networkx as nx

from areal_graph.graph.kinds.common import IMPLICIT_ROLLOUT_KEYS, trains_policy
from areal_graph.graph.kinds.registry import kind_of
from areal_graph.graph.spec import NodeSpec, WorkflowSpec


def key_producers(nodes: Mapping[str, NodeSpec]) -> dict[str, list[str]]:
    """key -> names of the nodes that write it (the rollout also provides the implicit keys)."""
    producers: dict[str, list[str]] = {}
    for node in nodes.values():
        keys: Iterable[str] = node.writes
        if kind_of(node).source:
            keys = tuple(node.writes) + tuple(k for k in IMPLICIT_ROLLOUT_KEYS if k not in node.writes)
        for key in keys:
            producers.setdefault(key, []).append(node.name)
    return producers


def graph_from_nodes(nodes: Mapping[str, NodeSpec]) -> nx.DiGraph:
    """Build the DAG from node specs alone (the loader uses this before a WorkflowSpec exists).

    Keys with no producer (or several) are skipped here; validation reports them.
    """
    graph = nx.DiGraph()
    for index, node in enumerate(nodes.values()):
        graph.add_node(node.name, kind=node.kind, model=node.model, index=index)
    producers = key_producers(nodes)
    for node in nodes.values():
        for key in node.reads:
            writers = producers.get(key, [])
            if len(writers) != 1 or writers[0] == node.name:
                continue
            src = writers[0]
            if graph.has_edge(src, node.name):
                graph.edges[src, node.name]["keys"].append(key)
            else:
                graph.add_edge(src, node.name, keys=[key])
    sources = [n.name for n in nodes.values() if kind_of(n).source]
    policy = [n for n in nodes.values() if trains_policy(n)]
    graph.graph["weight_update"] = [(n.name, r) for n in policy if n.model == policy[0].model for r in sources]
    return graph


def build_graph(spec: WorkflowSpec) -> nx.DiGraph:
    """The workflow's DAG: nodes carry `kind`, `model`; edges carry `keys` (list of str)."""
    graph = graph_from_nodes(spec.nodes)
    graph.graph["name"] = spec.name
    return graph


def topological_order(graph: nx.DiGraph) -> list[str]:
    """Deterministic topological order of a graph from `graph_from_nodes`: ties are broken by
    declaration order in the YAML, so the order reads like the file."""
    return list(nx.lexicographical_topological_sort(graph, key=lambda n: graph.nodes[n]["index"]))


def depth_layers(order: Iterable[str], preds: Callable[[str], Iterable[str]]) -> list[list[str]]:
    """Longest-path layering of nodes given in topological `order`: a node sits one layer
    below its deepest predecessor (`preds(name)`, all of them earlier in `order`)."""
    order = list(order)
    depth: dict[str, int] = {}
    for name in order:
        depth[name] = 1 + max((depth[p] for p in preds(name)), default=-1)
    out: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for name in order:
        out[depth[name]].append(name)
    return out


def layers(graph: nx.DiGraph) -> list[list[str]]:
    """The workflow's nodes in layers, for drawing: a node one layer below its deepest producer."""
    return depth_layers(topological_order(graph), graph.predecessors)
