"""The package layout stays a layered graph: no package imports one that imports it back.

Reads every module's imports (statically, with ast) and folds them to the top-level
packages of areal_graph (api, data, graph, nodes, engines, runtime, ...).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["api", "cli", "data", "engines", "graph", "modelkit", "nodes", "protos", "runtime", "tools", "workflows"]


def package_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(PACKAGES)
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else (
                    [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                for name in names:
                    parts = name.split(".")
                    if parts[0] == "areal_graph" and len(parts) > 1 and parts[1] in PACKAGES and parts[1] != pkg:
                        graph.add_edge(pkg, parts[1], file=str(path.relative_to(ROOT)))
    return graph


def test_no_import_cycles_between_packages():
    graph = package_graph()
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, [[(u, graph.edges[u, v]["file"]) for u, v in zip(c, c[1:] + c[:1])] for c in cycles]


def test_the_layers_point_the_right_way():
    graph = package_graph()
    assert not graph.has_edge("graph", "runtime") and not graph.has_edge("graph", "engines")
    assert not graph.has_edge("nodes", "runtime") and not graph.has_edge("engines", "runtime")
    assert not graph.has_edge("engines", "graph") and not any(graph.has_edge("api", p) for p in PACKAGES)
    # graph/ and api/ import no torch and no grpc (validate runs without them)
    for pkg in ("graph", "api"):
        for path in (ROOT / pkg).rglob("*.py"):
            text = path.read_text()
            assert "import torch" not in text and "import grpc" not in text, path
