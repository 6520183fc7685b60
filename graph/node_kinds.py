"""Per-kind node parameters: one frozen dataclass per node kind, the single source of truth.

Field names, types and defaults live only here; the loader reads them (via
`dataclasses.fields` and type hints) to validate YAML, so adding a field here is all it takes
to make it configurable. Range rules travel in each field's metadata (`check`), so the rule
sits next to the default it constrains. Defaults follow the AReaL paper where it gives one.

This module must stay free of torch and gRPC: the CLI validates workflows without them.
"""

from __future__ import annotations

import re

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional

# ----------------------------------------------------------------------------- range checks
# A check returns None when the value is fine, else a short description of what is expected.
Check = Callable[[Any], Optional[str]]


def positive(v: Any) -> str | None:
    return None if v > 0 else "must be > 0"


def non_negative(v: Any) -> str | None:
    return None if v >= 0 else "must be >= 0"


def unit_interval(v: Any) -> str | None:
    return None if 0 <= v <= 1 else "must be in [0, 1]"


def open_unit_interval_upper(v: Any) -> str | None:
    return None if 0 < v <= 1 else "must be in (0, 1]"


def top_k_check(v: Any) -> str | None:
    return None if v == -1 or v > 0 else "must be -1 (disabled) or > 0"


def dual_clip_check(v: Any) -> str | None:
    return None if v > 1 else "must be > 1 (the dual-clip bound c of Ye et al.)"


def greater_than_one(v: Any) -> str | None:
    return None if v >= 1 else "must be >= 1"


def import_path_check(v: Any) -> str | None:
    module, sep, attr = v.partition(":")
    return None if sep and module and attr else "must be an import path 'package.module:Name'"


def reward_fn_check(v: Any) -> str | None:
    return None if v == "math_verify" or import_path_check(v) is None else (
        "must be 'math_verify' or an import path 'package.module:function'")


def device_check(v: Any) -> str | None:
    return None if re.fullmatch(r"cpu|cuda(:\d+)?", str(v)) else "must be cpu, cuda or cuda:N"


def betas_check(v: Any) -> str | None:
    return None if all(0 <= b < 1 for b in v) else "both betas must be in [0, 1)"


