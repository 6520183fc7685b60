"""What the kinds of every family share: key names, rule helpers and the spec queries about the
trained policy (which model is the actor, whether it syncs as a LoRA adapter)."""

from __future__ import annotations

from areal_graph.api.rollout import SERVED_MODEL
from areal_graph.graph.kind import Issue
from areal_graph.graph.kinds.losses import POLICY_LOSSES, TrainParams
from areal_graph.graph.spec import NodeSpec, WorkflowSpec

# Keys the rollout writes and must declare in `writes` (filled in when `writes` is omitted).
ROLLOUT_WRITES: tuple[str, ...] = ("input_ids", "loss_mask", "behav_logprobs", "versions")
# Keys every rollout provides implicitly (per-sequence ids; meta `answer` and `info`, the
# Trajectory.info as JSON, for rewards): nodes may read them without any node declaring them,
# and every node receives them.
IMPLICIT_ROLLOUT_KEYS: tuple[str, ...] = ("group_id", "sample_id", "answer", "info")

HOSTS = "areal_graph.runtime.hosts"


def trains_policy(node: NodeSpec) -> bool:
    """A train node with a policy loss: its model is the actor, whose new weights go to the
    inference servers after every step (the one place that decides it)."""
    return isinstance(node.params, TrainParams) and node.params.loss in POLICY_LOSSES


def actor_model(spec: WorkflowSpec) -> str | None:
    """The model trained with a policy loss: the one the inference servers serve."""
    return next((node.model for node in spec.nodes.values() if trains_policy(node)), None)


def adapter_sync(spec: WorkflowSpec) -> bool:
    """The policy syncs as a LoRA adapter (the client names it where the backend serves adapters)."""
    actor = spec.models.get(actor_model(spec) or "")
    return actor is not None and actor.lora is not None and actor.lora.sync == "adapter"


def lagged_models(spec: WorkflowSpec) -> list[str]:
    """The models served as lagged copies of the actor (`models.<name>.lagged`), in file order:
    each has inference servers of its own that the rollout reaches as `served_models[name]`."""
    return [name for name, model in spec.models.items() if model.lagged is not None]


def served_model_refs(rollout_args: dict) -> dict[str, str]:
    """The top-level rollout arguments that name a served model: argument -> model name
    (`opponent: model:opponent` -> {"opponent": "opponent"})."""
    return {
        str(key): value[len(SERVED_MODEL) :]
        for key, value in rollout_args.items()
        if isinstance(value, str) and value.startswith(SERVED_MODEL)
    }


def reads_missing(node: NodeSpec, need: tuple[str, ...], why: str) -> list[Issue]:
    missing = [k for k in need if k not in node.reads]
    return [Issue(("reads",), f"{why} must read {', '.join(missing)}")] if missing else []


def writes_exactly_one(node: NodeSpec, what: str) -> list[Issue]:
    if len(node.writes) != 1:
        return [Issue(("writes",), f"a {what} node writes exactly one key, got {list(node.writes)}")]
    return []
