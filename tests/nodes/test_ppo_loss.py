"""Decoupled PPO loss, aggregation, value loss and KL estimators vs plain-loop float64 references."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_graph.data.packed import PackedBatch
from areal_graph.nodes.ppo_loss import aggregate, decoupled_ppo_loss, kl_penalty, loss_normalizer, value_loss


# ----------------------------------------------------------------------------- references
def ref_ppo_token(lp, prox, behav, adv, m, eps, eps_high, dual, cap):
    """(loss, d loss / d lp) for one token, written from docs/design.md, in float64."""
    if not m:
        return 0.0, 0.0
    r = math.exp(lp - prox)
    w = math.exp(prox - behav)
    if cap is not None and w > cap:
        return 0.0, 0.0
    s1 = r * adv
    s2 = min(max(r, 1 - eps), 1 + eps_high) * adv
    loss = -min(s1, s2)
    grad = 0.0 if s2 < s1 else -adv * r  # the clipped branch is constant in lp
    if dual is not None and adv < 0 and loss > -dual * adv:
        loss, grad = -dual * adv, 0.0
    return w * loss, w * grad


def random_tokens(n, seed, spread=0.5):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(n, generator=g, dtype=torch.float64) * 3
    prox = lp + torch.randn(n, generator=g, dtype=torch.float64) * spread
    behav = prox + torch.randn(n, generator=g, dtype=torch.float64) * spread
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    mask = (torch.rand(n, generator=g) > 0.3).to(torch.float64)
    return lp, prox, behav, adv, mask


CONFIGS = [
    dict(clip_eps=0.2, eps_high=None, dual_clip=None, behav_imp_cap=None),
    dict(clip_eps=0.2, eps_high=0.28, dual_clip=None, behav_imp_cap=None),
    dict(clip_eps=0.2, eps_high=None, dual_clip=3.0, behav_imp_cap=None),
    dict(clip_eps=0.1, eps_high=0.3, dual_clip=2.0, behav_imp_cap=1.5),
]


@pytest.mark.parametrize("cfg", CONFIGS)
def test_decoupled_loss_and_grad_match_loop_reference(cfg):
    lp, prox, behav, adv, mask = random_tokens(400, seed=1, spread=0.6)
    lp = lp.clone().requires_grad_(True)
    loss, stats = decoupled_ppo_loss(lp, prox, behav, adv, mask, **cfg)
    loss.sum().backward()
    eps_high = cfg["eps_high"] if cfg["eps_high"] is not None else cfg["clip_eps"]
    lp_vals = lp.detach()
    for t in range(400):
        ref_l, ref_g = ref_ppo_token(
            float(lp_vals[t]),
            float(prox[t]),
            float(behav[t]),
            float(adv[t]),
            bool(mask[t]),
            cfg["clip_eps"],
            eps_high,
            cfg["dual_clip"],
            cfg["behav_imp_cap"],
        )
        assert float(loss.detach()[t]) == pytest.approx(ref_l, rel=1e-12, abs=1e-12), t
        assert float(lp.grad[t]) == pytest.approx(ref_g, rel=1e-12, abs=1e-12), t
    # the interesting branches were all exercised
    assert bool(stats["clipped"].any())
    if cfg["dual_clip"]:
        assert bool(stats["dual_clipped"].any())
    if cfg["behav_imp_cap"]:
        assert bool(stats["capped_out"].any())
    assert torch.allclose(stats["ratio"][mask.bool()], torch.exp(lp - prox).detach()[mask.bool()])


def test_grad_matches_finite_differences():
    lp, prox, behav, adv, mask = random_tokens(60, seed=7, spread=0.3)
    lp = lp.clone().requires_grad_(True)

    def total(x):
        return decoupled_ppo_loss(x, prox, behav, adv, mask, clip_eps=0.2, dual_clip=3.0)[0].sum()

    total(lp).backward()
    h = 1e-6
    for t in range(60):
        e = torch.zeros(60, dtype=torch.float64)
        e[t] = h
        fd = (float(total(lp.detach() + e)) - float(total(lp.detach() - e))) / (2 * h)
        assert float(lp.grad[t]) == pytest.approx(fd, abs=1e-5), t


def test_reduces_to_standard_ppo_when_prox_equals_behav():
    lp, prox, _, adv, mask = random_tokens(300, seed=3)
    loss, stats = decoupled_ppo_loss(lp, prox, prox, adv, mask, behav_imp_cap=2.0)
    r = torch.exp(lp - prox)
    ppo = -torch.minimum(r * adv, torch.clamp(r, 0.8, 1.2) * adv) * mask
    assert torch.equal(stats["behav_weight"][mask.bool()], torch.ones(int(mask.sum()), dtype=torch.float64))
    assert torch.allclose(loss, ppo, rtol=0, atol=1e-15)


def test_masked_and_capped_tokens_get_exactly_zero_gradient():
    lp, prox, behav, adv, mask = random_tokens(200, seed=5, spread=1.0)
    lp = lp.clone()
    lp[mask == 0] = -float("inf")  # junk at prompt positions must not leak NaN into the gradient
    lp.requires_grad_(True)
    loss, stats = decoupled_ppo_loss(lp, prox, behav, adv, mask, behav_imp_cap=1.2)
    loss.sum().backward()
    dead = (mask == 0) | stats["capped_out"]
    assert bool(stats["capped_out"].any()) and bool((mask == 0).any())
    assert torch.all(lp.grad[dead] == 0)
    assert torch.all(loss[dead] == 0)
    assert torch.isfinite(lp.grad).all()
    assert bool((lp.grad[~dead] != 0).any())


def test_no_gradient_through_prox_or_behav():
    lp, prox, behav, adv, mask = random_tokens(50, seed=9)
    prox = prox.clone().requires_grad_(True)
    behav = behav.clone().requires_grad_(True)
    lp = lp.clone().requires_grad_(True)
    loss, _ = decoupled_ppo_loss(lp, prox, behav, adv, mask)
    loss.sum().backward()
    assert prox.grad is None and behav.grad is None


def test_bad_arguments_raise_clear_errors():
    x = torch.zeros(4)
    with pytest.raises(ValueError, match="dual_clip"):
        decoupled_ppo_loss(x, x, x, x, x, dual_clip=0.5)
    with pytest.raises(ValueError, match="shape"):
        decoupled_ppo_loss(x, x, x, torch.zeros(3), x)
    with pytest.raises(ValueError, match="aggregation mode"):
        loss_normalizer(x, torch.tensor([0, 4]), "mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="estimator"):
        kl_penalty(x, x, "k4")


# ----------------------------------------------------------------------------- aggregation
def ref_aggregate(per_token, mask, cu, mode, max_tokens=None):
    seqs = []
    for i in range(len(cu) - 1):
        vals = [float(per_token[t]) for t in range(cu[i], cu[i + 1]) if mask[t]]
        seqs.append(vals)
    if mode == "token-mean":
        n = sum(len(s) for s in seqs)
        return sum(sum(s) for s in seqs) / max(n, 1)
    if mode == "seq-mean-token-mean":
        means = [sum(s) / len(s) for s in seqs if s]
        return sum(means) / max(len(means), 1)
    mt = max_tokens if max_tokens is not None else max((len(s) for s in seqs), default=0)
    return sum(sum(s) for s in seqs) / max(len(seqs) * mt, 1)


@st.composite
def packed_batches(draw):
    n = draw(st.integers(1, 8))
    lens = draw(st.lists(st.integers(1, 12), min_size=n, max_size=n))
    total = sum(lens)
    mask = draw(st.lists(st.booleans(), min_size=total, max_size=total))
    vals = draw(st.lists(st.floats(-10, 10, allow_nan=False), min_size=total, max_size=total))
    perm = draw(st.permutations(list(range(n))))
    cuts = sorted(draw(st.sets(st.integers(1, max(n - 1, 1)), max_size=n - 1))) if n > 1 else []
    return lens, mask, vals, perm, cuts


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "dr-grpo"])
@settings(max_examples=60, deadline=None)
@given(data=packed_batches())
def test_aggregation_is_independent_of_micro_batch_split(mode, data):
    lens, mask, vals, perm, cuts = data
    batch = PackedBatch.from_sequences(
        {
            "loss_mask": [mask[sum(lens[:i]) : sum(lens[: i + 1])] for i in range(len(lens))],
            "v": [vals[sum(lens[:i]) : sum(lens[: i + 1])] for i in range(len(lens))],
        },
        dtypes={"loss_mask": torch.float64, "v": torch.float64},
    )
    cu = batch.cu_seqlens
    norm = loss_normalizer(batch["loss_mask"], cu, mode, max_tokens=None)
    full = float(aggregate(batch["v"], batch["loss_mask"], cu, mode, norm))
    ref = ref_aggregate(vals, mask, cu.tolist(), mode)
    assert full == pytest.approx(ref, rel=1e-9, abs=1e-9)
    bounds = [0, *cuts, len(perm)]
    total = 0.0
    for a, b in zip(bounds[:-1], bounds[1:]):
        mb = batch.select(perm[a:b])
        total += float(aggregate(mb["v"], mb["loss_mask"], mb.cu_seqlens, mode, norm))
    assert total == pytest.approx(full, rel=1e-9, abs=1e-9)


def test_dr_grpo_uses_given_max_tokens():
    mask = torch.tensor([1.0, 1, 0, 1])
    cu = torch.tensor([0, 2, 4])
    assert loss_normalizer(mask, cu, "dr-grpo", max_tokens=10) == 20.0
    assert loss_normalizer(mask, cu, "dr-grpo") == 4.0  # 2 seqs * longest response (2)
    assert loss_normalizer(torch.zeros(4), cu, "token-mean") == 1.0  # never divides by 0


# ----------------------------------------------------------------------------- value loss, KL
def test_value_loss_matches_loop():
    g = torch.Generator().manual_seed(0)
    v, old, ret = (torch.randn(100, generator=g, dtype=torch.float64) for _ in range(3))
    mask = (torch.rand(100, generator=g) > 0.3).double()
    for clip in (0.2, None):
        out = value_loss(v, old, ret, mask, clip)
        for t in range(100):
            if not mask[t]:
                assert float(out[t]) == 0.0
                continue
            e1 = (float(v[t]) - float(ret[t])) ** 2
            if clip is None:
                ref = 0.5 * e1
            else:
                vc = float(old[t]) + min(max(float(v[t]) - float(old[t]), -clip), clip)
                ref = 0.5 * max(e1, (vc - float(ret[t])) ** 2)
            assert float(out[t]) == pytest.approx(ref, rel=1e-12)


def test_kl_estimators_match_formulas_and_k3_is_unbiased():
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(50, generator=g, dtype=torch.float64) * 3
    ref = lp + torch.randn(50, generator=g, dtype=torch.float64) * 0.3
    for t in range(50):
        lr = float(ref[t]) - float(lp[t])
        assert float(kl_penalty(lp, ref, "k1")[t]) == pytest.approx(-lr, rel=1e-12)
        assert float(kl_penalty(lp, ref, "k2")[t]) == pytest.approx(0.5 * lr * lr, rel=1e-12)
        assert float(kl_penalty(lp, ref, "k3")[t]) == pytest.approx(math.exp(lr) - 1 - lr, rel=1e-9, abs=1e-15)
    assert bool((kl_penalty(lp, ref, "k3") >= 0).all())
    # Monte Carlo: E_pi[k1] and E_pi[k3] both equal KL(pi || ref) for two categoricals.
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    true_kl = float((p * (p / q).log()).sum())
    idx = torch.multinomial(p, 200_000, replacement=True, generator=g)
    for est in ("k1", "k3"):
        mc = float(kl_penalty(p.log()[idx], q.log()[idx], est).mean())
        assert mc == pytest.approx(true_kl, abs=5e-3)
