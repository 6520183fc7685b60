"""The train and advantage nodes: glue between the packed batch and the pure math."""

from __future__ import annotations

import random

import pytest
import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.graph.kinds.functions import AdvantageParams
from areal_graph.graph.kinds.losses import LOSSES, Loss, TrainParams
from areal_graph.nodes.advantages import compute_advantages
from areal_graph.nodes.train_loss import build_loss_fn, required_keys, terms_fn


def random_batch(n_groups=3, group_size=4, seed=0) -> PackedBatch:
    rng = random.Random(seed)
    toks, mask, behav, prox, vers, gids, rewards = [], [], [], [], [], [], []
    for g in range(n_groups):
        for _ in range(group_size):
            p, r = rng.randint(2, 6), rng.randint(1, 9)
            toks.append([rng.randint(3, 50) for _ in range(p + r)])
            mask.append([0] * p + [1] * r)
            behav.append([0.0] * p + [-rng.uniform(0.1, 3) for _ in range(r)])
            prox.append([0.0] * p + [b + rng.uniform(-0.3, 0.3) for b in behav[-1][p:]])
            vers.append([-1] * p + [0] * r)
            gids.append(g)
            rewards.append(float(rng.random() < 0.5))
    return PackedBatch.from_sequences(
        {"input_ids": toks, "loss_mask": mask, "behav_logprobs": behav, "prox_logprobs": prox, "versions": vers},
        seqs={"group_id": gids, "rewards": rewards},
        dtypes={"behav_logprobs": torch.float32, "prox_logprobs": torch.float32},
    )


def test_grpo_advantages_are_group_baselined_and_only_on_generated_tokens():
    b = random_batch()
    out = compute_advantages(AdvantageParams(estimator="grpo", normalize=False, group_std=False), b)
    adv = out["advantages"]
    assert torch.all(adv[b["loss_mask"] == 0] == 0)
    for i in range(b.num_seqs):
        g = int(b["group_id"][i])
        group = b["rewards"][b["group_id"] == g]
        expected = float(b["rewards"][i] - group.mean())
        seq_adv = b.sequence(i, "loss_mask").bool()
        vals = adv[b.cu_seqlens[i] : b.cu_seqlens[i + 1]][seq_adv]
        assert torch.allclose(vals, torch.full_like(vals, expected), atol=1e-6)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "dr-grpo"])
@pytest.mark.parametrize("loss", ["decoupled_ppo", "ppo"])
def test_loss_over_any_microbatch_split_equals_the_full_batch(agg, loss):
    b = random_batch(seed=1)
    b.update(compute_advantages(AdvantageParams(), b))
    logp = b["prox_logprobs"] + 0.1 * torch.randn(b.num_tokens, generator=torch.Generator().manual_seed(0))
    params = TrainParams(loss=loss, agg=agg, clip_eps=0.2, behav_imp_cap=3.0)
    loss_fn = build_loss_fn(params, b)

    def total(split):
        x = logp.clone().requires_grad_(True)
        acc = torch.zeros(())
        for idx in split:
            mb = b.select(idx)
            token_index = torch.cat([torch.arange(int(b.cu_seqlens[i]), int(b.cu_seqlens[i + 1])) for i in idx])
            mb_loss, _ = loss_fn(x[token_index], torch.zeros(len(token_index)), mb)
            acc = acc + mb_loss
        acc.backward()
        return acc.detach(), x.grad

    whole, g_whole = total([list(range(b.num_seqs))])
    order = list(range(b.num_seqs))
    random.Random(5).shuffle(order)
    parts, g_parts = total([order[:3], order[3:7], order[7:]])
    assert torch.allclose(whole, parts, atol=1e-6)
    assert torch.allclose(g_whole, g_parts, atol=1e-7)
    assert whole.abs() > 0


@pytest.mark.parametrize("name", list(LOSSES))
def test_every_loss_resolves_to_its_function_and_reads_what_its_entry_says(name):
    assert callable(terms_fn(name))
    assert required_keys(TrainParams(loss=name)) == LOSSES[name].reads
    fused = required_keys(TrainParams(loss=name), fused_prox=True)
    assert "prox_logprobs" not in fused and set(fused) <= set(LOSSES[name].reads)


def test_a_new_loss_is_one_entry_and_its_function(monkeypatch):
    """An entry naming a function is all the trainer needs: here a copy of cispo's under another
    name trains exactly as cispo does."""
    monkeypatch.setitem(
        LOSSES,
        "cispo_again",
        Loss("cispo_again", "cispo once more", "policy", LOSSES["cispo"].reads, LOSSES["cispo"].fn, prox=True),
    )
    b = random_batch(seed=2)
    b.update(compute_advantages(AdvantageParams(), b))
    logp = b["prox_logprobs"] + 0.1 * torch.randn(b.num_tokens, generator=torch.Generator().manual_seed(1))
    out = {}
    for name in ("cispo", "cispo_again"):
        loss, stats = build_loss_fn(TrainParams(loss=name, behav_imp_cap=3.0), b)(logp, torch.zeros(b.num_tokens), b)
        out[name] = (float(loss), stats)
    terms_fn.cache_clear()
    assert out["cispo"] == out["cispo_again"] and out["cispo"][0] != 0


def test_ppo_minibatches_partition_every_sequence_once_and_are_seeded():
    from areal_graph.nodes.train_loss import ppo_minibatches

    parts = ppo_minibatches(10, 3, seed=4)
    assert sorted(i for p in parts for i in p) == list(range(10))
    assert sorted(len(p) for p in parts) == [3, 3, 4]
    assert parts == ppo_minibatches(10, 3, seed=4) and parts != ppo_minibatches(10, 3, seed=5)
    with pytest.raises(ValueError, match="ppo_minibatches"):
        ppo_minibatches(2, 3, seed=0)


def test_worker_takes_one_optimizer_step_per_ppo_minibatch(tiny_model_dir):
    """ppo_minibatches=2, ppo_epochs=2: four steps, each exactly a train_step on its share."""
    from areal_graph.nodes.train_loss import ppo_minibatches
    from areal_graph.runtime.hosts.model_host import ModelHost

    b = random_batch(seed=2)
    b.update(compute_advantages(AdvantageParams(), b))
    params = TrainParams(ppo_minibatches=2, ppo_epochs=2)
    optim = {"lr": 1e-3}
    worker = ModelHost(str(tiny_model_dir), optim=optim, total_steps=5, role="policy")
    reference = ModelHost(str(tiny_model_dir), optim=optim, total_steps=5, role="policy")
    _, stats = worker.train(b, vars(params), max_tokens_per_mb=4096)
    assert worker.engine.version == 4 and stats["updates"] == 4.0
    assert stats["tokens"] == 2 * b.num_tokens
    for epoch in range(2):
        for part in ppo_minibatches(b.num_seqs, 2, seed=reference.engine.version * 1009 + epoch):
            mb = b.select(part)
            reference.engine.train_step(mb, build_loss_fn(params, mb), max_tokens_per_mb=4096)
    for p, q in zip(worker.engine.model.parameters(), reference.engine.model.parameters()):
        assert torch.equal(p, q)
    before = [p.detach().clone() for p in ModelHost(str(tiny_model_dir), role="policy").engine.model.parameters()]
    assert any(not torch.equal(p, q) for p, q in zip(worker.engine.model.parameters(), before))
