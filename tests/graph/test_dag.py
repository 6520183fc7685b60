"""DAG derivation (against a plain-loop reference) and the execution order."""

from __future__ import annotations

import random

import networkx as nx
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_graph.graph.dag import build_graph, layers, topological_order
from areal_graph.graph.kinds.common import IMPLICIT_ROLLOUT_KEYS
from areal_graph.graph.loader import load_workflow, load_workflow_text
from support.paths import FIXTURES, REPO

WORKFLOWS = sorted((REPO / "workflows").glob("*.yaml"))
MINIMAL = (FIXTURES / "minimal.yaml").read_text()


def reference_edges(raw_nodes: dict) -> dict[tuple[str, str], set[str]]:
    """Edges computed straight from the YAML's reads/writes with plain loops."""
    edges: dict[tuple[str, str], set[str]] = {}
    for reader, body in raw_nodes.items():
        for key in body.get("reads", []):
            for writer, wbody in raw_nodes.items():
                writes = list(wbody.get("writes", []))
                if wbody["kind"] == "rollout":
                    writes += list(IMPLICIT_ROLLOUT_KEYS)
                if key in writes:
                    edges.setdefault((writer, reader), set()).add(key)
    return edges


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_edges_match_reads_and_writes(path):
    spec = load_workflow(path)
    graph = build_graph(spec)
    got = {(u, v): set(d["keys"]) for u, v, d in graph.edges(data=True)}
    assert got == reference_edges(yaml.safe_load(path.read_text())["nodes"])
    assert set(graph.nodes) == set(spec.nodes)
    assert nx.is_directed_acyclic_graph(graph)


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_weight_update_is_a_marker_not_an_edge(path):
    spec = load_workflow(path)
    graph = build_graph(spec)
    policy_trains = [n.name for n in spec.nodes_of_kind("train") if n.params.loss != "value"]
    assert graph.graph["weight_update"] == [(t, "rollout") for t in policy_trains]
    for t in policy_trains:
        assert not graph.has_edge(t, "rollout")


def test_minimal_order_and_layers():
    spec = load_workflow_text(MINIMAL)
    assert topological_order(build_graph(spec)) == ["rollout", "reward", "ref_logp", "prox_logp", "advantage", "train"]
    assert layers(build_graph(spec)) == [["rollout"], ["reward", "ref_logp", "prox_logp"], ["advantage"], ["train"]]


def test_gae_order():
    spec = load_workflow(REPO / "workflows/ppo_gae_critic.yaml")
    order = topological_order(build_graph(spec))
    assert order == ["rollout", "reward", "value", "prox_logp", "advantage", "train_actor", "train_critic"]


def _shuffled_minimal(seed: int) -> str:
    raw = yaml.safe_load(MINIMAL)
    items = list(raw["nodes"].items())
    random.Random(seed).shuffle(items)
    raw["nodes"] = dict(items)
    return yaml.safe_dump(raw, sort_keys=False)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_order_is_topological_and_deterministic(seed):
    """Whatever order nodes are declared in: the same edges, a valid topological order that
    breaks ties by declaration order, and the same answer every time."""
    text = _shuffled_minimal(seed)
    spec = load_workflow_text(text)
    order = topological_order(build_graph(spec))
    assert order == topological_order(build_graph(load_workflow_text(text)))
    position = {n: i for i, n in enumerate(order)}
    graph = build_graph(spec)
    for u, v in graph.edges:
        assert position[u] < position[v]
    # Tie-break: among nodes whose producers are all placed, the earliest declared goes first.
    declared = list(spec.nodes)
    placed: set[str] = set()
    for name in order:
        ready = [n for n in declared if n not in placed and all(p in placed for p in graph.predecessors(n))]
        assert name == ready[0]
        placed.add(name)
    ref = load_workflow_text(MINIMAL)
    assert {(u, v) for u, v in graph.edges} == {(u, v) for u, v in build_graph(ref).edges}
