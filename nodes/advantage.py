"""The advantage node: turns rewards (and values, reference log-probs) into per-token advantages.

It is cheap pure math, so the controller runs it in its own process; the estimators
themselves live in `nodes/advantages.py`.
"""

from __future__ import annotations

import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.graph.node_kinds import AdvantageParams
from areal_graph.nodes import advantages as est
from areal_graph.nodes.ppo_loss import kl_penalty


def compute_advantages(params: AdvantageParams, batch: PackedBatch) -> PackedBatch:
    """Return a batch holding `advantages` (and `returns` for GAE), same sequences as `batch`."""
    mask = batch["loss_mask"].to(torch.float32)
    cu = batch.cu_seqlens
    rewards = batch["rewards"].to(torch.float32)

    kl = None
    if params.kl_coef:
        if "ref_logprobs" not in batch:
            raise KeyError("advantage node: kl_coef > 0 needs ref_logprobs (add a ref logprob node)")
        policy_lp = batch["prox_logprobs"] if "prox_logprobs" in batch else batch["behav_logprobs"]
        kl = kl_penalty(policy_lp, batch["ref_logprobs"], params.kl_estimator) * mask

    out: dict[str, torch.Tensor] = {}
    if params.estimator in ("grpo", "rloo"):
        if params.estimator == "grpo":
            seq_adv = est.grpo_advantages(rewards, batch["group_id"], std_normalize=params.group_std)
        else:
            seq_adv = est.rloo_advantages(rewards, batch["group_id"])
        # The group baseline acts on the outcome; a KL penalty (if any) is per token, so the
        # advantage of a token is its baselined outcome minus the KL still to come after it.
        token_rewards = est.outcome_token_rewards(seq_adv, mask, cu, kl=kl, kl_coef=params.kl_coef)
        adv = est.reinforce_returns(token_rewards, mask, cu, gamma=params.gamma)
    elif params.estimator == "reinforce":
        token_rewards = est.outcome_token_rewards(rewards, mask, cu, kl=kl, kl_coef=params.kl_coef)
        adv = est.reinforce_returns(token_rewards, mask, cu, gamma=params.gamma)
    elif params.estimator == "gae":
        if "values" not in batch:
            raise KeyError("advantage node: estimator gae needs values (add a value node with a critic)")
        token_rewards = est.outcome_token_rewards(rewards, mask, cu, kl=kl, kl_coef=params.kl_coef)
        adv, returns = est.gae(token_rewards, batch["values"].float(), mask, cu, params.gamma, params.lam)
        out["returns"] = returns
    else:  # the spec validator rejects unknown estimators; this guards direct callers
        raise ValueError(f"unknown advantage estimator {params.estimator!r}")

    if params.normalize:
        adv = est.normalize_advantages(adv, mask)
    out["advantages"] = adv * mask
    return PackedBatch(cu.clone(), out)
