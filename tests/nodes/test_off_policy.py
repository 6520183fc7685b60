"""Off-policy corrections, GSPO, CISPO and the mismatch stats vs plain-loop float64 references.

Every reference below is written from the papers' formulas (nodes/off_policy.py and
nodes/ppo_loss.py docstrings cite them), one token or one sequence at a time in Python
floats, never with the vectorised code under test.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_graph.api.corrections import DEFAULT_BOUNDS, CorrectionError, ISCorrection
from areal_graph.data.packed import PackedBatch, response_positions
from areal_graph.engines.training.step_stats import combine_pieces, mean_over_updates
from areal_graph.graph.kinds.losses import TrainParams
from areal_graph.nodes.off_policy import (
    accepted_tokens,
    behaviour_log_weight,
    corrected_weight,
    finish_mismatch_stats,
    mismatch_groups,
    mismatch_stats,
)
from areal_graph.nodes.ppo_loss import cispo_loss, gspo_loss
from areal_graph.nodes.train_loss import build_loss_fn, prepare_policy_batch
from support.paths import REPO

TOL = 1e-12


def packed(seed: int, lens: list[int], spread: float = 0.6):
    """Random packed tokens: the first 2 of each sequence are prompt (mask 0)."""
    g = torch.Generator().manual_seed(seed)
    n = sum(lens)
    lp = -torch.rand(n, generator=g, dtype=torch.float64) * 3
    prox = lp + torch.randn(n, generator=g, dtype=torch.float64) * spread * 0.3
    behav = prox + torch.randn(n, generator=g, dtype=torch.float64) * spread
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    cu = torch.tensor([0] + list(torch.cumsum(torch.tensor(lens), 0)), dtype=torch.int32)
    mask = torch.ones(n, dtype=torch.float64)
    for s in range(len(lens)):
        mask[int(cu[s]) : int(cu[s]) + 2] = 0
    return lp, prox, behav, adv, mask, cu


def seqs_of(cu):
    return [(int(cu[i]), int(cu[i + 1])) for i in range(cu.numel() - 1)]


# ----------------------------------------------------------------------------- corrections
@pytest.mark.parametrize("mode", ["none", "tis", "token_mask", "seq_mask", "icepop"])
def test_corrections_match_loop_reference(mode):
    lp, prox, behav, adv, mask, cu = packed(1, [9, 14, 5, 22, 11], spread=0.8)
    corr = ISCorrection.resolve(mode, None, None)
    if mode == "seq_mask":  # the default [0.999, 1.001] rejects every random sequence: a wider band tests both sides
        corr = ISCorrection.resolve(mode, 0.8, 1.25)
    log_w = behaviour_log_weight(prox, behav, mask)
    acc = accepted_tokens(corr, log_w, mask, cu)
    w, affected = corrected_weight(corr, log_w, acc.double())
    for a, b in seqs_of(cu):
        trained = [t for t in range(a, b) if mask[t]]
        geo = math.exp(sum(float(prox[t] - behav[t]) for t in trained) / len(trained))
        for t in range(a, b):
            raw = math.exp(float(prox[t]) - float(behav[t])) if mask[t] else 0.0
            keep, weight, touched = bool(mask[t]), raw, False
            if keep and mode == "tis" and raw > corr.high:
                weight, touched = corr.high, True
            if keep and mode == "token_mask" and not corr.low <= raw <= corr.high:
                keep, weight = False, 0.0
            if keep and mode == "seq_mask" and not corr.low <= geo <= corr.high:
                keep, weight = False, 0.0
            if keep and mode == "icepop" and not corr.low <= raw <= corr.high:
                weight, touched = 0.0, True
            assert bool(acc[t]) == keep, (mode, t)
            assert float(w[t]) == pytest.approx(weight, rel=TOL, abs=TOL), (mode, t)
            assert bool(affected[t]) == touched, (mode, t)
    if mode != "none":  # the random data exercise the correction
        assert bool(affected.any()) or bool((acc != (mask != 0)).any())


def test_bounds_are_decided_in_log_space_without_overflow():
    mask = torch.ones(3, dtype=torch.float64)
    log_w = torch.tensor([1000.0, -1000.0, 0.0], dtype=torch.float64)  # exp overflows, underflows
    for mode in ("token_mask", "icepop"):
        corr = ISCorrection.resolve(mode, None, None)
        acc = accepted_tokens(corr, log_w, mask, torch.tensor([0, 3]))
        w, affected = corrected_weight(corr, log_w, acc.double())
        assert torch.isfinite(w).all()
        assert float(w[2]) == 1.0
    w, affected = corrected_weight(ISCorrection.resolve("tis", None, 3.0), log_w, mask)
    assert w.tolist() == [3.0, 0.0, 1.0] and affected.tolist() == [True, False, False]


def test_correction_settings_are_checked_with_the_field_named():
    assert ISCorrection.resolve("icepop", None, None) == ISCorrection("icepop", *DEFAULT_BOUNDS["icepop"])
    cases = [
        (("tis", 0.5, None), "is_low"),
        (("none", None, 2.0), "is_high"),
        (("token_mask", 3.0, 2.0), "is_low"),
        (("bogus", None, None), "is_correction"),
        (("tis", None, 0.5), "is_high"),
    ]
    for args, field in cases:
        with pytest.raises(CorrectionError) as e:
            ISCorrection.resolve(*args)
        assert e.value.field == field


# ----------------------------------------------------------------------------- GSPO and CISPO
def ref_gspo(lp, prox, w, adv, mask, cu, eps, eps_high):
    """Per-token (loss, d total / d lp) of GSPO, one sequence at a time."""
    loss, grad = [0.0] * lp.numel(), [0.0] * lp.numel()
    for a, b in seqs_of(cu):
        trained = [t for t in range(a, b) if mask[t]]
        s = math.exp(sum(float(lp[t] - prox[t]) for t in trained) / len(trained))
        d_total_d_s = 0.0
        for t in trained:
            A = float(adv[t])
            s1, s2 = s * A, min(max(s, 1 - eps), 1 + eps_high) * A
            loss[t] = -float(w[t]) * min(s1, s2)
            if s1 <= s2:  # unclipped branch: d/ds of -w s A
                d_total_d_s += -float(w[t]) * A
        for t in trained:  # ds/dlp_t = s / n
            grad[t] = d_total_d_s * s / len(trained)
    return loss, grad


def test_gspo_matches_loop_reference_and_its_clip_binds():
    lp, prox, behav, adv, mask, cu = packed(2, [7, 12, 30, 9, 16], spread=0.2)
    lp = prox + torch.randn(lp.numel(), generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 1e-3
    w = torch.exp(behaviour_log_weight(prox, behav, mask))
    x = lp.clone().requires_grad_(True)
    loss, stats = gspo_loss(x, prox, w, adv, mask, cu, clip_eps=3e-4, eps_high=4e-4)
    loss.sum().backward()
    ref_l, ref_g = ref_gspo(lp, prox, w, adv, mask, cu, 3e-4, 4e-4)
    assert max(abs(float(loss.detach()[t]) - ref_l[t]) for t in range(lp.numel())) < TOL
    assert max(abs(float(x.grad[t]) - ref_g[t]) for t in range(lp.numel())) < TOL
    assert bool(stats["clipped"].any()) and not bool(stats["clipped"].all())
    assert torch.all(x.grad[mask == 0] == 0)


def test_gspo_gradient_matches_finite_differences():
    lp, prox, behav, adv, mask, cu = packed(4, [6, 9, 8], spread=0.2)
    lp = prox + 0.01 * torch.randn(lp.numel(), generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    w = torch.exp(behaviour_log_weight(prox, behav, mask))

    def total(x):
        return gspo_loss(x, prox, w, adv, mask, cu, clip_eps=0.2)[0].sum()

    x = lp.clone().requires_grad_(True)
    total(x).backward()
    h = 1e-6
    for t in range(lp.numel()):
        e = torch.zeros_like(lp)
        e[t] = h
        fd = (float(total(lp + e)) - float(total(lp - e))) / (2 * h)
        assert float(x.grad[t]) == pytest.approx(fd, abs=1e-7), t


def test_cispo_matches_loop_reference():
    lp, prox, behav, adv, mask, cu = packed(6, [10, 20, 15], spread=0.5)
    lp = prox + torch.randn(lp.numel(), generator=torch.Generator().manual_seed(7), dtype=torch.float64) * 0.4
    w = torch.exp(behaviour_log_weight(prox, behav, mask))
    x = lp.clone().requires_grad_(True)
    loss, stats = cispo_loss(x, prox, w, adv, mask, clip_eps=0.2, eps_high=0.28)
    loss.sum().backward()
    worst_l = worst_g = 0.0
    for t in range(lp.numel()):
        if not mask[t]:
            ref_l = ref_g = 0.0
        else:
            r = math.exp(float(lp[t] - prox[t]))
            coef = min(max(r, 0.8), 1.28)
            ref_l = -float(w[t]) * coef * float(adv[t]) * float(lp[t])
            ref_g = -float(w[t]) * coef * float(adv[t])  # the weight is a constant: a policy gradient
        worst_l = max(worst_l, abs(float(loss.detach()[t]) - ref_l))
        worst_g = max(worst_g, abs(float(x.grad[t]) - ref_g))
    assert worst_l < TOL and worst_g < TOL
    assert bool(stats["clipped"].any())
    # unlike PPO's clip, a clipped token keeps its gradient
    assert torch.all(x.grad[stats["clipped"]] != 0)


# ----------------------------------------------------------------------------- mismatch stats
def test_response_positions_count_generated_tokens_per_sequence():
    mask = torch.tensor([0, 0, 1, 1, 1, 0, 1, 1, 0, 1])
    cu = torch.tensor([0, 5, 8, 10])
    pos = response_positions(mask, cu)
    assert pos[mask.bool()].tolist() == [0, 1, 2, 0, 1, 0]


def ref_mismatch(prox, behav, mask, versions, policy_version):
    out = {}
    d = [float(prox[t] - behav[t]) for t in range(prox.numel())]
    groups = {"all": [t for t in range(len(d)) if mask[t]]}
    groups["fresh"] = [t for t in groups["all"] if policy_version - int(versions[t]) == 0]
    groups["stale"] = [t for t in groups["all"] if policy_version - int(versions[t]) > 0]
    for g, toks in groups.items():
        n = max(len(toks), 1)
        out[f"mismatch/{g}/abs_mean"] = sum(abs(d[t]) for t in toks) / n
        out[f"mismatch/{g}/abs_max"] = max((abs(d[t]) for t in toks), default=0.0)
        out[f"mismatch/{g}/k3"] = sum(math.exp(d[t]) - 1 - d[t] for t in toks) / n
        out[f"mismatch/{g}/share"] = len(toks) / len(groups["all"])
        out[f"mismatch/{g}/past_tis"] = sum(math.exp(d[t]) > 2.0 for t in toks) / n
        out[f"mismatch/{g}/past_icepop"] = sum(not 0.5 <= math.exp(d[t]) <= 5.0 for t in toks) / n
    return out


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_mismatch_stats_match_reference_for_any_micro_batch_split(data):
    lens = data.draw(st.lists(st.integers(3, 20), min_size=2, max_size=8))
    lp, prox, behav, adv, mask, cu = packed(data.draw(st.integers(0, 10_000)), lens, spread=0.7)
    g = torch.Generator().manual_seed(len(lens))
    versions = torch.randint(3, 6, (prox.numel(),), generator=g)
    batch = PackedBatch(cu, {"prox": prox, "behav": behav, "loss_mask": mask, "versions": versions})
    totals = mismatch_groups(mask, cu, versions, 5)
    cut = data.draw(st.integers(1, len(lens)))
    parts = [list(range(cut)), list(range(cut, len(lens)))]
    pieces = []
    for idx in parts:
        if not idx:
            continue
        mb = batch.select(idx)
        log_w = behaviour_log_weight(mb["prox"], mb["behav"], mb["loss_mask"])
        pieces.append(mismatch_stats(log_w, mb["loss_mask"], mb.cu_seqlens, mb["versions"], 5, totals))
    got = finish_mismatch_stats(combine_pieces(pieces))
    for k, v in ref_mismatch(prox, behav, mask, versions, 5).items():
        assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
    assert got["mismatch/fresh/share"] + got["mismatch/stale/share"] == pytest.approx(1.0)
    assert "mismatch/pos/0-7/abs_mean" in got


def test_update_stats_average_but_maxima_stay_maxima():
    runs = [{"a": 1.0, "x_max": 3.0}, {"a": 3.0, "x_max": 1.0}]
    assert mean_over_updates(runs) == {"a": 2.0, "x_max": 3.0}
    assert combine_pieces(runs) == {"a": 4.0, "x_max": 3.0}


# ----------------------------------------------------------------------------- the train node's loss
def batch_for_loss(seed=11, spread=0.8):
    lp, prox, behav, adv, mask, cu = packed(seed, [12, 8, 15, 10], spread=spread)
    versions = torch.tensor([4 if i % 3 else 5 for i in range(prox.numel())])
    b = PackedBatch(
        cu,
        {
            "input_ids": torch.zeros(prox.numel(), dtype=torch.long),
            "loss_mask": mask,
            "behav_logprobs": behav.float(),
            "prox_logprobs": prox.float(),
            "advantages": adv.float(),
            "versions": versions,
        },
    )
    return b, prox.float()


@pytest.mark.parametrize("mode,in_norm", [("token_mask", False), ("icepop", True)])
def test_rejected_tokens_leave_the_normaliser_but_icepop_keeps_them(mode, in_norm):
    b, prox = batch_for_loss()
    params = TrainParams(loss="decoupled_ppo", is_correction=mode)
    prepared = prepare_policy_batch(params, b)
    loss_fn = build_loss_fn(params, prepared, policy_version=5)
    lp = prox.clone()  # r = 1: loss_t = -w_t A_t on the tokens that count
    loss, stats = loss_fn(lp, torch.zeros_like(lp), prepared)
    mask = b["loss_mask"].bool()
    w = torch.exp(b["prox_logprobs"].double() - b["behav_logprobs"].double())
    lo, hi = DEFAULT_BOUNDS[mode]
    inside = mask & (w >= lo) & (w <= hi)
    assert 0 < int(inside.sum()) < int(mask.sum())
    numer = float((-(w * b["advantages"].double()))[inside].sum())
    denom = float(mask.sum()) if in_norm else float(inside.sum())
    assert float(loss) == pytest.approx(numer / denom, rel=1e-6)
    if mode == "token_mask":
        assert stats["is_rejected"] == pytest.approx(1 - float(inside.sum()) / float(mask.sum()))
    else:
        assert stats["is_corrected"] == pytest.approx(1 - float(inside.sum()) / float(mask.sum()), rel=1e-6)
    assert stats["mismatch/all/abs_max"] == pytest.approx(float((w.log().abs())[mask].max()), rel=1e-5)
    assert stats["mismatch/fresh/share"] + stats["mismatch/stale/share"] == pytest.approx(1.0)


def test_rejecting_correction_refuses_fused_prox():
    b, _ = batch_for_loss()
    with pytest.raises(ValueError, match="before the step"):
        build_loss_fn(TrainParams(is_correction="seq_mask"), b, fused_prox=True)


# ----------------------------------------------------------------------------- the graph
def _plan(*overrides: str):

    from areal_graph.graph.loader import load_workflow
    from areal_graph.graph.plan import build_plan

    return build_plan(load_workflow(REPO / "workflows" / "ppo_async.yaml", overrides))


@pytest.mark.parametrize("mode,fused", [("tis", True), ("icepop", True), ("token_mask", False), ("seq_mask", False)])
def test_only_rejecting_corrections_give_up_the_fused_proximal_forward(mode, fused):
    plan = _plan(f"nodes.train.is_correction={mode}")
    assert (plan.fused == {"prox_logp": "train"}) == fused
    assert "versions" not in plan.reads("train")  # given as an optional read, not declared


@pytest.mark.parametrize("loss", ["gspo", "cispo"])
def test_new_losses_fuse_like_decoupled_ppo(loss):
    assert _plan(f"nodes.train.loss={loss}").fused == {"prox_logp": "train"}


@pytest.mark.parametrize(
    "overrides,field,words",
    [
        (("nodes.train.loss=ppo", "nodes.train.is_correction=tis"), "is_correction", "decoupled_ppo"),
        (("nodes.train.is_correction=tis", "nodes.train.is_low=0.5"), "is_low", "only an upper bound"),
        (("nodes.train.is_high=3.0",), "is_high", "without a correction"),
        (("nodes.train.loss=gspo", "nodes.train.dual_clip=3.0"), "dual_clip", "not built for loss 'gspo'"),
    ],
)
def test_corrections_where_they_cannot_act_are_errors_naming_node_and_field(overrides, field, words):
    from areal_graph.graph.loader import WorkflowError

    with pytest.raises(WorkflowError) as e:
        _plan(*overrides)
    text = str(e.value)
    assert "train" in text and field in text and words in text, text


# ----------------------------------------------------------------------------- the trace view
def test_mismatch_summary_folds_steps_into_windows_and_positions():
    from areal_graph.trace_analysis.mismatch_summary import mismatch_summary

    metrics = []
    for step in range(1, 17):
        stale_share = 0.0 if step <= 8 else 0.5
        m = {
            "step": step,
            "train/mismatch/all/abs_mean": 1e-6 + stale_share * 0.02,
            "train/mismatch/fresh/abs_mean": 1e-6,
            "train/mismatch/fresh/abs_max": 1e-5 * step,
            "train/mismatch/fresh/share": 1 - stale_share,
            "train/mismatch/stale/share": stale_share,
            "train/mismatch/stale/abs_mean": 0.04 if stale_share else 0.0,
            "train/mismatch/stale/abs_max": 0.5 if stale_share else 0.0,
            "train/mismatch/pos/0-7/abs_mean": 1e-6,
            "train/mismatch/pos/128+/abs_mean": 3e-6,
            "train/mismatch/pos/8-15/abs_mean": 2e-6,
        }
        metrics.append(m)
    metrics.append({"step": 16, "eval/accuracy": 0.5})  # an eval line carries no mismatch
    mm = mismatch_summary(metrics)
    assert mm["node"] == "train" and mm["steps"] == 16 and len(mm["windows"]) == 8
    assert mm["windows"][0]["first"] == 1 and mm["windows"][-1]["last"] == 16
    assert mm["overall"]["fresh"]["abs_max"] == pytest.approx(1.6e-4)
    assert mm["overall"]["stale"]["abs_mean"] == pytest.approx(0.04)  # only the steps that had stale tokens
    assert mm["overall"]["stale"]["share"] == pytest.approx(0.25)
    assert mm["windows"][0]["stale"]["abs_mean"] is None
    assert list(mm["positions"]) == ["0-7", "8-15", "128+"]
    assert "float rounding" in mm["verdict"] and "40000x" in mm["verdict"]
    assert mismatch_summary([{"step": 1}])["note"].startswith("no mismatch recorded")


@pytest.mark.parametrize("loss", ["gspo", "cispo"])
def test_new_losses_through_the_train_node_drop_capped_tokens_and_report_the_weight(loss):
    b, prox = batch_for_loss(seed=13, spread=1.0)
    params = TrainParams(loss=loss, behav_imp_cap=2.0, agg="seq-mean-token-mean")
    loss_fn = build_loss_fn(params, b, policy_version=5)
    lp = (prox + 0.01).clone().requires_grad_(True)
    value, stats = loss_fn(lp, torch.zeros_like(lp), b)
    value.backward()
    w = torch.exp(b["prox_logprobs"].double() - b["behav_logprobs"].double())
    mask = b["loss_mask"].bool()
    capped = mask & (w > 2.0)
    assert bool(capped.any())
    assert stats["capped_out"] == pytest.approx(float(capped.sum()) / float(mask.sum()), rel=1e-6)
    assert stats["behav_weight"] == pytest.approx(float(w[mask].mean()), rel=1e-5)
    if loss == "cispo":  # a per-token loss: capped tokens get no gradient, the others do
        assert torch.all(lp.grad[capped] == 0) and torch.all(lp.grad[mask & ~capped] != 0)


def test_naive_ppo_trains_with_weight_one_but_still_reports_the_mismatch():
    b, prox = batch_for_loss(seed=17)
    params = TrainParams(loss="ppo")
    mask = b["loss_mask"].bool()
    gap = (b["prox_logprobs"].double() - b["behav_logprobs"].double()).abs()[mask]
    _, stats = build_loss_fn(params, b, policy_version=5)(prox.clone(), torch.zeros_like(prox), b)
    assert stats["behav_weight"] == pytest.approx(1.0)
    assert stats["mismatch/all/abs_mean"] == pytest.approx(float(gap.mean()), rel=1e-5)
    no_prox = PackedBatch(b.cu_seqlens, {k: v for k, v in b.tokens.items() if k != "prox_logprobs"})
    lp = b["prox_logprobs"].clone()  # the training forward's own log-probs stand in for pi_prox
    _, stats = build_loss_fn(params, no_prox, policy_version=5)(lp, torch.zeros_like(lp), no_prox)
    assert stats["mismatch/all/abs_mean"] == pytest.approx(float(gap.mean()), rel=1e-5)
