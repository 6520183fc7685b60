"""The train node's loss: builds the callback the training engine applies to each micro-batch.

The engine sums micro-batch losses (and gradients across data-parallel ranks). To make the
result independent of how the batch was split, every normaliser is computed here, once, over
the whole batch, and each micro-batch returns only its share of the batch loss.

Fused proximal log-probs (`fused_prox`): when a step makes exactly one optimizer update,
the weights of the training forward are the proximal policy itself, so pi_prox is the
forward's own log-probs, detached: the ratio pi_theta / pi_prox is 1 in value with the
gradient of pi_theta, and the behaviour weight pi_prox / pi_behav is exactly what a
separate forward pass would have given (the plan decides; graph/kinds/model.py
`fused_prox_node`).

Which loss does what is one table, `LOSSES` in graph/kinds/losses.py: each entry names the
function here that computes its per-token terms (`clipped_ratio_terms`, `gspo_terms`,
`cispo_terms`, `value_terms`), called with the loss's parameters and a `PolicyTerms` or
`CriticTerms`; the callbacks below compute everything around them (normalisers, corrections,
stats) the same way for every loss.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from areal_graph.api.corrections import ISCorrection
from areal_graph.api.imports import import_object
from areal_graph.data.packed import PackedBatch
from areal_graph.engines.training.protocol import LossFn
from areal_graph.graph.kinds.losses import LOSSES, PROX_LOSSES, Loss, TrainParams
from areal_graph.nodes.off_policy import (
    accepted_tokens,
    behaviour_log_weight,
    corrected_weight,
    mismatch_groups,
    mismatch_stats,
)
from areal_graph.nodes.ppo_loss import aggregate, cispo_loss, decoupled_ppo_loss, gspo_loss, loss_normalizer, value_loss


def required_keys(params: TrainParams, fused_prox: bool = False) -> tuple[str, ...]:
    """Keys the loss reads from the batch (its LOSSES entry, shared with validation)."""
    return tuple(k for k in LOSSES[params.loss].reads if not (fused_prox and k == "prox_logprobs"))


@dataclass(frozen=True)
class PolicyTerms:
    """What a policy loss's function is given, per token of one micro-batch."""

    logprobs: torch.Tensor  # pi_theta, with gradient
    prox: torch.Tensor  # pi_prox (pi_behav for a loss without a proximal policy)
    behav: torch.Tensor  # pi_behav
    log_w: torch.Tensor  # log of the behaviour weight pi_prox / pi_behav, uncorrected
    weight: torch.Tensor  # the behaviour weight after `is_correction`
    corrected: bool  # is_correction is on (else `weight` is exp(log_w))
    advantages: torch.Tensor
    mask: torch.Tensor  # the tokens trained (float)
    cu_seqlens: torch.Tensor


@dataclass(frozen=True)
class CriticTerms:
    """What a critic loss's function is given, per token of one micro-batch."""

    values: torch.Tensor  # the live values V(tokens < t), with gradient
    old_values: torch.Tensor  # the pre-update values the batch carries
    returns: torch.Tensor
    mask: torch.Tensor
    cu_seqlens: torch.Tensor