def _f(default: Any, check: Check | None = None, help: str = "") -> Any:
    """A dataclass field with a default, a range check and a one-line help text."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"check": check, "help": help})
    return field(default=default, metadata={"check": check, "help": help})


# ----------------------------------------------------------------------------- rollout
@dataclass(frozen=True)
class SamplingParams:
    """How the inference engine samples answers (per request)."""

    temperature: float = _f(1.0, non_negative, "0 means greedy")
    top_p: float = _f(1.0, open_unit_interval_upper)
    top_k: int = _f(-1, top_k_check, "-1 disables top-k")
    max_new_tokens: int = _f(256, positive)
    stop: list[str] = _f([], None, "extra stop strings besides EOS")


@dataclass(frozen=True)
class RolloutParams:
    """The rollout node: a user rollout workflow generating `group_size` answers per prompt."""

    workflow: str = _f("areal_graph.workflows.rollout.single_turn_math:SingleTurnMath", import_path_check)
    workflow_args: dict[str, Any] = _f({}, None, "keyword arguments for the workflow class")
    group_size: int = _f(8, positive, "answers per prompt (G); GRPO/RLOO normalise within a group")
    sampling: SamplingParams = field(default_factory=SamplingParams, metadata={"check": None, "help": ""})


# ----------------------------------------------------------------------------- reward
@dataclass(frozen=True)
class RewardParams:
    fn: str = _f("math_verify", reward_fn_check, "'math_verify' or 'module:function'")
    timeout_s: float = _f(5.0, positive, "per-answer verification timeout")
    num_workers: int = _f(2, positive, "verifier processes")


# ----------------------------------------------------------------------------- logprob / value
@dataclass(frozen=True)
class LogprobParams:
    """Forward pass of `model` writing per-token log-probs (ref or proximal policy)."""


@dataclass(frozen=True)
class ValueParams:
    """Critic forward pass of `model` writing per-token values."""


# ----------------------------------------------------------------------------- advantage
@dataclass(frozen=True)
class AdvantageParams:
    estimator: Literal["grpo", "rloo", "gae", "reinforce"] = _f("grpo")
    gamma: float = _f(1.0, unit_interval, "discount (paper: 1.0)")
    lam: float = _f(1.0, unit_interval, "GAE lambda (paper: 1.0)")
    kl_coef: float = _f(0.0, non_negative, "KL penalty against ref_logprobs; 0 disables")
    kl_estimator: Literal["k1", "k2", "k3"] = _f("k1")
    group_std: bool = _f(True, None, "GRPO: divide by the group's std")
    normalize: bool = _f(True, None, "global advantage normalisation")


# ----------------------------------------------------------------------------- train
@dataclass(frozen=True)
class TrainParams:
    loss: Literal["decoupled_ppo", "ppo", "value"] = _f("decoupled_ppo")
    clip_eps: float = _f(0.2, positive, "PPO clip epsilon (low side, and high side unless eps_high)")
    eps_high: Optional[float] = _f(None, positive, "asymmetric upper clip (DAPO clip-higher)")
    dual_clip: Optional[float] = _f(None, dual_clip_check)
    behav_imp_cap: Optional[float] = _f(None, greater_than_one, "mask tokens with pi_prox/pi_behav above this")
    agg: Literal["token-mean", "seq-mean-token-mean", "dr-grpo"] = _f("token-mean")
    entropy_coef: float = _f(0.0, non_negative)
    value_clip: float = _f(0.2, positive, "value-loss clip range (loss: value)")
    ppo_epochs: int = _f(1, positive, "passes over each batch")
    ppo_minibatches: int = _f(1, positive, "optimizer steps per pass, each on a 1/n share of the batch's sequences")


# ----------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class KindInfo:
    """What the graph needs to know about a kind beyond its parameters."""

    params: type
    model: Literal["required", "forbidden", "optional"]
    doc: str


NODE_KINDS: dict[str, KindInfo] = {
    "rollout": KindInfo(RolloutParams, "optional", "generates trajectories on the inference servers"),
    "reward": KindInfo(RewardParams, "forbidden", "scores each trajectory (one reward per sequence)"),
    "logprob": KindInfo(LogprobParams, "required", "per-token log-probs of `model` (ref / proximal policy)"),
    "value": KindInfo(ValueParams, "required", "per-token values of a critic `model`"),
    "advantage": KindInfo(AdvantageParams, "forbidden", "advantages (and returns) from rewards [, values, ref_logprobs]"),
    "train": KindInfo(TrainParams, "required", "one optimiser step of `model` on the batch"),
}

# Keys the rollout writes and must declare in `writes` (filled in when `writes` is omitted).
ROLLOUT_WRITES: tuple[str, ...] = ("input_ids", "loss_mask", "behav_logprobs", "versions")
# Keys every rollout provides implicitly (per-sequence ids, and meta `answer` for rewards):
# nodes may read them without any node declaring them.
IMPLICIT_ROLLOUT_KEYS: tuple[str, ...] = ("group_id", "sample_id", "answer")

# Keys each train loss must read; mirrors nodes/train.py `required_keys` (which imports torch).
TRAIN_REQUIRED_READS: dict[str, tuple[str, ...]] = {
    "decoupled_ppo": ("input_ids", "loss_mask", "behav_logprobs", "prox_logprobs", "advantages"),
    "ppo": ("input_ids", "loss_mask", "behav_logprobs", "advantages"),
    "value": ("input_ids", "loss_mask", "values", "returns"),
}
POLICY_LOSSES: tuple[str, ...] = ("decoupled_ppo", "ppo")
