"""perfmodel/cluster.py: first-principles costs (the roofline terms come out as computed by hand),
the H200 calibration reproduces the steps it came from, and a small cluster run shows what the
paper shows qualitatively: asynchronous beats synchronous on a long tail on the same GPUs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from areal_graph.perfmodel.cluster import GPUS, MODELS, PRODUCTION, ClusterRun, cluster_costs, h200_measured, \
    long_tail_lengths, speedup


def test_a_decode_step_costs_what_the_roofline_says():
    model, gpu = MODELS["7B"], GPUS["H800"]
    costs = cluster_costs(model, gpu, PRODUCTION, tp=1, train_gpus=8, lengths=long_tail_lengths(100, 50, 0.3, 0.3, 4))
    weights_ms = 2 * 7.62e9 / (3.35e12 * 0.6) * 1e3
    assert costs.decode_ms.predict(rows=1, rows_x_width_k=0) == pytest.approx(0.4 + weights_ms + 2 * 7.62e9 / (989e12 * 0.5) * 1e3)
    kv = 2 * 28 * 4 * 128 * 2
    assert costs.decode_ms.coef[2] == pytest.approx(1e3 * kv / (3.35e12 * 0.6) * 1e3)
    assert costs.model_calls["train"].coef[1] == pytest.approx(1e3 * 8 * 7.62e9 / (989e12 * 0.4 * 8))


def test_the_h200_calibration_reproduces_its_own_steps():
    eff = h200_measured()
    costs = cluster_costs(MODELS["0.5B"], GPUS["H200"], eff, 1, 1, long_tail_lengths(100, 50, 0.3, 0.3, 4))
    for batch, ms in ((1, 2.18), (256, 4.07)):
        assert costs.decode_ms.predict(rows=batch, rows_x_width_k=batch * 192 / 1e3) == pytest.approx(ms, rel=0.02)
    assert 0 < eff.mem_eff < 0.5 and eff.train_mfu == 0.19


def test_on_a_long_tail_asynchrony_wins_on_the_same_gpus():
    run = ClusterRun(model="1.5B", gpus=16, batch_prompts=16, answers=8, max_tokens=8000, median_tokens=1500,
                     eta=4, steps=3, decode_chunk=64)
    r = speedup(run)
    assert r["speedup"] > 1.3 and 0 < r["staleness"] <= 4
    assert speedup(replace(run, max_tokens=1600, median_tokens=1500))["speedup"] < r["speedup"]
