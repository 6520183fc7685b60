"""The train node's loss: builds the callback the training engine applies to each micro-batch.

The engine sums micro-batch losses (and gradients across data-parallel ranks). To make the
result independent of how the batch was split, every normaliser is computed here, once, over
the whole batch, and each micro-batch returns only its share of the batch loss.

Fused proximal log-probs (`fused_prox`): when a step makes exactly one optimizer update,
the weights of the training forward are the proximal policy itself, so pi_prox is the
forward's own log-probs, detached: the ratio pi_theta / pi_prox is 1 in value with the
gradient of pi_theta, and the behaviour weight pi_prox / pi_behav is exactly what a
separate forward pass would have given (the plan decides; graph/node_kinds.py
`fused_prox_node`).
"""

from __future__ import annotations

import math

import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.api.corrections import ISCorrection
from areal_graph.graph.node_kinds import PROX_LOSSES, TRAIN_REQUIRED_READS, TrainParams
from areal_graph.engines.training.protocol import LossFn
from areal_graph.nodes.off_policy import (
    accepted_tokens,
    behaviour_log_weight,
    corrected_weight,
    mismatch_groups,
    mismatch_stats,
)
from areal_graph.nodes.ppo_loss import aggregate, cispo_loss, decoupled_ppo_loss, gspo_loss, loss_normalizer, value_loss


def required_keys(params: TrainParams, fused_prox: bool = False) -> tuple[str, ...]:
    """Keys the loss reads from the batch (one table, in graph/node_kinds.py, shared with validation)."""
    return tuple(k for k in TRAIN_REQUIRED_READS[params.loss] if not (fused_prox and k == "prox_logprobs"))


def _max_response_tokens(batch: PackedBatch) -> int:
    mask = batch["loss_mask"].to(torch.int64)
    per_seq = torch.zeros(batch.num_seqs, dtype=torch.int64).index_add_(0, batch.seq_ids(), mask)
    return max(int(per_seq.max()) if batch.num_seqs else 1, 1)


ACCEPTED = "is_accepted"  # token key: the tokens a rejecting correction keeps (prepare_policy_batch)


def correction_of(params: TrainParams) -> ISCorrection:
    return ISCorrection.resolve(params.is_correction, params.is_low, params.is_high)


def prepare_policy_batch(params: TrainParams, batch: PackedBatch) -> PackedBatch:
    """The batch a policy loss trains on. A rejecting correction (token_mask, seq_mask) decides
    here, on the whole batch and before any update, which tokens leave the loss: the batch's
    normaliser must count only the tokens that remain (nodes/off_policy.py)."""
    corr = correction_of(params)
    if not corr.rejects:
        return batch
    if "prox_logprobs" not in batch:
        raise ValueError(f"is_correction {corr.mode!r} decides before the step and needs prox_logprobs in the batch "
                         "(the plan does not fuse the proximal forward for it)")
    mask = batch["loss_mask"]
    log_w = behaviour_log_weight(batch["prox_logprobs"].float(), batch["behav_logprobs"].float(), mask)
    accepted = accepted_tokens(corr, log_w, mask, batch.cu_seqlens)
    return PackedBatch(batch.cu_seqlens, {**batch.tokens, ACCEPTED: accepted}, dict(batch.seqs), dict(batch.meta))


def _trained(mb: PackedBatch) -> torch.Tensor:
    mask = mb["loss_mask"] != 0
    return mask & mb[ACCEPTED] if ACCEPTED in mb else mask


def policy_loss_fn(params: TrainParams, batch: PackedBatch, fused_prox: bool = False,
                   policy_version: int | None = None) -> LossFn:
    """Decoupled PPO, GSPO or CISPO (or standard PPO when `params.loss == "ppo"`: pi_prox := pi_behav),
    with the behaviour weight corrected as `params.is_correction` says; every call also measures
    the train/inference mismatch (nodes/off_policy.py `mismatch_stats`): against pi_prox, or for
    `ppo` (which has none in its loss) against the batch's prox_logprobs when the graph computes
    them, else the training forward's own log-probs (exact on a step's first update)."""
    if fused_prox and params.loss not in PROX_LOSSES:
        raise ValueError(f"fused proximal log-probs apply to the {'/'.join(PROX_LOSSES)} losses, not {params.loss!r}")
    corr = correction_of(params)
    if fused_prox and corr.rejects:
        raise ValueError(f"is_correction {corr.mode!r} needs pi_prox before the step: it cannot use fused log-probs")
    trained_all = _trained(batch).float()
    norm = loss_normalizer(trained_all, batch.cu_seqlens, params.agg, max_tokens=_max_response_tokens(batch))
    n_trained = max(float(trained_all.sum()), 1.0)
    n_generated = max(float((batch["loss_mask"] != 0).sum()), 1.0)
    versions = batch["versions"] if "versions" in batch else None
    groups = mismatch_groups(batch["loss_mask"], batch.cu_seqlens, versions, policy_version)

    def loss_fn(logprobs: torch.Tensor, entropy: torch.Tensor, mb: PackedBatch):
        generated = mb["loss_mask"] != 0
        mask = _trained(mb).float()
        behav = mb["behav_logprobs"].float()
        if fused_prox:
            prox = logprobs.detach().float()
        else:
            prox = mb["prox_logprobs"].float() if params.loss in PROX_LOSSES else behav
        log_w = behaviour_log_weight(prox, behav, generated)
        weight, corrected = corrected_weight(corr, log_w, mask)
        per_tok, tok_stats = _policy_terms(params, corr.mode != "none", logprobs, prox, behav, log_w, weight,
                                           mb["advantages"].float(), mask, mb.cu_seqlens)
        if corr.mode in ("tis", "icepop"):
            tok_stats["is_corrected"] = corrected
        loss = aggregate(per_tok, mask, mb.cu_seqlens, params.agg, norm)
        if params.entropy_coef:
            loss = loss - params.entropy_coef * aggregate(entropy, mask, mb.cu_seqlens, params.agg, norm)
        # Each stat is this micro-batch's share of a batch-level token mean, so the engine's sum
        # is right; all read out at once (one conversion, not one per stat).
        sums = torch.stack([(entropy.detach() * mask).sum()]
                           + [(value.detach().float() * mask).sum() for value in tok_stats.values()]) / n_trained
        stats = dict(zip(["entropy", *tok_stats], sums.tolist()))
        if corr.rejects:
            stats["is_rejected"] = float((generated & (mask == 0)).sum()) / n_generated
        stats["policy_loss"] = float(loss.detach())
        if params.loss not in PROX_LOSSES:  # `ppo` trains with w = 1; the mismatch is still there to see
            trainer = mb["prox_logprobs"].float() if "prox_logprobs" in mb else logprobs.detach().float()
            log_w = behaviour_log_weight(trainer, behav, generated)
        stats.update(mismatch_stats(log_w, generated, mb.cu_seqlens, mb["versions"] if "versions" in mb else None,
                                    policy_version, groups))
        return loss, stats

    return loss_fn


