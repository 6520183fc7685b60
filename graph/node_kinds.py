"""The built-in node kinds: each one's parameter dataclass and its `NodeKind` entry, side by side.

Field names, types and defaults live only here; the loader reads them (via
`dataclasses.fields` and type hints) to validate YAML, so adding a field here is all it takes
to make it configurable. Range rules travel in each field's metadata (`check`), so the rule
sits next to the default it constrains. Defaults follow the AReaL paper where it gives one.

Each entry (see `graph/kind.py`) says where the kind's nodes run, what object serves them,
how they are called, which side of the sample buffer they sit on and what the graph must
satisfy for them. Adding a built-in kind means adding a section here (and, if no existing
host fits, the host class it names). A kind of one's own needs no change here at all: any
module-level `NodeKind`, named in YAML as `kind: package.module:NAME`.

This module must stay free of torch and gRPC: the CLI validates workflows without them.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Optional

from areal_graph.api.fields import (
    cfg,
    dual_clip_check,
    greater_than_one,
    import_path_check,
    non_negative,
    positive,
    unit_interval,
)
from areal_graph.api.corrections import REJECTING, CorrectionError, ISCorrection
from areal_graph.api.judge import DEFAULT_TEMPLATE as DEFAULT_JUDGE_TEMPLATE
from areal_graph.api.judge import pattern_problem as judge_pattern_problem
from areal_graph.api.judge import template_problem as judge_template_problem
from areal_graph.api.reward_fns import BUILTIN_REWARD_FNS
from areal_graph.api.sampling import SamplingParams
from areal_graph.graph.kind import CONTROLLER, Call, Hosting, ImportRef, Issue, NodeKind, RunInfo
from areal_graph.graph.spec import NodeSpec, WorkflowSpec

# Keys the rollout writes and must declare in `writes` (filled in when `writes` is omitted).
ROLLOUT_WRITES: tuple[str, ...] = ("input_ids", "loss_mask", "behav_logprobs", "versions")
# Keys every rollout provides implicitly (per-sequence ids; meta `answer` and `info`, the
# Trajectory.info as JSON, for rewards): nodes may read them without any node declaring them,
# and every node receives them.
IMPLICIT_ROLLOUT_KEYS: tuple[str, ...] = ("group_id", "sample_id", "answer", "info")

HOSTS = "areal_graph.runtime.hosts"


# ============================================================================ shared helpers
def trains_policy(node: NodeSpec) -> bool:
    """A train node with a policy loss: its model is the actor, whose new weights go to the
    inference servers after every step (the one place that decides it)."""
    return isinstance(node.params, TrainParams) and node.params.loss in POLICY_LOSSES


def actor_model(spec: WorkflowSpec) -> str | None:
    """The model trained with a policy loss: the one the inference servers serve."""
    return next((node.model for node in spec.nodes.values() if trains_policy(node)), None)


def rollout_temperature(spec: WorkflowSpec) -> float:
    """Log-probs everywhere are of the temperature-scaled sampling distribution (what engines report)."""
    for node in spec.nodes.values():
        if isinstance(node.params, RolloutParams):
            return node.params.sampling.temperature or 1.0
    return 1.0


def model_role(spec: WorkflowSpec, model: str) -> Literal["policy", "critic"]:
    """A model is a critic when a node uses it as one (a value node, the value loss)."""
    from areal_graph.graph.registry import kind_of

    roles = {kind_of(n).model_role(n) for n in spec.nodes.values() if n.model == model}
    return "critic" if "critic" in roles else "policy"


def _reads_missing(node: NodeSpec, need: tuple[str, ...], why: str) -> list[Issue]:
    missing = [k for k in need if k not in node.reads]
    return [Issue(("reads",), f"{why} must read {', '.join(missing)}")] if missing else []


def _writes_exactly_one(node: NodeSpec, what: str) -> list[Issue]:
    if len(node.writes) != 1:
        return [Issue(("writes",), f"a {what} node writes exactly one key, got {list(node.writes)}")]
    return []


# ============================================================================ rollout
@dataclass(frozen=True)
class RolloutParams:
    """The rollout node: a rollout class generating `group_size` answers per prompt."""

    rollout_class: str = cfg("areal_graph.workflows.rollout.single_turn_math:SingleTurnMath", import_path_check,
                             "the Rollout subclass that turns one prompt into a group of trajectories")
    rollout_args: dict[str, Any] = cfg({}, None, "keyword arguments for the rollout class")
    group_size: int = cfg(8, positive, "answers per prompt (G); GRPO/RLOO normalise within a group")
    sampling: SamplingParams = field(default_factory=SamplingParams, metadata={"check": None, "help": ""})


def _rollout_args(node: NodeSpec, spec: WorkflowSpec, info: RunInfo) -> dict[str, Any]:
    p: RolloutParams = node.params
    return {"server_urls": list(info.server_urls), "backend": spec.inference.backend,
            "rollout_class": p.rollout_class, "rollout_args": dict(p.rollout_args), "group_size": p.group_size,
            "sampling": asdict(p.sampling), "tokenizer_path": info.model_paths[actor_model(spec) or ""],
            "lora_adapters": adapter_sync(spec)}


def adapter_sync(spec: WorkflowSpec) -> bool:
    """The policy syncs as a LoRA adapter (the client names it where the backend serves adapters)."""
    actor = spec.models.get(actor_model(spec) or "")
    return actor is not None and actor.lora is not None and actor.lora.sync == "adapter"


def _rollout_rules(node: NodeSpec) -> list[Issue]:
    out = []
    if node.reads:
        out.append(Issue(("reads",), "a rollout node reads prompts from `data`, not keys; remove 'reads'"))
    for name in ("json_schema", "grammar"):
        if getattr(node.params.sampling, name) is not None:
            out.append(Issue(("sampling", name), "constrained decoding is for served requests (response_format, "
                             "forced tool calls): a rollout's tokens must be drawn from the policy itself to be "
                             "trained, so a workflow cannot constrain them"))
    return out


ROLLOUT = NodeKind(
    name="rollout", params=RolloutParams, model="optional", phase="generation", source=True,
    doc="generates a group of trajectories per prompt on the inference servers",
    hosting=lambda node, spec: Hosting("rollout", node.name, f"{HOSTS}.rollout_host:RolloutHost", role="rollout"),
    host_args=_rollout_args,
    call=lambda node, spec: Call("run"),
    rules=lambda node, spec: _rollout_rules(node),
    imports=lambda node: [ImportRef("rollout_class", node.params.rollout_class, "rollout_class",
                                    kwargs=node.params.rollout_args, supplied=("tokenizer_path",))],
    default_writes=ROLLOUT_WRITES,
)


# ============================================================================ reward
@dataclass(frozen=True)
class RewardParams:
    fn: str = cfg("math_verify", None, "a builtin reward (math_verify, code, code_fraction, agent, reasoning_gym: the "
                                       "task's own scorer, for reasoning_gym:<dataset> data) or an import path "
                                       "'package.module:function'")
    timeout_s: float = cfg(5.0, positive, "per-answer verification timeout")
    num_workers: int = cfg(2, positive, "verifier processes")


def _reward_rules(node: NodeSpec, spec: WorkflowSpec) -> list[Issue]:
    issues = _writes_exactly_one(node, "reward")
    if node.params.fn not in BUILTIN_REWARD_FNS and import_path_check(node.params.fn):
        near = difflib.get_close_matches(node.params.fn, sorted(BUILTIN_REWARD_FNS), n=1)
        issues.append(Issue(("fn",), f"must be a builtin reward {sorted(BUILTIN_REWARD_FNS)} or an import path "
                                     f"'package.module:function', got {node.params.fn!r}"
                                     + (f" (did you mean {near[0]!r}?)" if near else "")))
    if node.params.fn == "reasoning_gym":
        plain = [f"data.{k} ({v})" for k, v in (("train", spec.data.train), ("eval", spec.data.eval))
                 if v and not str(v).startswith("reasoning_gym:")]
        if plain:
            issues.append(Issue(("fn",), "fn: reasoning_gym scores rows of a reasoning_gym:<dataset> dataset (the "
                                         f"row carries the task's entry); {', '.join(plain)} is not one"))
    return issues + _reads_missing(node, ("input_ids", "loss_mask"), "a reward node (it scores the generated text)")


REWARD = NodeKind(
    name="reward", params=RewardParams, model="forbidden", phase="generation",
    doc="scores each trajectory's generated text (one reward per sequence); a fn with an `episode` "
        "parameter also gets the turns, tool calls and the rollout's info (api/episode.py)",
    hosting=lambda node, spec: Hosting("reward", node.name, f"{HOSTS}.reward_host:RewardHost"),
    host_args=lambda node, spec, info: {"tokenizer_path": info.model_paths[actor_model(spec) or ""],
                                        "fn": node.params.fn, "timeout_s": node.params.timeout_s,
                                        "num_workers": node.params.num_workers},
    call=lambda node, spec: Call("score", {"out_key": node.writes[0]}),
    rules=_reward_rules,
    scores=True,
    # a malformed path is the rule's to report (with the builtins and the nearest one), not the importer's
    imports=lambda node: [] if node.params.fn in BUILTIN_REWARD_FNS or import_path_check(node.params.fn) else [
        ImportRef("fn", node.params.fn, "callable", kwargs={}, positional=2, supplied=("episode",))],
)


# ============================================================================ reward model
@dataclass(frozen=True)
class RewardModelParams:
    """A sequence-classification `model` scoring whole trajectories (runtime/hosts/reward_model_host.py)."""

    output: Literal["auto", "logit", "sigmoid", "prob"] = cfg(
        "auto", None, "auto: the logit of a one-label head, the probability of label 1 of a two-label one")
    retokenize: Literal["auto", "always", "never"] = cfg(
        "auto", None, "re-encode each trajectory's text with the reward model's tokenizer: auto when its "
                      "vocabulary differs from the policy's")
    max_tokens_per_microbatch: Optional[int] = cfg(None, positive, "padded tokens per forward (null: the "
                                                                   "runtime's max_tokens_per_microbatch)")


def _reward_model_rules(node: NodeSpec, spec: WorkflowSpec) -> list[Issue]:
    issues = _writes_exactly_one(node, "reward_model") + _reads_missing(node, ("input_ids",), "a reward_model node")
    model = spec.models.get(str(node.model))
    if model is not None and model.train is not None:
        issues.append(Issue(("model",), f"model '{model.name}' has `train` settings, but a reward model is frozen "
                                        "(training it in the run is not built): remove them"))
    if model is not None and model.dp_size != 1:
        issues.append(Issue(("model",), f"model '{model.name}' has dp_size {model.dp_size}; a reward model runs in "
                                        "one process (dp_size 1)"))
    others = [n.name for n in spec.nodes.values() if n.model == node.model and n.name != node.name]
    if others:
        issues.append(Issue(("model",), f"model '{node.model}' is also used by {others}: a reward model needs its own "
                                        "entry under `models:`"))
    return issues


REWARD_MODEL = NodeKind(
    name="reward_model", params=RewardModelParams, model="required", phase="generation",
    doc="scores whole trajectories with a sequence-classification `model` (any AutoModelForSequenceClassification "
        "directory) in its own process; one value per sequence",
    hosting=lambda node, spec: Hosting(f"rm-{node.name}", node.name, f"{HOSTS}.reward_model_host:RewardModelHost",
                                       exclusive=True),
    host_args=lambda node, spec, info: {"path": info.model_paths[str(node.model)],
                                        "policy_tokenizer_path": info.model_paths[actor_model(spec) or ""],
                                        "device": spec.models[str(node.model)].device,
                                        "output": node.params.output, "retokenize": node.params.retokenize},
    call=lambda node, spec: Call("score", {"out_key": node.writes[0], "max_tokens_per_mb":
                                           node.params.max_tokens_per_microbatch
                                           or spec.runtime.max_tokens_per_microbatch}),
    rules=_reward_model_rules,
    scores=True,
)


# ============================================================================ judge
@dataclass(frozen=True)
class JudgeParams:
    """A generative verifier: a served model asked about each answer (api/judge.py, runtime/hosts/judge_host.py)."""

    url: Optional[str] = cfg(None, None, "an OpenAI-compatible endpoint (…/v1); null: the run's first inference server")
    api_key_env: Optional[str] = cfg(None, None, "environment variable holding the endpoint's key (with `url`)")
    model_name: Optional[str] = cfg(None, None, "the model name sent to the endpoint (the node's `model` key is "
                                    "for models of the workflow; a judge has none); null: the one the endpoint "
                                    "lists on /v1/models (the run's own server: its newest LoRA adapter, if any)")
    template: str = cfg(DEFAULT_JUDGE_TEMPLATE, None, "the question put to the judge: {prompt}, {response}, {answer}")
    system: Optional[str] = cfg(None, None, "a system message before it")
    verdict: Literal["yes_no", "score"] = cfg("yes_no", None, "yes_no: yes 1, no 0; score: a number / score_max")
    pattern: Optional[str] = cfg(None, None, "a regex with one group that finds the verdict (null: the rule's default)")
    score_max: float = cfg(10.0, positive, "the top of the judge's score scale (verdict: score)")
    max_tokens: int = cfg(32, positive, "the judge's reply limit")
    temperature: float = cfg(0.0, non_negative, "the judge's sampling temperature")
    max_concurrency: int = cfg(8, positive, "requests in flight at once")
    timeout_s: float = cfg(60.0, positive, "per request; a request past it counts as failed")
    on_failure: float = cfg(0.0, None, "the reward of a failed request or an unparsable reply (both are counted)")


def _judge_rules(node: NodeSpec, spec: WorkflowSpec) -> list[Issue]:
    p: JudgeParams = node.params
    issues = _writes_exactly_one(node, "judge") + _reads_missing(node, ("input_ids", "loss_mask"),
                                                                 "a judge node (it shows the judge the answer)")
    if (problem := judge_template_problem(p.template)) is not None:
        issues.append(Issue(("template",), problem))
    if p.pattern is not None and (problem := judge_pattern_problem(p.pattern)) is not None:
        issues.append(Issue(("pattern",), problem))
    if p.url is not None and not p.url.startswith(("http://", "https://")):
        issues.append(Issue(("url",), f"must start with http:// or https:// (e.g. http://{p.url.split('://')[-1]}), "
                                      f"got {p.url!r}"))
    if p.api_key_env is not None and p.url is None:
        issues.append(Issue(("api_key_env",), "is for an endpoint given by `url`; the run's own servers take the "
                                              "run's token"))
    return issues


def _judge_host_args(node: NodeSpec, spec: WorkflowSpec, info: RunInfo) -> dict[str, Any]:
    """The key never travels in these arguments: the host reads it from its own environment."""
    p: JudgeParams = node.params
    if p.url is None and not info.server_urls:
        raise ValueError(f"judge node '{node.name}': the run has no inference server to ask")
    base_url = p.url if p.url is not None else info.server_urls[0].rstrip("/") + "/v1"
    return {"policy_tokenizer_path": info.model_paths[actor_model(spec) or ""], "base_url": base_url,
            "api_key_env": p.api_key_env, "use_run_token": p.url is None,
            "model": p.model_name, "template": p.template, "system": p.system, "verdict": p.verdict, "pattern": p.pattern,
            "score_max": p.score_max, "max_tokens": p.max_tokens, "temperature": p.temperature,
            "max_concurrency": p.max_concurrency, "timeout_s": p.timeout_s, "on_failure": p.on_failure}


JUDGE = NodeKind(
    name="judge", params=JudgeParams, model="forbidden", phase="generation",
    doc="asks a served model (the run's inference server or any OpenAI-compatible endpoint) about each answer "
        "with a template and parses its verdict into a reward",
    hosting=lambda node, spec: Hosting(f"judge-{node.name}", node.name, f"{HOSTS}.judge_host:JudgeHost"),
    host_args=_judge_host_args,
    call=lambda node, spec: Call("score", {"out_key": node.writes[0]}),
    rules=_judge_rules,
    scores=True,
)


# ============================================================================ model nodes: logprob, value, train
@dataclass(frozen=True)
class LogprobParams:
    """Forward pass of `model` writing per-token log-probs (ref or proximal policy)."""


@dataclass(frozen=True)
class ValueParams:
    """Critic forward pass of `model` writing per-token values."""


@dataclass(frozen=True)
class TrainParams:
    loss: Literal["decoupled_ppo", "ppo", "gspo", "cispo", "value"] = cfg(
        "decoupled_ppo", None, "decoupled_ppo, ppo (trust region on pi_behav), gspo, cispo (nodes/ppo_loss.py), value")
    clip_eps: float = cfg(0.2, positive, "PPO clip epsilon (low side, and high side unless eps_high)")
    eps_high: Optional[float] = cfg(None, positive, "asymmetric upper clip (DAPO clip-higher)")
    dual_clip: Optional[float] = cfg(None, dual_clip_check)
    behav_imp_cap: Optional[float] = cfg(None, greater_than_one, "mask tokens with pi_prox/pi_behav above this")
    is_correction: Literal["none", "tis", "token_mask", "seq_mask", "icepop"] = cfg(
        "none", None, "off-policy correction of w = pi_prox/pi_behav (nodes/off_policy.py)")
    is_low: Optional[float] = cfg(None, positive, "lower bound on w (token_mask, seq_mask, icepop); default per correction")
    is_high: Optional[float] = cfg(None, positive, "upper bound on w (every correction); default per correction")
    agg: Literal["token-mean", "seq-mean-token-mean", "dr-grpo"] = cfg("token-mean")
    entropy_coef: float = cfg(0.0, non_negative)
    value_clip: float = cfg(0.2, positive, "value-loss clip range (loss: value)")
    ppo_epochs: int = cfg(1, positive, "passes over each batch")
    ppo_minibatches: int = cfg(1, positive, "optimizer steps per pass, each on a 1/n share of the batch's sequences")


# Keys each train loss must read; nodes/train_loss.py `required_keys` reads this table too.
TRAIN_REQUIRED_READS: dict[str, tuple[str, ...]] = {
    "decoupled_ppo": ("input_ids", "loss_mask", "behav_logprobs", "prox_logprobs", "advantages"),
    "ppo": ("input_ids", "loss_mask", "behav_logprobs", "advantages"),
    "gspo": ("input_ids", "loss_mask", "behav_logprobs", "prox_logprobs", "advantages"),
    "cispo": ("input_ids", "loss_mask", "behav_logprobs", "prox_logprobs", "advantages"),
    "value": ("input_ids", "loss_mask", "values", "returns"),
}
POLICY_LOSSES: tuple[str, ...] = ("decoupled_ppo", "ppo", "gspo", "cispo")
# Policy losses with a proximal policy: their behaviour weight w = pi_prox / pi_behav can be
# corrected (`is_correction`), and their pi_prox can come from the training forward (fusion).
PROX_LOSSES: tuple[str, ...] = ("decoupled_ppo", "gspo", "cispo")


def _model_hosting(node: NodeSpec, spec: WorkflowSpec) -> Hosting:
    """All nodes of one model share one `ModelHost` in the process `model-<name>`; with
    `dp_size` > 1 that process is rank 0 and relays every call to the other ranks."""
    model = spec.models.get(str(node.model))
    ranks = model.dp_size if model is not None else 1
    impl = f"{HOSTS}.dp_model_host:DataParallelModelHost" if ranks > 1 else f"{HOSTS}.model_host:ModelHost"
    return Hosting(f"model-{node.model}", str(node.model), impl, exclusive=True, role="model", ranks=ranks)


def _model_host_args(node: NodeSpec, spec: WorkflowSpec, info: RunInfo) -> dict[str, Any]:
    model = spec.models[str(node.model)]
    return {"model_path": info.model_paths[model.name], "optim": asdict(model.train) if model.train else None,
            "total_steps": spec.runtime.steps, "seed": spec.runtime.seed, "threads": info.train_threads,
            "role": model_role(spec, model.name), "device": model.device,
            **({"lora": asdict(model.lora)} if model.lora is not None else {}),
            # only when not the defaults, so that the host args of existing workflows stay as they were
            **({"backend": model.backend} if model.backend != "torch" else {}),
            **({"precision": model.precision} if model.precision != "fp32" else {})}


def _mb_args(spec: WorkflowSpec) -> dict[str, Any]:
    return {"max_tokens_per_mb": spec.runtime.max_tokens_per_microbatch}


LOGPROB = NodeKind(
    name="logprob", params=LogprobParams, model="required", phase="training",
    doc="per-token log-probs of `model` (reference or proximal policy)",
    hosting=_model_hosting, host_args=_model_host_args,
    call=lambda node, spec: Call("logprob", {"out_key": node.writes[0], "temperature": rollout_temperature(spec),
                                             **_mb_args(spec)}),
    rules=lambda node, spec: _writes_exactly_one(node, "logprob")
    + _reads_missing(node, ("input_ids",), "a logprob node"),
    model_role=lambda node: "policy",
)

VALUE = NodeKind(
    name="value", params=ValueParams, model="required", phase="training",
    doc="per-token values of a critic `model`",
    hosting=_model_hosting, host_args=_model_host_args,
    call=lambda node, spec: Call("values", {"out_key": node.writes[0], **_mb_args(spec)}),
    rules=lambda node, spec: _writes_exactly_one(node, "value") + _reads_missing(node, ("input_ids",), "a value node"),
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
    if not (spec.runtime.fuse_prox_logprob and isinstance(p, TrainParams) and p.loss in PROX_LOSSES
            and p.ppo_epochs == 1 and p.ppo_minibatches == 1 and p.is_correction not in REJECTING):
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
    if p.is_correction != "none" and p.loss not in PROX_LOSSES:
        why = ("centres its trust region on pi_behav and has no separate behaviour weight to correct: use "
               "decoupled_ppo (at max_staleness 0 it is plain PPO/GRPO with the trainer's pi_old, whose "
               "weight pi_old/pi_behav is the engine-vs-trainer mismatch)") if p.loss == "ppo" else "is the critic's"
        issues.append(Issue(("is_correction",), f"loss '{p.loss}' {why}"))
    if p.dual_clip is not None and p.loss in ("gspo", "cispo"):
        issues.append(Issue(("dual_clip",), f"is not built for loss '{p.loss}' (decoupled_ppo and ppo only): "
                                            "GSPO clips a sequence ratio, CISPO bounds its weight with eps_high"))
    return issues


def _train_rules(node: NodeSpec, spec: WorkflowSpec) -> list[Issue]:
    p: TrainParams = node.params
    missing = [k for k in TRAIN_REQUIRED_READS[p.loss] if k not in node.reads]
    issues = []
    if missing:
        what = "a train node with a policy loss needs advantages: " if "advantages" in missing else ""
        issues.append(Issue(("reads",), f"{what}loss '{p.loss}' must read {', '.join(missing)}"))
    if node.writes:
        issues.append(Issue(("writes",), "a train node writes no keys (it updates weights)"))
    model = spec.models.get(str(node.model))
    if model is not None and model.train is None:
        issues.append(Issue(("model",), f"model '{node.model}' has no 'train' section (optimiser), so it cannot be trained"))
    issues += _correction_rules(p)
    if p.ppo_minibatches > spec.runtime.batch_size:
        issues.append(Issue(("ppo_minibatches",), f"must be at most runtime.batch_size ({spec.runtime.batch_size}) "
                                                  f"so that every PPO minibatch holds a trajectory, got {p.ppo_minibatches}"))
    return issues


TRAIN = NodeKind(
    name="train", params=TrainParams, model="required", phase="training",
    doc="one optimiser step of `model` on the batch (new weights go to the inference servers)",
    hosting=_model_hosting, host_args=_model_host_args,
    call=lambda node, spec: Call("train", {"params": asdict(node.params), "temperature": rollout_temperature(spec),
                                           "fused_prox": fused_prox_node(node, spec) is not None, **_mb_args(spec)}),
    rules=_train_rules,
    trains=True,
    fuses=fused_prox_node,
    optional_reads=("versions",),
    versioned_call=True,
    model_role=lambda node: "critic" if node.params.loss == "value" else "policy",
)


# ============================================================================ advantage
@dataclass(frozen=True)
class AdvantageParams:
    estimator: Literal["grpo", "rloo", "gae", "reinforce"] = cfg("grpo")
    gamma: float = cfg(1.0, unit_interval, "discount (paper: 1.0)")
    lam: float = cfg(1.0, unit_interval, "GAE lambda (paper: 1.0)")
    kl_coef: float = cfg(0.0, non_negative, "KL penalty against ref_logprobs; 0 disables")
    kl_estimator: Literal["k1", "k2", "k3"] = cfg("k1")
    group_std: bool = cfg(True, None, "GRPO: divide by the group's std")
    normalize: bool = cfg(True, None, "global advantage normalisation")


def _advantage_rules(node: NodeSpec, spec: WorkflowSpec) -> list[Issue]:
    p: AdvantageParams = node.params
    need = ["rewards", "loss_mask"] + (["values"] if p.estimator == "gae" else []) + (
        ["ref_logprobs"] if p.kl_coef > 0 else [])
    why = f"estimator '{p.estimator}'" + (f" with kl_coef {p.kl_coef}" if p.kl_coef > 0 else "")
    issues = _reads_missing(node, tuple(need), why)
    if "advantages" not in node.writes:
        issues.append(Issue(("writes",), "an advantage node must write 'advantages'"))
    return issues


ADVANTAGE = NodeKind(
    name="advantage", params=AdvantageParams, model="forbidden", phase="training",
    doc="advantages (and returns) from rewards [, values, ref_logprobs]; batch-wide normalisation",
    hosting=lambda node, spec: Hosting(CONTROLLER, node.name, f"{HOSTS}.function_host:FunctionHost", role="controller"),
    host_args=lambda node, spec, info: {"fn": "areal_graph.nodes.advantages:advantage_node",
                                        "args": asdict(node.params), "node": node.name},
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
        "auto", None, "generation: per prompt group, before the sample buffer (may drop groups); training: on the "
                      "step's batch; auto: generation when everything it reads exists there")
    host: Literal["controller", "worker"] = cfg("controller", None,
                                                "run in the controller, or in the `functions` worker process")


FUNCTION = NodeKind(
    name="function", params=FunctionParams, model="forbidden", phase="auto",
    doc="a user function `package.module:fn` on the packed batch; may write keys and drop whole prompt groups",
    hosting=lambda node, spec: Hosting(CONTROLLER if node.params.host == "controller" else "functions", node.name,
                                       f"{HOSTS}.function_host:FunctionHost",
                                       role="controller" if node.params.host == "controller" else "stateless"),
    host_args=lambda node, spec, info: {"fn": node.params.fn, "args": dict(node.params.args), "node": node.name,
                                        "writes": list(node.writes)},
    call=lambda node, spec: Call("run"),
    imports=lambda node: [ImportRef("fn", node.params.fn, "callable", kwargs=node.params.args, positional=1,
                                    supplied=("out_key",) if len(node.writes) == 1 else ())],
    may_drop=True,
)

BUILTIN_KINDS: dict[str, NodeKind] = {k.name: k for k in (ROLLOUT, REWARD, REWARD_MODEL, JUDGE, LOGPROB, VALUE, ADVANTAGE,
                                                           TRAIN, FUNCTION)}
