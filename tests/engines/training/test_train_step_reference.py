"""One RL training step (decoupled PPO, fused proximal log-probs) against plain references.

- the engine's step (lean forward or HF rows, whole batch or split) gives the loss, grad norm
  and parameters of a straightforward computation: every sequence alone through the HF
  model, the decoupled PPO objective written out, torch's clip_grad_norm_ and AdamW;
- fused proximal log-probs give the same update as proximal log-probs computed by a
  separate `compute_logprobs` pass with the same weights.
"""

from __future__ import annotations

import copy

import pytest
import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.engines.training.train_engine import TrainEngine
from areal_graph.graph.kinds.losses import TrainParams
from areal_graph.nodes.train_loss import build_loss_fn
from support.batches import grpo_batch
from support.tiny_models import build_random_qwen2

PARAMS = TrainParams(loss="decoupled_ppo", behav_imp_cap=1.5, clip_eps=0.2)
LR, CLIP = 1e-3, 0.5


def rl_batch(model, seed=0) -> PackedBatch:
    """A GRPO-like batch with advantages and behaviour log-probs that differ from the policy's
    (stale data), so the behaviour weights vary and the cap drops some tokens."""
    batch = grpo_batch(seed=seed)
    g = torch.Generator().manual_seed(seed)
    mask = batch["loss_mask"].float()
    seq_adv = torch.randn(batch.num_seqs, generator=g)
    batch.tokens["advantages"] = seq_adv[batch.seq_ids()] * mask
    with torch.no_grad():
        lp = TrainEngine(copy.deepcopy(model), trainable=False).compute_logprobs(batch)
    batch.tokens["behav_logprobs"] = (lp + 0.3 * torch.randn(batch.num_tokens, generator=g)) * mask
    return batch


def reference_step(model, batch: PackedBatch) -> tuple[float, float]:
    """Each sequence alone through the HF model; the objective written out; clip; AdamW."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    mask_all = batch["loss_mask"] != 0
    n = float(mask_all.sum())
    loss = 0.0
    for i in range(batch.num_seqs):
        ids = batch.sequence(i, "input_ids")
        if ids.numel() < 2:
            continue
        logp = torch.log_softmax(model(input_ids=ids[None], use_cache=False).logits[0, :-1].float(), -1)
        lp = logp.gather(-1, ids[1:, None])[:, 0]
        mask = batch.sequence(i, "loss_mask")[1:] != 0
        adv = batch.sequence(i, "advantages")[1:]
        behav = batch.sequence(i, "behav_logprobs")[1:]
        ratio = torch.exp(lp - lp.detach())  # pi_prox is the policy of this very forward
        w = torch.exp(lp.detach() - behav)
        surrogate = torch.maximum(-ratio * adv, -torch.clamp(ratio, 0.8, 1.2) * adv)
        keep = mask & (w <= PARAMS.behav_imp_cap)
        loss = loss + torch.where(keep, w * surrogate, torch.zeros_like(surrogate)).sum() / n
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    return float(loss.detach()), float(norm)


def rel_diff(a: dict, b: dict) -> float:
    num = sum(float(((a[k] - b[k]).double() ** 2).sum()) for k in a) ** 0.5
    return num / sum(float((a[k].double() ** 2).sum()) for k in a) ** 0.5


@pytest.mark.parametrize("lean,budget", [(True, 10_000), (True, 60), (False, 10_000), (False, 60)])
def test_step_matches_an_unpacked_reference(lean, budget):
    base = build_random_qwen2(seed=7)
    batch = rl_batch(base)
    ref = copy.deepcopy(base)
    ref_loss, ref_norm = reference_step(ref, batch)
    engine = TrainEngine(copy.deepcopy(base), lr=LR, grad_clip=CLIP, lean=lean)
    stats = engine.train_step(batch, build_loss_fn(PARAMS, batch, fused_prox=True), max_tokens_per_mb=budget)
    assert (stats["n_microbatches"] == 1) == (budget > 1000)
    assert stats["capped_out"] > 0  # the cap acts on this batch
    assert abs(stats["loss"] - ref_loss) < 1e-6, (stats["loss"], ref_loss)
    assert abs(stats["grad_norm"] - ref_norm) / ref_norm < 1e-5
    init = base.state_dict()
    got, want = engine.model.state_dict(), ref.state_dict()
    # Adam's first step is ~lr * sign(g): compare parameters and updates as norms (a gradient
    # at rounding level can flip one element's sign)
    assert rel_diff(want, got) < 1e-6
    assert rel_diff({k: want[k] - init[k] for k in init}, {k: got[k] - init[k] for k in init}) < 1e-4


@pytest.mark.parametrize("lean", [True, False])
def test_fused_prox_equals_a_separate_prox_forward(lean):
    base = build_random_qwen2(seed=8)
    batch = rl_batch(base, seed=1)
    budget = 120  # several micro-batches, the same for both passes
    fused = TrainEngine(copy.deepcopy(base), lr=LR, grad_clip=CLIP, lean=lean)
    s_fused = fused.train_step(batch, build_loss_fn(PARAMS, batch, fused_prox=True), max_tokens_per_mb=budget)
    separate = TrainEngine(copy.deepcopy(base), lr=LR, grad_clip=CLIP, lean=lean)
    with_prox = PackedBatch(batch.cu_seqlens, dict(batch.tokens))
    with_prox.tokens["prox_logprobs"] = separate.compute_logprobs(batch, max_tokens_per_mb=budget)
    s_sep = separate.train_step(with_prox, build_loss_fn(PARAMS, with_prox), max_tokens_per_mb=budget)
    assert s_fused["n_microbatches"] > 1
    for key in ("loss", "grad_norm", "behav_weight", "capped_out", "entropy"):
        assert abs(s_fused[key] - s_sep[key]) <= 1e-6 * max(1.0, abs(s_sep[key])), key
    a, b = fused.model.state_dict(), separate.model.state_dict()
    init = base.state_dict()
    assert rel_diff(b, a) < 1e-6
    assert rel_diff({k: b[k] - init[k] for k in init}, {k: a[k] - init[k] for k in init}) < 1e-5


def test_entropy_stat_is_the_token_mean_entropy_of_the_trained_tokens():
    base = build_random_qwen2(seed=9)
    batch = rl_batch(base, seed=2)
    engine = TrainEngine(copy.deepcopy(base), lr=0.0, grad_clip=0.0)
    stats = engine.train_step(batch, build_loss_fn(PARAMS, batch, fused_prox=True), max_tokens_per_mb=100)
    ent = []
    with torch.no_grad():
        for i in range(batch.num_seqs):
            ids = batch.sequence(i, "input_ids")
            logp = torch.log_softmax(base(input_ids=ids[None], use_cache=False).logits[0, :-1].double(), -1)
            h = -(logp.exp() * logp).sum(-1)
            ent.append(h[batch.sequence(i, "loss_mask")[1:] != 0])
    assert abs(stats["entropy"] - float(torch.cat(ent).mean())) < 1e-5
