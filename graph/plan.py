"""The execution plan: what the controller runs, in which phase, after what, and where.

Built from a validated spec and the kind registry, and nothing else, so `areal-graph
validate` prints exactly the plan a run executes:

- **phases.** The sample buffer splits the graph. The *generation* side runs once per
  prompt group as soon as its rollout finishes (rollout, rewards, filters that drop groups);
  the *training* side runs once per step on B buffered trajectories (log-probs, values,
  advantages, train). A kind fixes its phase; a function node's is chosen per node (`auto`:
  generation when everything it reads exists there). Reading a key that only the training
  side writes from the generation side cannot work and is a validation error (`phase_issues`).
- **deps.** A node runs when the nodes it reads from (in its phase) are done; nodes that do
  not depend on each other run concurrently.
- **fusion.** A node whose output another node computes anyway (the proximal log-probs of a
  one-update step come from the training forward) is skipped; `fused` records it.
- **hosting.** Each node's process and hosted object, from its kind's entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import networkx as nx

from areal_graph.graph.dag import depth_layers, graph_from_nodes, key_producers, topological_order
from areal_graph.graph.kind import CONTROLLER, Hosting, Issue, NodeKind, Phase
from areal_graph.graph.kinds.common import actor_model
from areal_graph.graph.kinds.registry import kind_of
from areal_graph.graph.spec import NodeSpec, WorkflowSpec


@dataclass(frozen=True)
class ExecutionPlan:
    spec: WorkflowSpec
    source: str  # the rollout node
    phase: Mapping[str, Phase]
    generation: tuple[str, ...]  # after the source, per prompt group; topological order
    training: tuple[str, ...]  # per step; topological order
    deps: Mapping[str, tuple[str, ...]]  # in-phase nodes each node waits for
    fused: Mapping[str, str]  # skipped node -> the node that computes its output
    hosting: Mapping[str, Hosting]
    actor: str  # the model whose weights the inference servers serve
    eval_nodes: tuple[str, ...]  # generation-side nodes an evaluation runs (scorers and what they read)

    def kind(self, node: str) -> NodeKind:
        return kind_of(self.spec.nodes[node])

    def node(self, name: str) -> NodeSpec:
        return self.spec.nodes[name]

    def reads(self, name: str) -> tuple[str, ...]:
        """What `name` is given: its declared reads, less the keys it computes itself (fusion)."""
        own = {k for skipped, by in self.fused.items() if by == name for k in self.spec.nodes[skipped].writes}
        return tuple(k for k in self.spec.nodes[name].reads if k not in own)

    def processes(self) -> dict[str, str]:
        """Worker processes to start -> their role (the controller runs its nodes itself)."""
        return {h.process: h.role for n, h in self.hosting.items() if h.process != CONTROLLER and n not in self.fused}

    def ranks(self, process: str) -> int:
        """Data-parallel processes behind `process` (1, or a model's `dp_size`: `process` is rank 0)."""
        return max((h.ranks for h in self.hosting.values() if h.process == process), default=1)

    def nodes_on(self, process: str) -> list[str]:
        return sorted(n for n, h in self.hosting.items() if h.process == process)

    def scorers(self) -> list[str]:
        return [n for n in self.eval_nodes if self.kind(n).scores]

    def describe(self) -> list[str]:
        """The plan in a few lines for people (validate prints them; the run logs them)."""
        lines = [
            f"generation side, per prompt group (before the sample buffer): {self.source} -> "
            + _layers_text(self.generation, self.deps),
            "training side, per step of B trajectories: " + _layers_text(self.training, self.deps),
        ]
        for skipped, by in self.fused.items():
            lines.append(
                f"fused: '{skipped}' is not run; '{by}' takes its output from the training forward "
                f"(one optimizer update per step: the same weights, an exact result)"
            )
        procs: dict[str, list[str]] = {}
        for name, h in self.hosting.items():
            if name not in self.fused:
                procs.setdefault(h.process, []).append(name)
        lines.append(
            "processes: "
            + "; ".join(
                f"{p} [{', '.join(ns)}]"
                + (" (one call at a time)" if any(self.hosting[n].exclusive for n in ns) else "")
                + _ranks_text(p, self.ranks(p))
                for p, ns in sorted(procs.items())
            )
        )
        return lines


def _ranks_text(process: str, ranks: int) -> str:
    if ranks == 1:
        return ""
    others = f"{process}.rank1" if ranks == 2 else f"{process}.rank1 .. {process}.rank{ranks - 1}"
    return f" on {ranks} data-parallel ranks (rank 0 serves the calls and relays them to {others})"


def _layers_text(order: tuple[str, ...], deps: Mapping[str, tuple[str, ...]]) -> str:
    layers = depth_layers(order, deps.__getitem__)
    return " -> ".join(" || ".join(layer) if len(layer) > 1 else layer[0] for layer in layers) or "(nothing)"


def assign_phases(spec: WorkflowSpec) -> tuple[dict[str, Phase], list[tuple[str, Issue]]]:
    """Each node's phase, and (node, issue) for every generation-side read of a training-side key."""
    nodes = spec.nodes
    graph = graph_from_nodes(nodes)
    producers = key_producers(nodes)
    phase: dict[str, Phase] = {}
    issues: list[tuple[str, Issue]] = []
    for name in topological_order(graph):
        node = nodes[name]
        kind = kind_of(node)
        wanted = kind.phase if kind.phase != "auto" else getattr(node.params, "phase", "auto")
        from_training = [
            (i, k, producers[k][0])
            for i, k in enumerate(node.reads)
            if len(producers.get(k, [])) == 1 and phase.get(producers[k][0]) == "training"
        ]
        if wanted == "auto":
            wanted = "training" if from_training else "generation"
        phase[name] = cast(Phase, wanted)  # kinds and the `phase` parameter allow these two only
        if wanted == "generation":
            for i, key, writer in from_training:
                hint = " or set `phase: training` on it" if kind.phase == "auto" else ""
                issues.append(
                    (
                        name,
                        Issue(
                            ("reads", i),
                            (
                                f"reads '{key}', which node '{writer}' writes on the training side (after the sample buffer); "
                                f"'{name}' runs on the generation side, once per prompt group before the buffer, where "
                                f"'{key}' does not exist yet: read a key written before the buffer{hint}"
                            ),
                        ),
                    )
                )
    return phase, issues


def build_plan(spec: WorkflowSpec) -> ExecutionPlan:
    """The plan of a validated spec (validation guarantees one source, one actor, no cycles)."""
    nodes = spec.nodes
    graph = graph_from_nodes(nodes)
    phase, _ = assign_phases(spec)
    source = next(n for n in nodes if kind_of(nodes[n]).source)
    fused: dict[str, str] = {}
    for name, node in nodes.items():
        absorbed = kind_of(node).fuses(node, spec)
        if absorbed is not None:
            fused[absorbed] = name
    order = topological_order(graph)

    def in_phase_deps(name: str) -> tuple[str, ...]:
        out: list[str] = []
        for pred in graph.predecessors(name):
            if pred == source or phase[pred] != phase[name]:
                continue
            # a skipped node's own inputs stand in for it
            out.extend(in_phase_deps(pred) if pred in fused else [pred])
        return tuple(sorted(set(out), key=order.index))

    live = [n for n in order if n != source and n not in fused]
    deps = {n: in_phase_deps(n) for n in live}
    generation = tuple(n for n in live if phase[n] == "generation")
    scorers = [n for n in generation if kind_of(nodes[n]).scores]
    needed = set(scorers) | {a for s in scorers for a in nx.ancestors(graph, s)}
    return ExecutionPlan(
        spec=spec,
        source=source,
        phase=phase,
        generation=generation,
        training=tuple(n for n in live if phase[n] == "training"),
        deps=deps,
        fused=fused,
        hosting={n: kind_of(node).hosting(node, spec) for n, node in nodes.items()},
        actor=str(actor_model(spec)),
        eval_nodes=tuple(n for n in generation if n in needed),
    )
