"""Advantage estimators vs plain-loop float64 references (loops over sequences and tokens)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_graph.nodes.advantages import (
    broadcast_to_tokens,
    gae,
    grpo_advantages,
    normalize_advantages,
    outcome_token_rewards,
    reinforce_returns,
    rloo_advantages,
)


# ----------------------------------------------------------------------------- references
def ref_gae(rewards, values, mask, cu, gamma, lam):
    adv = [0.0] * len(mask)
    ret = [0.0] * len(mask)
    for i in range(len(cu) - 1):
        steps = [t for t in range(cu[i], cu[i + 1]) if mask[t]]  # generated tokens only
        next_v, next_a = 0.0, 0.0
        for t in reversed(steps):
            delta = rewards[t] + gamma * next_v - values[t]
            a = delta + gamma * lam * next_a
            adv[t], ret[t] = a, a + values[t]
            next_v, next_a = values[t], a
    return adv, ret


def ref_reward_to_go(rewards, mask, cu, gamma):
    out = [0.0] * len(mask)
    for i in range(len(cu) - 1):
        g = 0.0
        for t in reversed(range(cu[i], cu[i + 1])):
            if mask[t]:
                g = rewards[t] + gamma * g
                out[t] = g
    return out


def random_packed(seed, n_seq=6, max_len=150, p_gen=0.7):
    """Sequences with a prompt, then generated tokens interleaved with loss_mask-0 spans."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, max_len, (n_seq,), generator=g)
    cu = torch.zeros(n_seq + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0)
    mask = (torch.rand(int(cu[-1]), generator=g) < p_gen).float()
    for i in range(n_seq):
        mask[int(cu[i]) : int(cu[i]) + min(3, int(lens[i]))] = 0  # a prompt
    rewards = torch.randn(int(cu[-1]), generator=g, dtype=torch.float64)
    values = torch.randn(int(cu[-1]), generator=g, dtype=torch.float64)
    return rewards, values, mask, cu


# ----------------------------------------------------------------------------- GAE
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.0, 0.5), (1.0, 0.9)])
def test_gae_skips_masked_spans_like_the_loop(gamma, lam):
    rewards, values, mask, cu = random_packed(seed=11, max_len=300)  # > one scan block
    adv, ret = gae(rewards, values, mask, cu, gamma, lam)
    ref_a, ref_r = ref_gae(rewards.tolist(), values.tolist(), mask.tolist(), cu.tolist(), gamma, lam)
    assert torch.allclose(adv, torch.tensor(ref_a, dtype=torch.float64), rtol=1e-10, atol=1e-10)
    assert torch.allclose(ret, torch.tensor(ref_r, dtype=torch.float64), rtol=1e-10, atol=1e-10)
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.integers(0, 20), min_size=1, max_size=6),
    seed=st.integers(0, 10_000),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
)
def test_gae_property_against_loop(lens, seed, gamma, lam):
    g = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0, *torch.cumsum(torch.tensor(lens), 0).tolist()], dtype=torch.int32)
    n = int(cu[-1])
    mask = (torch.rand(n, generator=g) < 0.6).float()
    rewards = torch.randn(n, generator=g, dtype=torch.float64)
    values = torch.randn(n, generator=g, dtype=torch.float64)
    adv, ret = gae(rewards, values, mask, cu, gamma, lam)
    ref_a, ref_r = ref_gae(rewards.tolist(), values.tolist(), mask.tolist(), cu.tolist(), gamma, lam)
    assert torch.allclose(adv, torch.tensor(ref_a, dtype=torch.float64), atol=1e-9)
    assert torch.allclose(ret, torch.tensor(ref_r, dtype=torch.float64), atol=1e-9)


def test_gae_with_gamma_lam_one_and_zero_values_is_reward_to_go():
    rewards, _, mask, cu = random_packed(seed=3)
    adv, ret = gae(rewards, torch.zeros_like(rewards), mask, cu, 1.0, 1.0)
    rtg = torch.tensor(ref_reward_to_go(rewards.tolist(), mask.tolist(), cu.tolist(), 1.0), dtype=torch.float64)
    assert torch.allclose(adv, rtg, atol=1e-10) and torch.allclose(ret, rtg, atol=1e-10)


def test_gae_keeps_float32_dtype_and_matches():
    rewards, values, mask, cu = random_packed(seed=4)
    adv, ret = gae(rewards.float(), values.float(), mask, cu, 0.99, 0.95)
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32
    ref_a, _ = ref_gae(
        rewards.float().double().tolist(), values.float().double().tolist(), mask.tolist(), cu.tolist(), 0.99, 0.95
    )
    assert torch.allclose(adv.double(), torch.tensor(ref_a, dtype=torch.float64), atol=1e-5)


def test_gae_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="values"):
        gae(torch.zeros(5), torch.zeros(4), torch.ones(5), torch.tensor([0, 5]), 1.0, 1.0)
    with pytest.raises(ValueError, match="cu_seqlens"):
        gae(torch.zeros(5), torch.zeros(5), torch.ones(5), torch.tensor([0, 4]), 1.0, 1.0)


# ----------------------------------------------------------------------------- REINFORCE, outcome rewards
@pytest.mark.parametrize("gamma", [1.0, 0.97, 0.5])
def test_reinforce_returns_match_loop(gamma):
    rewards, _, mask, cu = random_packed(seed=8, max_len=200)
    out = reinforce_returns(rewards, mask, cu, gamma)
    ref = torch.tensor(ref_reward_to_go(rewards.tolist(), mask.tolist(), cu.tolist(), gamma), dtype=torch.float64)
    assert torch.allclose(out, ref, atol=1e-10)


