"""perfmodel/cluster.py: first-principles costs (the roofline terms come out as computed by hand),
the H200 calibration reproduces the steps it came from, and a small cluster run shows what the
paper shows qualitatively: asynchronous beats synchronous on a long tail on the same GPUs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from areal_graph.perfmodel.cluster import (
    GPUS,
    MODELS,
    PRODUCTION,
    ClusterRun,
    cluster_costs,
    h200_measured,
    long_tail_lengths,
    on_gpu,
    speedup,
    with_train_mfu,
)


def test_a_decode_step_costs_what_the_roofline_says():
    model, gpu = MODELS["7B"], GPUS["H800"]
    costs = cluster_costs(model, gpu, PRODUCTION, tp=1, train_gpus=8, lengths=long_tail_lengths(100, 50, 0.3, 0.3, 4))
    weights_ms = 2 * 7.62e9 / (3.35e12 * 0.6) * 1e3
    assert costs.decode_ms.predict(rows=1, context_k=0) == pytest.approx(
        0.4 + weights_ms + 2 * 7.62e9 / (989e12 * 0.5) * 1e3
    )
    kv = 2 * 28 * 4 * 128 * 2
    assert costs.decode_ms.coef[2] == pytest.approx(1e3 * kv / (3.35e12 * 0.6) * 1e3)
    assert costs.model_calls["train"].coef[1] == pytest.approx(1e3 * 8 * 7.62e9 / (989e12 * 0.4 * 8))


def test_the_h200_calibration_reproduces_its_own_steps():
    eff = h200_measured()
    costs = cluster_costs(MODELS["0.5B"], GPUS["H200"], eff, 1, 1, long_tail_lengths(100, 50, 0.3, 0.3, 4))
    for batch, ms in ((1, 2.18), (256, 4.07)):
        assert costs.decode_ms.predict(rows=batch, context_k=batch * 192 / 1e3) == pytest.approx(ms, rel=0.02)
    assert 0 < eff.mem_eff < 0.5 and eff.train_mfu == 0.19


def test_on_a_long_tail_asynchrony_wins_until_training_bounds_both():
    """On AReaL's split, a synchronous step waits for its longest answer with the engines emptying,
    then for training; async keeps the engines full and trains meanwhile: several times faster.
    When training alone takes longer than generating (a hundredth of the efficiency), both wait for
    the trainer and the gain vanishes. Max staleness holds either way."""
    run = ClusterRun(
        model="1.5B",
        gpus=16,
        batch_prompts=16,
        answers=8,
        max_tokens=8000,
        median_tokens=1500,
        eta=4,
        steps=10,
        decode_chunk=64,
    )
    fast = speedup(replace(run, efficiency=with_train_mfu(PRODUCTION, 0.4)), colocated=False)
    slow = speedup(replace(run, efficiency=with_train_mfu(PRODUCTION, 0.002)), colocated=False)
    assert fast["speedup"] > 2.0 and fast["async_engine_busy"] > 0.9 > fast["sync_engine_busy"]
    assert slow["speedup"] < 1.15 and slow["async_trainer_busy"] > 0.95 and 0 < fast["staleness"] <= 4


def test_a_cpu_calibration_moved_to_a_gpu_keeps_its_workload_and_prices_forwards_per_layer():
    from areal_graph.perfmodel.cost_model import CostModel
    from support.paths import REPO

    cpu = CostModel.from_json((REPO / "benchmarks" / "reference" / "costs-longtail-2core.json").read_text())
    gpu = on_gpu(cpu, layers=4, eff=h200_measured(), train_step_s=0.07)
    assert gpu.lengths.groups == cpu.lengths.groups and gpu.sync_s == cpu.sync_s
    assert gpu.decode_ms.predict(rows=64, context_k=10) == pytest.approx(h200_measured().decode_overhead_ms * 4 / 24)
    assert gpu.model_calls["train"].predict(tokens_k=5) == 0.07 and not gpu.background_cpu