def _policy_terms(params: TrainParams, corrected: bool, logprobs: torch.Tensor, prox: torch.Tensor,
                  behav: torch.Tensor, log_w: torch.Tensor, weight: torch.Tensor, adv: torch.Tensor,
                  mask: torch.Tensor, cu_seqlens: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss and stats of `params.loss`, trained with behaviour weight `weight`."""
    if params.loss in ("decoupled_ppo", "ppo"):
        return decoupled_ppo_loss(logprobs, prox, behav, adv, mask, clip_eps=params.clip_eps,
                                  eps_high=params.eps_high, dual_clip=params.dual_clip,
                                  behav_imp_cap=params.behav_imp_cap, weight=weight if corrected else None)
    capped = None
    if params.behav_imp_cap is not None:  # as decoupled_ppo_loss does: such tokens train with weight 0
        capped = (mask != 0) & (log_w > math.log(params.behav_imp_cap))
        weight = torch.where(capped, torch.zeros_like(weight), weight)
    if params.loss == "gspo":
        per_tok, stats = gspo_loss(logprobs, prox, weight, adv, mask, cu_seqlens,
                                   clip_eps=params.clip_eps, eps_high=params.eps_high)
    else:
        per_tok, stats = cispo_loss(logprobs, prox, weight, adv, mask, clip_eps=params.clip_eps,
                                    eps_high=params.eps_high)
    stats["behav_weight"] = torch.exp(log_w)
    if capped is not None:
        stats["capped_out"] = capped
    return per_tok, stats


def critic_loss_fn(params: TrainParams, batch: PackedBatch) -> LossFn:
    """Clipped value loss against the GAE `returns`, anchored at the pre-update `values`.

    The critic's engine (engines/training/value_model.py `ValueEngine`) calls this with the live
    per-token values V(tokens < t) in place of log-probs, and no entropy."""
    mask_all = batch["loss_mask"].float()
    norm = loss_normalizer(mask_all, batch.cu_seqlens, params.agg, max_tokens=_max_response_tokens(batch))

    def loss_fn(values: torch.Tensor, _entropy: torch.Tensor, mb: PackedBatch):
        mask = mb["loss_mask"].float()
        per_tok = value_loss(values, mb["values"].float(), mb["returns"].float(), mask, params.value_clip)
        loss = aggregate(per_tok, mask, mb.cu_seqlens, params.agg, norm)
        return loss, {"value_loss": float(loss.detach())}

    return loss_fn


def ppo_minibatches(num_seqs: int, n_minibatches: int, seed: int) -> list[list[int]]:
    """Sequence indices of each PPO minibatch: a seeded shuffle cut into near-equal parts.

    Why several optimizer steps per batch (AReaL's default is 4): after the first, the live
    policy differs from pi_prox, so the clipped ratio starts to bound each later step; with a
    single step per batch the ratio is exactly 1 and PPO's trust region never acts.
    """
    if n_minibatches < 1:
        raise ValueError(f"n_minibatches must be >= 1, got {n_minibatches}")
    if num_seqs < n_minibatches:
        raise ValueError(f"cannot cut {num_seqs} sequences into {n_minibatches} PPO minibatches; "
                         "lower ppo_minibatches or raise runtime.batch_size")
    order = torch.randperm(num_seqs, generator=torch.Generator().manual_seed(seed)).tolist()
    return [sorted(order[i::n_minibatches]) for i in range(n_minibatches)]


def build_loss_fn(params: TrainParams, batch: PackedBatch, fused_prox: bool = False,
                  policy_version: int | None = None) -> LossFn:
    if params.loss == "value":
        return critic_loss_fn(params, batch)
    return policy_loss_fn(params, batch, fused_prox, policy_version)
