"""The rollout kind: the source of the graph, generating a group of trajectories per prompt."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from areal_graph.api.fields import cfg, import_path_check, positive
from areal_graph.api.sampling import SamplingParams
from areal_graph.graph.kind import Call, Hosting, ImportRef, Issue, NodeKind, RunInfo
from areal_graph.graph.kinds.common import HOSTS, ROLLOUT_WRITES, actor_model, adapter_sync
from areal_graph.graph.spec import NodeSpec, WorkflowSpec


@dataclass(frozen=True)
class RolloutParams:
    """The rollout node: a rollout class generating `group_size` answers per prompt."""

    rollout_class: str = cfg(
        "areal_graph.workflows.rollout.single_turn_math:SingleTurnMath",
        import_path_check,
        "the Rollout subclass that turns one prompt into a group of trajectories",
    )
    rollout_args: dict[str, Any] = cfg({}, None, "keyword arguments for the rollout class")
    group_size: int = cfg(8, positive, "answers per prompt (G); GRPO/RLOO normalise within a group")
    sampling: SamplingParams = field(default_factory=SamplingParams, metadata={"check": None, "help": ""})


def rollout_temperature(spec: WorkflowSpec) -> float:
    """Log-probs everywhere are of the temperature-scaled sampling distribution (what engines report)."""
    for node in spec.nodes.values():
        if isinstance(node.params, RolloutParams):
            return node.params.sampling.temperature or 1.0
    return 1.0


def rollout_args(node: NodeSpec, spec: WorkflowSpec, info: RunInfo) -> dict[str, Any]:
    p: RolloutParams = node.params
    return {
        "server_urls": list(info.server_urls),
        "backend": spec.inference.backend,
        "rollout_class": p.rollout_class,
        "rollout_args": dict(p.rollout_args),
        "group_size": p.group_size,
        "sampling": asdict(p.sampling),
        "tokenizer_path": info.model_paths[actor_model(spec) or ""],
        "lora_adapters": adapter_sync(spec),
    }


def _rollout_rules(node: NodeSpec) -> list[Issue]:
    out = []
    if node.reads:
        out.append(Issue(("reads",), "a rollout node reads prompts from `data`, not keys; remove 'reads'"))
    for name in ("json_schema", "grammar"):
        if getattr(node.params.sampling, name) is not None:
            out.append(
                Issue(
                    ("sampling", name),
                    "constrained decoding is for served requests (response_format, "
                    "forced tool calls): a rollout's tokens must be drawn from the policy itself to be "
                    "trained, so a workflow cannot constrain them",
                )
            )
    return out


ROLLOUT = NodeKind(
    name="rollout",
    params=RolloutParams,
    model="optional",
    phase="generation",
    source=True,
    doc="generates a group of trajectories per prompt on the inference servers",
    hosting=lambda node, spec: Hosting("rollout", node.name, f"{HOSTS}.rollout_host:RolloutHost", role="rollout"),
    host_args=rollout_args,
    call=lambda node, spec: Call("run"),
    rules=lambda node, spec: _rollout_rules(node),
    imports=lambda node: [
        ImportRef(
            "rollout_class",
            node.params.rollout_class,
            "rollout_class",
            kwargs=node.params.rollout_args,
            supplied=("tokenizer_path",),
        )
    ],
    default_writes=ROLLOUT_WRITES,
)
