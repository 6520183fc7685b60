"""The kinds that run a Python function on the packed batch: `advantage` (the built-in
advantage estimators, nodes/advantages.py) and `function` (any `package.module:fn` of one's own)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from areal_graph.api.fields import cfg, import_path_check, non_negative, unit_interval
from areal_graph.graph.kind import CONTROLLER, Call, Hosting, ImportRef, Issue, NodeKind
from areal_graph.graph.kinds.common import HOSTS, reads_missing
from areal_graph.graph.spec import NodeSpec, WorkflowSpec


# ============================================================================ advantage
@dataclass(frozen=True)
class AdvantageParams:
    estimator: Literal["grpo", "rloo", "gae", "reinforce"] = cfg("grpo")
    gamma: float = cfg(1.0, unit_interval, "discount (paper: 1.0)")
    lam: float = cfg(1.0, unit_interval, "GAE lambda (paper: 1.0)")
    kl_coef: float = cfg(0.0, non_negative, "KL penalty against ref_logprobs; 0 disables")
    kl_estimator: Literal["k1", "k2", "k3"] = cfg("k1")
    group_std: bool = cfg(True, None, "GRPO: divide by the group's std")
    baseline: Literal["group", "seat"] = cfg(
        "group",
        None,
        "GRPO/RLOO: baseline each prompt group as a whole, or each seat of it apart (two-player "
        "games: a trajectory's info['seat'], written by TextArenaSelfPlay; role-conditioned "
        "advantages, as in SPIRAL: the seats of a zero-sum game have opposite mean rewards)",
    )
    normalize: bool = cfg(True, None, "global advantage normalisation")


def _advantage_rules(node: NodeSpec, spec: WorkflowSpec) -> list[Issue]:
    p: AdvantageParams = node.params
    need = (
        ["rewards", "loss_mask"]
        + (["values"] if p.estimator == "gae" else [])
        + (["ref_logprobs"] if p.kl_coef > 0 else [])
    )
    why = f"estimator '{p.estimator}'" + (f" with kl_coef {p.kl_coef}" if p.kl_coef > 0 else "")
    issues = reads_missing(node, tuple(need), why)
    if p.baseline == "seat" and p.estimator not in ("grpo", "rloo"):
        issues.append(
            Issue(
                ("baseline",),
                f"baseline 'seat' splits GRPO's and RLOO's group baselines; estimator '{p.estimator}' has none",
            )
        )
    if "advantages" not in node.writes:
        issues.append(Issue(("writes",), "an advantage node must write 'advantages'"))
    return issues


ADVANTAGE = NodeKind(
    name="advantage",
    params=AdvantageParams,
    model="forbidden",
    phase="training",
    doc="advantages (and returns) from rewards [, values, ref_logprobs]; batch-wide normalisation",
    hosting=lambda node, spec: Hosting(CONTROLLER, node.name, f"{HOSTS}.function_host:FunctionHost", role="controller"),
    host_args=lambda node, spec, info: {
        "fn": "areal_graph.nodes.advantages:advantage_node",
        "args": asdict(node.params),
        "node": node.name,
    },
    call=lambda node, spec: Call("run"),
    rules=_advantage_rules,
)


# ============================================================================ function (user code)
@dataclass(frozen=True)
class FunctionParams:
    """A user function on the packed batch: `fn(batch, **args) -> PackedBatch` (hosted by runtime/hosts/function_host.py)."""

    fn: str = field(metadata={"check": import_path_check, "help": "import path 'package.module:function'"})
    args: dict[str, Any] = cfg({}, None, "keyword arguments passed to fn")
    phase: Literal["auto", "generation", "training"] = cfg(
        "auto",
        None,
        "generation: per prompt group, before the sample buffer (may drop groups); training: on the "
        "step's batch; auto: generation when everything it reads exists there",
    )
    host: Literal["controller", "worker"] = cfg(
        "controller", None, "run in the controller, or in the `functions` worker process"
    )


FUNCTION = NodeKind(
    name="function",
    params=FunctionParams,
    model="forbidden",
    phase="auto",
    doc="a user function `package.module:fn` on the packed batch; may write keys and drop whole prompt groups",
    hosting=lambda node, spec: Hosting(
        CONTROLLER if node.params.host == "controller" else "functions",
        node.name,
        f"{HOSTS}.function_host:FunctionHost",
        role="controller" if node.params.host == "controller" else "stateless",
    ),
    host_args=lambda node, spec, info: {
        "fn": node.params.fn,
        "args": dict(node.params.args),
        "node": node.name,
        "writes": list(node.writes),
    },
    call=lambda node, spec: Call("run"),
    imports=lambda node: [
        ImportRef(
            "fn",
            node.params.fn,
            "callable",
            kwargs=node.params.args,
            positional=1,
            supplied=("out_key",) if len(node.writes) == 1 else (),
        )
    ],
    may_drop=True,
)