def test_outcome_token_rewards_put_reward_on_last_generated_token_minus_kl():
    # seq 0: prompt, gen, tool, gen, tool(last)  -> reward on index 3
    # seq 1: prompt only (no generated token)   -> nothing
    # seq 2: gen, gen                            -> reward on index 8
    mask = torch.tensor([0, 1, 0, 1, 0, 0, 0, 1, 1], dtype=torch.float32)
    cu = torch.tensor([0, 5, 7, 9])
    seq_r = torch.tensor([1.0, 5.0, -2.0])
    kl = torch.arange(9, dtype=torch.float32) / 10
    out = outcome_token_rewards(seq_r, mask, cu, kl=kl, kl_coef=0.5)
    expected = [0.0] * 9
    for i in range(3):
        gen = [t for t in range(int(cu[i]), int(cu[i + 1])) if mask[t]]
        for t in gen:
            expected[t] -= 0.5 * float(kl[t])
        if gen:
            expected[gen[-1]] += float(seq_r[i])
    assert torch.allclose(out, torch.tensor(expected), atol=1e-7)
    assert float(out[3]) == pytest.approx(1.0 - 0.5 * 0.3)


# ----------------------------------------------------------------------------- group estimators
def ref_grpo(rewards, groups, std_normalize, eps):
    out = []
    for r, gid in zip(rewards, groups):
        grp = [x for x, h in zip(rewards, groups) if h == gid]
        mean = sum(grp) / len(grp)
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / len(grp))
        out.append((r - mean) / (std + eps) if std_normalize else r - mean)
    return out


def ref_rloo(rewards, groups):
    out = []
    for i, (r, gid) in enumerate(zip(rewards, groups)):
        others = [x for j, (x, h) in enumerate(zip(rewards, groups)) if h == gid and j != i]
        out.append(r - sum(others) / len(others) if others else 0.0)
    return out


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(st.tuples(st.floats(-5, 5, allow_nan=False), st.integers(-3, 3)), min_size=1, max_size=30),
    std_normalize=st.booleans(),
)
def test_group_estimators_match_loop(data, std_normalize):
    rewards = torch.tensor([r for r, _ in data], dtype=torch.float64)
    groups = torch.tensor([gid for _, gid in data])
    got = grpo_advantages(rewards, groups, std_normalize=std_normalize)
    ref = ref_grpo(rewards.tolist(), groups.tolist(), std_normalize, 1e-6)
    assert torch.allclose(got, torch.tensor(ref, dtype=torch.float64), rtol=1e-9, atol=1e-9)
    got_rloo = rloo_advantages(rewards, groups)
    assert torch.allclose(
        got_rloo, torch.tensor(ref_rloo(rewards.tolist(), groups.tolist()), dtype=torch.float64), rtol=1e-9, atol=1e-9
    )


def test_grpo_binary_rewards_known_values():
    # group of 4 with rewards 1,0,0,0: mean .25, population std sqrt(3)/4
    adv = grpo_advantages(torch.tensor([1.0, 0, 0, 0, 1.0]), torch.tensor([7, 7, 7, 7, 9]), eps=0.0)
    s = math.sqrt(3) / 4
    assert adv[:4].tolist() == pytest.approx([0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s])
    assert float(adv[4]) == 0.0  # a group of one
    assert rloo_advantages(torch.tensor([1.0, 0, 0, 0]), torch.tensor([0, 0, 0, 0])).tolist() == pytest.approx(
        [1.0, -1 / 3, -1 / 3, -1 / 3]
    )


@pytest.mark.parametrize("value", [0.1, 0.7, 1 / 3, 2.2])
def test_grpo_equal_float64_rewards_give_zero_with_eps_zero(value):
    """The mean of three equal float64 rewards rounds (0.1 + 0.1 + 0.1 != 0.3): the centred
    values and the std are ~1e-17, and dividing them gave +-1. Equal rewards are no signal."""
    rewards = torch.tensor([value] * 3 + [0.0, 1.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1])
    for std_normalize in (True, False):
        adv = grpo_advantages(rewards, groups, std_normalize=std_normalize, eps=0.0)
        assert adv[:3].tolist() == [0.0, 0.0, 0.0]
    assert grpo_advantages(rewards, groups, eps=0.0)[3:].tolist() == [-1.0, 1.0]


# ----------------------------------------------------------------------------- helpers
def test_broadcast_and_normalize():
    mask = torch.tensor([0, 1, 1, 0, 1, 1, 1], dtype=torch.float32)
    cu = torch.tensor([0, 3, 7])
    tok = broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask, cu)
    assert tok.tolist() == [0, 2, 2, 0, -1, -1, -1]
    norm = normalize_advantages(tok, mask)
    sel = [2.0, 2, -1, -1, -1]
    mean = sum(sel) / 5
    std = math.sqrt(sum((x - mean) ** 2 for x in sel) / 5)
    expected = (
        [0.0] + [(x - mean) / (std + 1e-8) for x in sel[:2]] + [0.0] + [(x - mean) / (std + 1e-8) for x in sel[2:]]
    )
    assert norm.tolist() == pytest.approx(expected, rel=1e-6)
    assert normalize_advantages(tok, torch.zeros(7)).tolist() == [0.0] * 7
