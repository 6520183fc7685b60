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

from typing import Callable

import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.graph.node_kinds import TRAIN_REQUIRED_READS, TrainParams
from areal_graph.nodes.ppo_loss import aggregate, decoupled_ppo_loss, loss_normalizer, value_loss

LossFn = Callable[[torch.Tensor, torch.Tensor, PackedBatch], "tuple[torch.Tensor, dict[str, float]]"]


def required_keys(params: TrainParams, fused_prox: bool = False) -> tuple[str, ...]:
    """Keys the loss reads from the batch (one table, in graph/node_kinds.py, shared with validation)."""
    return tuple(k for k in TRAIN_REQUIRED_READS[params.loss] if not (fused_prox and k == "prox_logprobs"))


def _max_response_tokens(batch: PackedBatch) -> int:
    mask = batch["loss_mask"].to(torch.int64)
    per_seq = torch.zeros(batch.num_seqs, dtype=torch.int64).index_add_(0, batch.seq_ids(), mask)
    return max(int(per_seq.max()) if batch.num_seqs else 1, 1)


def policy_loss_fn(params: TrainParams, batch: PackedBatch, fused_prox: bool = False) -> LossFn:
    """Decoupled PPO (or standard PPO when `params.loss == "ppo"`: pi_prox := pi_behav)."""
    if fused_prox and params.loss != "decoupled_ppo":
        raise ValueError(f"fused proximal log-probs apply to the decoupled_ppo loss, not {params.loss!r}")
    mask_all = batch["loss_mask"].float()
    norm = loss_normalizer(mask_all, batch.cu_seqlens, params.agg, max_tokens=_max_response_tokens(batch))
    n_tokens = max(float(mask_all.sum()), 1.0)

    def loss_fn(logprobs: torch.Tensor, entropy: torch.Tensor, mb: PackedBatch):
        mask = mb["loss_mask"].float()
        behav = mb["behav_logprobs"].float()
        if fused_prox:
            prox = logprobs.detach().float()
        else:
            prox = mb["prox_logprobs"].float() if params.loss == "decoupled_ppo" else behav
        per_tok, tok_stats = decoupled_ppo_loss(
            logprobs, prox, behav, mb["advantages"].float(), mask,
            clip_eps=params.clip_eps, eps_high=params.eps_high,
            dual_clip=params.dual_clip, behav_imp_cap=params.behav_imp_cap,
        )
        loss = aggregate(per_tok, mask, mb.cu_seqlens, params.agg, norm)
        if params.entropy_coef:
            loss = loss - params.entropy_coef * aggregate(entropy, mask, mb.cu_seqlens, params.agg, norm)
        # Each stat is this micro-batch's share of a batch-level token mean, so the engine's sum
        # is right; all read out at once (one conversion, not one per stat).
        sums = torch.stack([(entropy.detach() * mask).sum()]
                           + [(value.detach().float() * mask).sum() for value in tok_stats.values()]) / n_tokens
        stats = dict(zip(["entropy", *tok_stats], sums.tolist()))
        stats["policy_loss"] = float(loss.detach())
        return loss, stats

    return loss_fn


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


def build_loss_fn(params: TrainParams, batch: PackedBatch, fused_prox: bool = False) -> LossFn:
    if params.loss == "value":
        return critic_loss_fn(params, batch)
    return policy_loss_fn(params, batch, fused_prox)