TermsFn = Callable[[TrainParams, "PolicyTerms | CriticTerms"], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def loss_entry(params: TrainParams, role: str) -> Loss:
    loss = LOSSES[params.loss]
    if loss.role != role:
        raise ValueError(f"loss {params.loss!r} is a {loss.role} loss, not a {role} loss")
    return loss


@functools.cache
def terms_fn(name: str) -> TermsFn:
    """The per-token function of loss `name`, imported from the path its LOSSES entry names."""
    return import_object(LOSSES[name].fn, what=f"loss {name!r}")


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
        raise ValueError(
            f"is_correction {corr.mode!r} decides before the step and needs prox_logprobs in the batch "
            "(the plan does not fuse the proximal forward for it)"
        )
    mask = batch["loss_mask"]
    log_w = behaviour_log_weight(batch["prox_logprobs"].float(), batch["behav_logprobs"].float(), mask)
    accepted = accepted_tokens(corr, log_w, mask, batch.cu_seqlens)
    return PackedBatch(batch.cu_seqlens, {**batch.tokens, ACCEPTED: accepted}, dict(batch.seqs), dict(batch.meta))


def _trained(mb: PackedBatch) -> torch.Tensor:
    mask = mb["loss_mask"] != 0
    return mask & mb[ACCEPTED] if ACCEPTED in mb else mask


def policy_loss_fn(
    params: TrainParams, batch: PackedBatch, fused_prox: bool = False, policy_version: int | None = None
) -> LossFn:
    """A policy loss of LOSSES (decoupled PPO, GSPO, CISPO; standard PPO: pi_prox := pi_behav),
    with the behaviour weight corrected as `params.is_correction` says; every call also measures
    the train/inference mismatch (nodes/off_policy.py `mismatch_stats`): against pi_prox, or for
    `ppo` (which has none in its loss) against the batch's prox_logprobs when the graph computes
    them, else the training forward's own log-probs (exact on a step's first update)."""
    entry = loss_entry(params, "policy")
    terms = terms_fn(params.loss)
    if fused_prox and not entry.prox:
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
            prox = mb["prox_logprobs"].float() if entry.prox else behav
        log_w = behaviour_log_weight(prox, behav, generated)
        weight, corrected = corrected_weight(corr, log_w, mask)
        per_tok, tok_stats = terms(
            params,
            PolicyTerms(
                logprobs, prox, behav, log_w, weight, corr.mode != "none", mb["advantages"].float(), mask, mb.cu_seqlens
            ),
        )
        if corr.mode in ("tis", "icepop"):
            tok_stats["is_corrected"] = corrected
        loss = aggregate(per_tok, mask, mb.cu_seqlens, params.agg, norm)
        if params.entropy_coef:
            loss = loss - params.entropy_coef * aggregate(entropy, mask, mb.cu_seqlens, params.agg, norm)
        # Each stat is this micro-batch's share of a batch-level token mean, so the engine's sum
        # is right; all read out at once (one conversion, not one per stat).
        sums = (
            torch.stack(
                [(entropy.detach() * mask).sum()]
                + [(value.detach().float() * mask).sum() for value in tok_stats.values()]
            )
            / n_trained
        )
        stats = dict(zip(["entropy", *tok_stats], sums.tolist()))
        if corr.rejects:
            stats["is_rejected"] = float((generated & (mask == 0)).sum()) / n_generated
        stats["policy_loss"] = float(loss.detach())
        if not entry.prox:  # `ppo` trains with w = 1; the mismatch is still there to see
            trainer = mb["prox_logprobs"].float() if "prox_logprobs" in mb else logprobs.detach().float()
            log_w = behaviour_log_weight(trainer, behav, generated)
        stats.update(
            mismatch_stats(
                log_w, generated, mb.cu_seqlens, mb["versions"] if "versions" in mb else None, policy_version, groups
            )
        )
        return loss, stats

    return loss_fn


def clipped_ratio_terms(params: TrainParams, t: PolicyTerms) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """decoupled_ppo, and ppo (whose pi_prox is pi_behav): the clipped token ratio pi_theta / pi_prox."""
    return decoupled_ppo_loss(
        t.logprobs,
        t.prox,
        t.behav,
        t.advantages,
        t.mask,
        clip_eps=params.clip_eps,
        eps_high=params.eps_high,
        dual_clip=params.dual_clip,
        behav_imp_cap=params.behav_imp_cap,
        weight=t.weight if t.corrected else None,
    )


def _capped_weight(params: TrainParams, t: PolicyTerms) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The behaviour weight with tokens above `behav_imp_cap` at 0, as decoupled_ppo_loss does
    (such tokens train with weight 0), and which tokens those are."""
    if params.behav_imp_cap is None:
        return t.weight, None
    capped = (t.mask != 0) & (t.log_w > math.log(params.behav_imp_cap))
    return torch.where(capped, torch.zeros_like(t.weight), t.weight), capped


def _weight_stats(
    stats: dict[str, torch.Tensor], t: PolicyTerms, capped: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    stats["behav_weight"] = torch.exp(t.log_w)
    if capped is not None:
        stats["capped_out"] = capped
    return stats


def gspo_terms(params: TrainParams, t: PolicyTerms) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO: the ratio and its clip per sequence (nodes/ppo_loss.py `gspo_loss`)."""
    weight, capped = _capped_weight(params, t)
    per_tok, stats = gspo_loss(
        t.logprobs,
        t.prox,
        weight,
        t.advantages,
        t.mask,
        t.cu_seqlens,
        clip_eps=params.clip_eps,
        eps_high=params.eps_high,
    )
    return per_tok, _weight_stats(stats, t, capped)


def cispo_terms(params: TrainParams, t: PolicyTerms) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO: the clipped, constant importance weight (nodes/ppo_loss.py `cispo_loss`)."""
    weight, capped = _capped_weight(params, t)
    per_tok, stats = cispo_loss(
        t.logprobs, t.prox, weight, t.advantages, t.mask, clip_eps=params.clip_eps, eps_high=params.eps_high
    )
    return per_tok, _weight_stats(stats, t, capped)


def value_terms(params: TrainParams, t: CriticTerms) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped value loss (nodes/ppo_loss.py `value_loss`)."""
    return value_loss(t.values, t.old_values, t.returns, t.mask, params.value_clip), {}


def critic_loss_fn(params: TrainParams, batch: PackedBatch) -> LossFn:
    """Clipped value loss against the GAE `returns`, anchored at the pre-update `values`.

    The critic's engine (engines/training/value_model.py `ValueEngine`) calls this with the live
    per-token values V(tokens < t) in place of log-probs, and no entropy."""
    loss_entry(params, "critic")
    terms = terms_fn(params.loss)
    mask_all = batch["loss_mask"].float()
    norm = loss_normalizer(mask_all, batch.cu_seqlens, params.agg, max_tokens=_max_response_tokens(batch))

    def loss_fn(values: torch.Tensor, _entropy: torch.Tensor, mb: PackedBatch):
        mask = mb["loss_mask"].float()
        per_tok, _ = terms(
            params, CriticTerms(values, mb["values"].float(), mb["returns"].float(), mask, mb.cu_seqlens)
        )
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
        raise ValueError(
            f"cannot cut {num_seqs} sequences into {n_minibatches} PPO minibatches; "
            "lower ppo_minibatches or raise runtime.batch_size"
        )
    order = torch.randperm(num_seqs, generator=torch.Generator().manual_seed(seed)).tolist()
    return [sorted(order[i::n_minibatches]) for i in range(n_minibatches)]


def build_loss_fn(
    params: TrainParams, batch: PackedBatch, fused_prox: bool = False, policy_version: int | None = None
) -> LossFn:
    if LOSSES[params.loss].role == "critic":
        return critic_loss_fn(params, batch)
    return policy_loss_fn(params, batch, fused_prox, policy_version)
