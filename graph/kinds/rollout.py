"""The rollout kind: the source of the graph, generating a group of trajectories per prompt."""

from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass, field
from typing import Any

from areal_graph.api.fields import cfg, import_path_check, positive
from areal_graph.api.imports import ImportPathError, import_object
from areal_graph.api.sampling import SamplingParams
from areal_graph.graph.kind import Call, Hosting, ImportRef, Issue, NodeKind, RunInfo
from areal_graph.graph.kinds.common import (
    HOSTS,
    ROLLOUT_WRITES,
    SERVED_MODEL,
    actor_model,
    adapter_sync,
    served_model_refs,
)
from areal_graph.graph.problems import suggest
from areal_graph.graph.spec import NodeSpec, WorkflowSpec

SERVED_MODELS_ARG = "served_models"  # the rollout class's constructor argument: {model name: its ServerPool}


@dataclass(frozen=True)
class RolloutParams:
    """The rollout node: a rollout class generating `group_size` answers per prompt."""

    rollout_class: str = cfg(
        "areal_graph.workflows.rollout.single_turn_math:SingleTurnMath",
        import_path_check,
        "the Rollout subclass that turns one prompt into a group of trajectories",
    )
    rollout_args: dict[str, Any] = cfg(
        {},
        None,
        "keyword arguments for the rollout class; a value `model:NAME` names a lagged model "
        "(models.NAME.lagged), whose servers the class receives as served_models[NAME]",
    )
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
        "served_urls": {name: list(urls) for name, urls in info.served_urls.items()},
        "backend": spec.inference.backend,
        "rollout_class": p.rollout_class,
        "rollout_args": dict(p.rollout_args),
        "group_size": p.group_size,
        "sampling": asdict(p.sampling),
        "tokenizer_path": info.model_paths[actor_model(spec) or ""],
        "lora_adapters": adapter_sync(spec),
    }


def _served_model_rules(node: NodeSpec, spec: WorkflowSpec) -> list[Issue]:
    """Each `model:NAME` rollout argument names a lagged model (one with servers of its own), and
    the rollout class takes `served_models` to receive them."""
    out = []
    models, actor = list(spec.models), actor_model(spec)
    refs = served_model_refs(node.params.rollout_args)
    for arg, name in refs.items():
        where = ("rollout_args", arg)
        if not name:
            out.append(Issue(where, f"'{SERVED_MODEL}' names no model; models: {', '.join(models)}"))
        elif name not in spec.models:
            out.append(Issue(where, f"unknown model '{name}'{suggest(name, models)}; models: {', '.join(models)}"))
        elif name == actor:
            out.append(
                Issue(
                    where,
                    f"model '{name}' is the policy itself, whose servers the rollout already plays on: use {arg}: self",
                )
            )
        elif spec.models[name].lagged is None:
            out.append(
                Issue(
                    where,
                    f"model '{name}' is not served: give it `lagged: {{refresh_every: N}}` "
                    f"(models.{name}.lagged) to serve it as a lagged copy of the policy",
                )
            )
    if refs and not _takes_served_models(node.params.rollout_class):
        out.append(
            Issue(
                ("rollout_class",),
                f"{node.params.rollout_class} takes no `{SERVED_MODELS_ARG}` argument, so it cannot play "
                f"the model{'s' if len(refs) > 1 else ''} that rollout_args name ({', '.join(refs)})",
            )
        )
    return out


def _takes_served_models(path: str) -> bool:
    """Whether the class's constructor takes `served_models` (True when it cannot be imported:
    that is reported where the import is checked)."""
    try:
        cls = import_object(path, what="rollout_class")
        return SERVED_MODELS_ARG in inspect.signature(cls).parameters
    except (ImportPathError, TypeError, ValueError):
        return True


def _backend_rules(node: NodeSpec, spec: WorkflowSpec) -> list[Issue]:
    """The rollout class's own check of its arguments against the workflow's inference backend
    (nothing when it cannot be imported: that is reported where the import is checked)."""
    try:
        cls = import_object(node.params.rollout_class, what="rollout_class")
    except ImportPathError:
        return []
    check = getattr(cls, "check_backend", None)  # None: not a Rollout, reported where the import is checked
    problem = check(dict(node.params.rollout_args), spec.inference.backend) if check else None
    return [Issue(("rollout_args",), problem)] if problem else []


def _rollout_rules(node: NodeSpec, spec: WorkflowSpec) -> list[Issue]:
    out = _served_model_rules(node, spec) + _backend_rules(node, spec)
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
    rules=_rollout_rules,
    imports=lambda node: [
        ImportRef(
            "rollout_class",
            node.params.rollout_class,
            "rollout_class",
            kwargs=node.params.rollout_args,
            supplied=("tokenizer_path", SERVED_MODELS_ARG),
        )
    ],
    default_writes=ROLLOUT_WRITES,
)
