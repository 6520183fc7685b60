"""The losses a train node can use (`LOSSES`), and the train node's parameters.

One entry per loss says everything the rest of the engine asks about it: which keys it reads
(validation, and the trainer's batch), whether it trains a policy or a critic (the model's
role, which model is the actor), whether it has a proximal policy (then its behaviour weight
w = pi_prox / pi_behav can be corrected and pi_prox can come from the training forward),
which options it takes, and the function that computes its per-token terms, named by import
path (it needs torch; the trainer imports it, `validate` never does). `TrainParams.loss`
accepts exactly the names of this table.

A new loss is one entry here plus its function: a policy loss's function is called as
`fn(params, terms)` with a `nodes/train_loss.py:PolicyTerms` and returns (per-token loss,
per-token stats); a critic loss's as `fn(params, terms)` with a `CriticTerms`.

Torch-free: the CLI validates workflows without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from areal_graph.api.fields import cfg, dual_clip_check, greater_than_one, non_negative, positive


@dataclass(frozen=True)
class Loss:
    """One loss of a train node (see module docstring)."""

    name: str
    doc: str
    role: Literal["policy", "critic"]
    reads: tuple[str, ...]  # keys the train node must read (and the trainer hands the loss)
    fn: str  # "package.module:function": the per-token terms (nodes/train_loss.py)
    prox: bool = False  # a proximal policy pi_prox centres the trust region; w = pi_prox / pi_behav
    dual_clip: bool = False  # takes `dual_clip`


_POLICY_READS = ("input_ids", "loss_mask", "behav_logprobs")
_TERMS = "areal_graph.nodes.train_loss"

LOSSES: dict[str, Loss] = {
    loss.name: loss
    for loss in (
        Loss(
            "decoupled_ppo",
            "decoupled PPO: the trust region on pi_prox, each token weighted by pi_prox/pi_behav",
            "policy",
            _POLICY_READS + ("prox_logprobs", "advantages"),
            f"{_TERMS}:clipped_ratio_terms",
            prox=True,
            dual_clip=True,
        ),
        Loss(
            "ppo",
            "standard PPO: the trust region on pi_behav (no proximal policy, no behaviour weight)",
            "policy",
            _POLICY_READS + ("advantages",),
            f"{_TERMS}:clipped_ratio_terms",
            dual_clip=True,
        ),
        Loss(
            "gspo",
            "GSPO: the ratio and its clip per sequence",
            "policy",
            _POLICY_READS + ("prox_logprobs", "advantages"),
            f"{_TERMS}:gspo_terms",
            prox=True,
        ),
        Loss(
            "cispo",
            "CISPO: the importance weight clipped and held constant, every token keeps its gradient",
            "policy",
            _POLICY_READS + ("prox_logprobs", "advantages"),
            f"{_TERMS}:cispo_terms",
            prox=True,
        ),
        Loss(
            "value",
            "the critic's clipped value loss against the GAE returns",
            "critic",
            ("input_ids", "loss_mask", "values", "returns"),
            f"{_TERMS}:value_terms",
        ),
    )
}

POLICY_LOSSES: tuple[str, ...] = tuple(n for n, loss in LOSSES.items() if loss.role == "policy")
# Policy losses with a proximal policy: their behaviour weight can be corrected (`is_correction`),
# and their pi_prox can come from the training forward (fusion, graph/kinds/model.py).
PROX_LOSSES: tuple[str, ...] = tuple(n for n, loss in LOSSES.items() if loss.prox)

# The type of `TrainParams.loss`: the loader and the schema reference read the choices off this
# Literal (typed_yaml), which is built from the table; mypy sees a str.
if TYPE_CHECKING:
    LossName = str
else:
    LossName = Literal[tuple(LOSSES)]


@dataclass(frozen=True)
class TrainParams:
    loss: LossName = cfg(
        "decoupled_ppo", None, "the loss; what each one reads and does: LOSSES in graph/kinds/losses.py"
    )
    clip_eps: float = cfg(0.2, positive, "PPO clip epsilon (low side, and high side unless eps_high)")
    eps_high: float | None = cfg(None, positive, "asymmetric upper clip (DAPO clip-higher)")
    dual_clip: float | None = cfg(None, dual_clip_check)
    behav_imp_cap: float | None = cfg(None, greater_than_one, "mask tokens with pi_prox/pi_behav above this")
    is_correction: Literal["none", "tis", "token_mask", "seq_mask", "icepop"] = cfg(
        "none", None, "off-policy correction of w = pi_prox/pi_behav (nodes/off_policy.py)"
    )
    is_low: float | None = cfg(
        None, positive, "lower bound on w (token_mask, seq_mask, icepop); default per correction"
    )
    is_high: float | None = cfg(None, positive, "upper bound on w (every correction); default per correction")
    agg: Literal["token-mean", "seq-mean-token-mean", "dr-grpo"] = cfg("token-mean")
    entropy_coef: float = cfg(0.0, non_negative)
    value_clip: float = cfg(0.2, positive, "value-loss clip range (loss: value)")
    ppo_epochs: int = cfg(1, positive, "passes over each batch")
    ppo_minibatches: int = cfg(1, positive, "optimizer steps per pass, each on a 1/n share of the batch's sequences")
