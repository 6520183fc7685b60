"""Where each node of a workflow runs.

The local placement is simple and fixed: one worker process per model (it hosts that model's
logprob, value and train nodes, so the proximal log-probs are computed by the very weights
the train node is about to update), one rollout worker, one reward worker, and the cheap
advantage math in the controller itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from areal_graph.graph.spec import WorkflowSpec

CONTROLLER = "controller"


@dataclass
class Placement:
    node_worker: dict[str, str]
    node_impl: dict[str, str]  # name of the hosted object that runs the node (a model's nodes share one)
    worker_models: dict[str, str] = field(default_factory=dict)  # model worker -> model name
    actor_model: str = "actor"
    # models read by a value node or trained with the value loss: loaded with a value head
    critics: set[str] = field(default_factory=set)

    def worker_of(self, node: str) -> str:
        return self.node_worker[node]

    def impl_of(self, node: str) -> str:
        return self.node_impl[node]

    def nodes_on(self, worker: str) -> list[str]:
        return sorted(n for n, w in self.node_worker.items() if w == worker)

    @property
    def workers(self) -> list[str]:
        """Worker processes to start (the controller runs in-process nodes itself)."""
        return sorted({w for w in self.node_worker.values() if w != CONTROLLER})


def model_worker(model: str) -> str:
    return f"model-{model}"


def plan_placement(spec: WorkflowSpec) -> Placement:
    node_worker: dict[str, str] = {}
    node_impl: dict[str, str] = {}
    worker_models: dict[str, str] = {}
    actor = None
    critics: set[str] = set()
    for node in spec.nodes.values():
        node_impl[node.name] = node.name
        if node.kind == "rollout":
            node_worker[node.name] = "rollout"
        elif node.kind == "reward":
            node_worker[node.name] = "reward"
        elif node.kind in ("logprob", "value", "train"):
            worker = model_worker(node.model)
            node_worker[node.name] = worker
            worker_models[worker] = node.model
            node_impl[node.name] = node.model
            if node.kind == "value" or (node.kind == "train" and node.params.loss == "value"):
                critics.add(node.model)
            elif node.kind == "train":
                actor = node.model
        else:
            node_worker[node.name] = CONTROLLER
    if actor is None:
        raise ValueError("workflow has no policy train node: nothing would update the rollout weights")
    return Placement(node_worker, node_impl, worker_models, actor, critics)
