"""The kinds that run on a model's `ModelHost`: `logprob` (reference or proximal log-probs),
`value` (a critic's values) and `train` (one optimiser step with a loss of LOSSES,
graph/kinds/losses.py). All nodes of one model share one host object, so the proximal
log-probs come from exactly the weights about to be trained."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from areal_graph.api.corrections import REJECTING, CorrectionError, ISCorrection
from areal_graph.graph.kind import Call, Hosting, Issue, NodeKind, RunInfo
from areal_graph.graph.kinds.common import HOSTS, reads_missing, writes_exactly_one
from areal_graph.graph.kinds.losses import LOSSES, TrainParams
from areal_graph.graph.kinds.registry import model_role
from areal_graph.graph.kinds.rollout import rollout_temperature
from areal_graph.graph.spec import NodeSpec, WorkflowSpec


@dataclass(frozen=True)
class LogprobParams:
    """Forward pass of `model` writing per-token log-probs (ref or proximal policy)."""


@dataclass(frozen=True)
class ValueParams:
    """Critic forward pass of `model` writing per-token values."""


def _model_hosting(node: NodeSpec, spec: WorkflowSpec) -> Hosting:
    """All nodes of one model share one `ModelHost` in the process `model-<name>`; with
    `dp_size` > 1 that process is rank 0 and relays every call to the other ranks."""
    model = spec.models.get(str(node.model))
    ranks = model.dp_size if model is not None else 1
    impl = f"{HOSTS}.dp_model_host:DataParallelModelHost" if ranks > 1 else f"{HOSTS}.model_host:ModelHost"
    return Hosting(f"model-{node.model}", str(node.model), impl, exclusive=True, role="model", ranks=ranks)


def _model_host_args(node: NodeSpec, spec: WorkflowSpec, info: RunInfo) -> dict[str, Any]:
    model = spec.models[str(node.model)]
    return {
        "model_path": info.model_paths[model.name],
        "optim": asdict(model.train) if model.train else None,
        "total_steps": spec.runtime.steps,
        "seed": spec.runtime.seed,
        "threads": info.train_threads,
        "role": model_role(spec, model.name),
        "device": model.device,
        **({"lora": asdict(model.lora)} if model.lora is not None else {}),
        # only when not the defaults, so that the host args of existing workflows stay as they were
        **({"backend": model.backend} if model.backend != "torch" else {}),
        **({"precision": model.precision} if model.precision != "fp32" else {}),
    }


def _mb_args(spec: WorkflowSpec) -> dict[str, Any]:
    return {"max_tokens_per_mb": spec.runtime.max_tokens_per_microbatch}


LOGPROB = NodeKind(
    name="logprob",
    params=LogprobParams,
    model="required",
    phase="training",
    doc="per-token log-probs of `model` (reference or proximal policy)",
    hosting=_model_hosting,
    host_args=_model_host_args,
    call=lambda node, spec: Call(
        "logprob", {"out_key": node.writes[0], "temperature": rollout_temperature(spec), **_mb_args(spec)}
    ),
    rules=lambda node, spec: (
        writes_exactly_one(node, "logprob") + reads_missing(node, ("input_ids",), "a logprob node")
    ),
    model_role=lambda node: "policy",
)

VALUE = NodeKind(
    name="value",
    params=ValueParams,
    model="required",
    phase="training",
    doc="per-token values of a critic `model`",
    hosting=_model_hosting,
    host_args=_model_host_args,
    call=lambda node, spec: Call("values", {"out_key": node.writes[0], **_mb_args(spec)}),
    rules=lambda node, spec: writes_exactly_one(node, "value") + reads_missing(node, ("input_ids",), "a value node"),
    model_role=lambda node: "critic",
)


def fused_prox_node(node: NodeSpec, spec: WorkflowSpec) -> str | None:
    """The logprob node whose proximal log-probs this train node's own forward gives exactly.

    With one optimizer update per step (ppo_epochs = ppo_minibatches = 1) the weights the
    training forward runs with ARE the proximal policy, so a separate forward pass would
    recompute the same numbers. Fused only when nothing else reads that key (an advantage
    node with a KL term reads it before training), no rejecting correction needs pi_prox
    before the step (nodes/off_policy.py) and `runtime.fuse_prox_logprob` is on.
    """
    p = node.params
    if not (
        spec.runtime.fuse_prox_logprob
        and isinstance(p, TrainParams)
        and LOSSES[p.loss].prox
        and p.ppo_epochs == 1
        and p.ppo_minibatches == 1
        and p.is_correction not in REJECTING
    ):
        return None
    writers = [n for n in spec.nodes.values() if "prox_logprobs" in n.writes]
    if len(writers) != 1 or not isinstance(writers[0].params, LogprobParams) or writers[0].model != node.model:
        return None
    readers = [n.name for n in spec.nodes.values() if "prox_logprobs" in n.reads]
    return writers[0].name if readers == [node.name] else None


def _correction_rules(p: TrainParams) -> list[Issue]:
    """Off-policy corrections and loss options only where the loss has what they act on."""
    issues = []
    try:
        ISCorrection.resolve(p.is_correction, p.is_low, p.is_high)
    except CorrectionError as e:
        issues.append(Issue((e.field,), e.message))
    loss = LOSSES[p.loss]
    if p.is_correction != "none" and not loss.prox:
        why = (
            (
                "centres its trust region on pi_behav and has no separate behaviour weight to correct: use "
                "decoupled_ppo (at max_staleness 0 it is plain PPO/GRPO with the trainer's pi_old, whose "
                "weight pi_old/pi_behav is the engine-vs-trainer mismatch)"
            )
            if loss.role == "policy"
            else "is the critic's"
        )
        issues.append(Issue(("is_correction",), f"loss '{p.loss}' {why}"))
    if p.dual_clip is not None and not loss.dual_clip:
        takes = " and ".join(n for n, other in LOSSES.items() if other.dual_clip)
        issues.append(Issue(("dual_clip",), f"is not built for loss '{p.loss}' ({takes} only; {loss.doc})"))
    return issues


def _train_rules(node: NodeSpec, spec: WorkflowSpec) -> list[Issue]:
    p: TrainParams = node.params
    missing = [k for k in LOSSES[p.loss].reads if k not in node.reads]
    issues = []
    if missing:
        what = "a train node with a policy loss needs advantages: " if "advantages" in missing else ""
        issues.append(Issue(("reads",), f"{what}loss '{p.loss}' must read {', '.join(missing)}"))
    if node.writes:
        issues.append(Issue(("writes",), "a train node writes no keys (it updates weights)"))
    model = spec.models.get(str(node.model))
    if model is not None and model.train is None:
        issues.append(
            Issue(("model",), f"model '{node.model}' has no 'train' section (optimiser), so it cannot be trained")
        )
    issues += _correction_rules(p)
    if p.ppo_minibatches > spec.runtime.batch_size:
        issues.append(
            Issue(
                ("ppo_minibatches",),
                f"must be at most runtime.batch_size ({spec.runtime.batch_size}) "
                f"so that every PPO minibatch holds a trajectory, got {p.ppo_minibatches}",
            )
        )
    return issues


TRAIN = NodeKind(
    name="train",
    params=TrainParams,
    model="required",
    phase="training",
    doc="one optimiser step of `model` on the batch (new weights go to the inference servers)",
    hosting=_model_hosting,
    host_args=_model_host_args,
    call=lambda node, spec: Call(
        "train",
        {
            "params": asdict(node.params),
            "temperature": rollout_temperature(spec),
            "fused_prox": fused_prox_node(node, spec) is not None,
            **_mb_args(spec),
        },
    ),
    rules=_train_rules,
    trains=True,
    fuses=fused_prox_node,
    optional_reads=("versions",),
    versioned_call=True,
    model_role=lambda node: LOSSES[node.params.loss].role,
)
