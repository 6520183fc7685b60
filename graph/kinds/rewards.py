"""The kinds that score answers, one reward per sequence: `reward` (a verifier function),
`reward_model` (a sequence-classification model) and `judge` (a served model asked about each
answer). An evaluation runs them (and what they read) on greedy answers (`scores`)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Literal

from areal_graph.api.fields import cfg, import_path_check, non_negative, positive
from areal_graph.api.judge import DEFAULT_TEMPLATE as DEFAULT_JUDGE_TEMPLATE
from areal_graph.api.judge import pattern_problem as judge_pattern_problem
from areal_graph.api.judge import template_problem as judge_template_problem
from areal_graph.api.reward_fit import misfits
from areal_graph.api.reward_fns import BUILTIN_REWARD_FNS
from areal_graph.graph.kind import Call, Hosting, ImportRef, Issue, NodeKind, RunInfo
from areal_graph.graph.kinds.common import HOSTS, actor_model, reads_missing, writes_exactly_one
from areal_graph.graph.spec import NodeSpec, WorkflowSpec


# ============================================================================ reward
@dataclass(frozen=True)
class RewardParams:
    fn: str = cfg(
        "math_verify",
        None,
        "a builtin reward (math_verify, code, code_fraction, agent, reasoning_gym: the "
        "task's own scorer, for reasoning_gym:<dataset> data) or an import path "
        "'package.module:function'",
    )
    timeout_s: float = cfg(5.0, positive, "per-answer verification timeout")
    num_workers: int = cfg(2, positive, "verifier processes")
    check_data_fit: bool = cfg(
        True,
        None,
        "refuse a builtin fn that cannot score the workflow's data (math_verify on reasoning_gym: rows, "
        "whose answer is the task's entry as JSON; a game's rows scored by anything but its own reward, "
        "fn: agent): api/reward_fit.py. false: the pairing is deliberate, train it as written",
    )


def _reward_rules(node: NodeSpec, spec: WorkflowSpec) -> list[Issue]:
    issues = writes_exactly_one(node, "reward")
    if node.params.fn not in BUILTIN_REWARD_FNS and import_path_check(node.params.fn):
        near = difflib.get_close_matches(node.params.fn, sorted(BUILTIN_REWARD_FNS), n=1)
        issues.append(
            Issue(
                ("fn",),
                f"must be a builtin reward {sorted(BUILTIN_REWARD_FNS)} or an import path "
                f"'package.module:function', got {node.params.fn!r}"
                + (f" (did you mean {near[0]!r}?)" if near else ""),
            )
        )
    if node.params.check_data_fit:
        datasets = [(f"data.{k}", str(v)) for k, v in (("train", spec.data.train), ("eval", spec.data.eval)) if v]
        issues += [
            Issue(("fn",), f"{problem}; to pair them on purpose, set check_data_fit: false on nodes.{node.name}")
            for problem in misfits(node.params.fn, datasets)
        ]
    return issues + reads_missing(node, ("input_ids", "loss_mask"), "a reward node (it scores the generated text)")


REWARD = NodeKind(
    name="reward",
    params=RewardParams,
    model="forbidden",
    phase="generation",
    doc="scores each trajectory's generated text (one reward per sequence); a fn with an `episode` "
    "parameter also gets the turns, tool calls and the rollout's info (api/episode.py)",
    hosting=lambda node, spec: Hosting("reward", node.name, f"{HOSTS}.reward_host:RewardHost"),
    host_args=lambda node, spec, info: {
        "tokenizer_path": info.model_paths[actor_model(spec) or ""],
        "fn": node.params.fn,
        "timeout_s": node.params.timeout_s,
        "num_workers": node.params.num_workers,
    },
    call=lambda node, spec: Call("score", {"out_key": node.writes[0]}),
    rules=_reward_rules,
    scores=True,
    # a malformed path is the rule's to report (with the builtins and the nearest one), not the importer's
    imports=lambda node: (
        []
        if node.params.fn in BUILTIN_REWARD_FNS or import_path_check(node.params.fn)
        else [ImportRef("fn", node.params.fn, "callable", kwargs={}, positional=2, supplied=("episode",))]
    ),
)


# ============================================================================ reward model
@dataclass(frozen=True)
class RewardModelParams:
    """A sequence-classification `model` scoring whole trajectories (runtime/hosts/reward_model_host.py)."""

    output: Literal["auto", "logit", "sigmoid", "prob"] = cfg(
        "auto", None, "auto: the logit of a one-label head, the probability of label 1 of a two-label one"
    )
    retokenize: Literal["auto", "always", "never"] = cfg(
        "auto",
        None,
        "re-encode each trajectory's text with the reward model's tokenizer: auto when its "
        "vocabulary differs from the policy's",
    )
    max_tokens_per_microbatch: int | None = cfg(
        None, positive, "padded tokens per forward (null: the runtime's max_tokens_per_microbatch)"
    )


def _reward_model_rules(node: NodeSpec, spec: WorkflowSpec) -> list[Issue]:
    issues = writes_exactly_one(node, "reward_model") + reads_missing(node, ("input_ids",), "a reward_model node")
    model = spec.models.get(str(node.model))
    if model is not None and model.train is not None:
        issues.append(
            Issue(
                ("model",),
                f"model '{model.name}' has `train` settings, but a reward model is frozen "
                "(training it in the run is not built): remove them",
            )
        )
    if model is not None and model.dp_size != 1:
        issues.append(
            Issue(
                ("model",),
                f"model '{model.name}' has dp_size {model.dp_size}; a reward model runs in one process (dp_size 1)",
            )
        )
    others = [n.name for n in spec.nodes.values() if n.model == node.model and n.name != node.name]
    if others:
        issues.append(
            Issue(
                ("model",),
                f"model '{node.model}' is also used by {others}: a reward model needs its own entry under `models:`",
            )
        )
    return issues


REWARD_MODEL = NodeKind(
    name="reward_model",
    params=RewardModelParams,
    model="required",
    phase="generation",
    doc="scores whole trajectories with a sequence-classification `model` (any AutoModelForSequenceClassification "
    "directory) in its own process; one value per sequence",
    hosting=lambda node, spec: Hosting(
        f"rm-{node.name}", node.name, f"{HOSTS}.reward_model_host:RewardModelHost", exclusive=True
    ),
    host_args=lambda node, spec, info: {
        "path": info.model_paths[str(node.model)],
        "policy_tokenizer_path": info.model_paths[actor_model(spec) or ""],
        "device": spec.models[str(node.model)].device,
        "output": node.params.output,
        "retokenize": node.params.retokenize,
    },
    call=lambda node, spec: Call(
        "score",
        {
            "out_key": node.writes[0],
            "max_tokens_per_mb": node.params.max_tokens_per_microbatch or spec.runtime.max_tokens_per_microbatch,
        },
    ),
    rules=_reward_model_rules,
    scores=True,
)


# ============================================================================ judge
@dataclass(frozen=True)
class JudgeParams:
    """A generative verifier: a served model asked about each answer (api/judge.py, runtime/hosts/judge_host.py)."""

    url: str | None = cfg(None, None, "an OpenAI-compatible endpoint (…/v1); null: the run's first inference server")
    api_key_env: str | None = cfg(None, None, "environment variable holding the endpoint's key (with `url`)")
    model_name: str | None = cfg(
        None,
        None,
        "the model name sent to the endpoint (the node's `model` key is "
        "for models of the workflow; a judge has none); null: the one the endpoint "
        "lists on /v1/models (the run's own server: its newest LoRA adapter, if any)",
    )
    template: str = cfg(DEFAULT_JUDGE_TEMPLATE, None, "the question put to the judge: {prompt}, {response}, {answer}")
    system: str | None = cfg(None, None, "a system message before it")
    verdict: Literal["yes_no", "score"] = cfg("yes_no", None, "yes_no: yes 1, no 0; score: a number / score_max")
    pattern: str | None = cfg(None, None, "a regex with one group that finds the verdict (null: the rule's default)")
    score_max: float = cfg(10.0, positive, "the top of the judge's score scale (verdict: score)")
    max_tokens: int = cfg(32, positive, "the judge's reply limit")
    temperature: float = cfg(0.0, non_negative, "the judge's sampling temperature")
    max_concurrency: int = cfg(8, positive, "requests in flight at once")
    timeout_s: float = cfg(60.0, positive, "per request; a request past it counts as failed")
    on_failure: float = cfg(0.0, None, "the reward of a failed request or an unparsable reply (both are counted)")


def _judge_rules(node: NodeSpec, spec: WorkflowSpec) -> list[Issue]:
    p: JudgeParams = node.params
    issues = writes_exactly_one(node, "judge") + reads_missing(
        node, ("input_ids", "loss_mask"), "a judge node (it shows the judge the answer)"
    )
    if (problem := judge_template_problem(p.template)) is not None:
        issues.append(Issue(("template",), problem))
    if p.pattern is not None and (problem := judge_pattern_problem(p.pattern)) is not None:
        issues.append(Issue(("pattern",), problem))
    if p.url is not None and not p.url.startswith(("http://", "https://")):
        issues.append(
            Issue(
                ("url",), f"must start with http:// or https:// (e.g. http://{p.url.split('://')[-1]}), got {p.url!r}"
            )
        )
    if p.api_key_env is not None and p.url is None:
        issues.append(
            Issue(("api_key_env",), "is for an endpoint given by `url`; the run's own servers take the run's token")
        )
    return issues


def _judge_host_args(node: NodeSpec, spec: WorkflowSpec, info: RunInfo) -> dict[str, Any]:
    """The key never travels in these arguments: the host reads it from its own environment."""
    p: JudgeParams = node.params
    if p.url is None and not info.server_urls:
        raise ValueError(f"judge node '{node.name}': the run has no inference server to ask")
    base_url = p.url if p.url is not None else info.server_urls[0].rstrip("/") + "/v1"
    return {
        "policy_tokenizer_path": info.model_paths[actor_model(spec) or ""],
        "base_url": base_url,
        "api_key_env": p.api_key_env,
        "use_run_token": p.url is None,
        "model": p.model_name,
        "template": p.template,
        "system": p.system,
        "verdict": p.verdict,
        "pattern": p.pattern,
        "score_max": p.score_max,
        "max_tokens": p.max_tokens,
        "temperature": p.temperature,
        "max_concurrency": p.max_concurrency,
        "timeout_s": p.timeout_s,
        "on_failure": p.on_failure,
    }


JUDGE = NodeKind(
    name="judge",
    params=JudgeParams,
    model="forbidden",
    phase="generation",
    doc="asks a served model (the run's inference server or any OpenAI-compatible endpoint) about each answer "
    "with a template and parses its verdict into a reward",
    hosting=lambda node, spec: Hosting(f"judge-{node.name}", node.name, f"{HOSTS}.judge_host:JudgeHost"),
    host_args=_judge_host_args,
    call=lambda node, spec: Call("score", {"out_key": node.writes[0]}),
    rules=_judge_rules,
    scores=True,
)
