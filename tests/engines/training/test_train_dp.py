"""Data parallelism: 2 CPU processes (gloo) step to the same parameters as 1 process.

Two real processes are spawned once and run both DDP and FSDP2 (FSDP2 runs on CPU with gloo
in fp32; bf16 applies on GPU only). Each rank starts from a *different* random model, so the
test also shows that rank 0's weights are broadcast. Two steps are taken: a 12-sequence PPO
batch split over ranks, micro-batches and forwards (rank 1 needs one forward fewer), then a
1-sequence batch that leaves rank 1 with nothing to do (its idle forwards/backwards must
keep the collectives in step). While the
children run, the parent computes the single-process references: one micro-batch, and the
planner's micro-batches.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from areal_graph.data.packed import PackedBatch
from areal_graph.engines.training.microbatch_planner import plan_microbatches
from areal_graph.engines.training.packed_scoring import row_forwards
from areal_graph.engines.training.train_engine import TrainEngine
from areal_graph.graph.kinds.losses import TrainParams
from areal_graph.nodes.train_loss import build_loss_fn
from areal_graph.runtime.launchers.local import free_port
from support.tiny_models import build_random_qwen2

WORLD = 2
BUDGET = 60  # tokens per micro-batch: several micro-batches per rank
PARAMS = TrainParams(loss="decoupled_ppo", clip_eps=0.2, eps_high=0.28, agg="seq-mean-token-mean")
ENGINE_ARGS = dict(lr=1e-3, grad_clip=0.5, weight_decay=0.01)
ROW_TOKENS = 24  # rows this short: several forwards per micro-batch, 6 on rank 0, 5 on rank 1


def ppo_batch(n: int, seed: int) -> PackedBatch:
    """Prompts and responses with behaviour/proximal log-probs near the random model's (~log 1/128)."""
    rng = random.Random(seed)
    toks, mask, behav, prox, adv = [], [], [], [], []
    for _ in range(n):
        p, r = rng.randint(2, 8), rng.randint(1, 32)
        toks.append([rng.randint(3, 127) for _ in range(p + r)])
        mask.append([0] * p + [1] * r)
        b = [-4.85 + rng.uniform(-0.4, 0.4) for _ in range(r)]
        behav.append([0.0] * p + b)
        prox.append([0.0] * p + [x + rng.uniform(-0.2, 0.2) for x in b])
        a = rng.gauss(0.0, 1.0)
        adv.append([0.0] * p + [a] * r)
    f32 = torch.float32
    return PackedBatch.from_sequences(
        {"input_ids": toks, "loss_mask": mask, "behav_logprobs": behav, "prox_logprobs": prox, "advantages": adv},
        dtypes={"behav_logprobs": f32, "prox_logprobs": f32, "advantages": f32},
    )


BATCHES = (ppo_batch(12, seed=7), ppo_batch(1, seed=8))


def run_steps(engine: TrainEngine, budget: int) -> dict:
    """compute_logprobs, then the two train steps; the weights after each step."""
    out = {"logprobs": engine.compute_logprobs(BATCHES[0], max_tokens_per_mb=budget), "stats": [], "weights": []}
    for batch in BATCHES:
        out["stats"].append(engine.train_step(batch, build_loss_fn(PARAMS, batch), max_tokens_per_mb=budget))
        out["weights"].append(engine.state_dict_for_sync())
    return out


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        for mode in ("ddp", "fsdp"):
            engine = TrainEngine(
                build_random_qwen2(seed=100 + rank), parallel=mode, row_tokens=ROW_TOKENS, **ENGINE_ARGS
            )
            result = run_steps(engine, BUDGET)
            engine.save_checkpoint(Path(out_dir) / f"ck_{mode}")
            if rank == 0:
                torch.save(result, Path(out_dir) / f"{mode}.pt")
    finally:
        dist.destroy_process_group()


def rel_diff(a: dict, b: dict) -> float:
    num = sum(float(((a[k] - b[k]).double() ** 2).sum()) for k in a) ** 0.5
    den = sum(float((a[k].double() ** 2).sum()) for k in a) ** 0.5
    return num / den


def single_process(budget: int, row_tokens: int) -> tuple[dict, TrainEngine]:
    engine = TrainEngine(build_random_qwen2(seed=100), parallel="none", row_tokens=row_tokens, **ENGINE_ARGS)
    return run_steps(engine, budget), engine


def test_two_cpu_processes_step_like_one(tmp_path):
    lens = BATCHES[0].seqlens().tolist()
    forwards = [
        sum(len(row_forwards([lens[i] for i in idx], ROW_TOKENS)) for idx in rank)
        for rank in plan_microbatches(lens, BUDGET, dp_size=WORLD)
    ]
    assert forwards[0] != forwards[1], forwards  # the idle padding of forwards is exercised
    ctx = mp.start_processes(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=False, start_method="spawn")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the children have the other core
    try:
        one_mb, _ = single_process(10_000, row_tokens=4096)  # one micro-batch, one forward
        planned, planned_engine = single_process(BUDGET, row_tokens=ROW_TOKENS)
    finally:
        torch.set_num_threads(threads)
        while not ctx.join():
            pass
    init = build_random_qwen2(seed=100).state_dict()
    assert one_mb["stats"][0]["n_forwards"] == 1 and planned["stats"][0]["n_microbatches"] >= 4
    for mode in ("ddp", "fsdp"):
        got = torch.load(tmp_path / f"{mode}.pt", weights_only=False)
        assert got["stats"][0]["n_microbatches"] >= 4, mode
        assert got["stats"][0]["n_forwards"] > got["stats"][0]["n_microbatches"], mode
        assert torch.allclose(got["logprobs"], planned["logprobs"], atol=1e-5), mode
        for ref in (one_mb, planned):
            for step in range(2):
                w, r = got["weights"][step], ref["weights"][step]
                assert set(w) <= set(r) and any("layers.1" in k for k in w), (mode, sorted(w))
                r = {k: r[k] for k in w}
                # Norms, not elements: Adam's first step is ~lr*sign(g), and float noise in a
                # near-zero gradient flips a sign (see test_train_engine.py).
                assert rel_diff(w, r) < 1e-5, (mode, step, rel_diff(w, r))
                update = rel_diff({k: w[k] - init[k] for k in w}, {k: r[k] - init[k] for k in w})
                assert update < 1e-4, (mode, step, update)
                for key in ("loss", "grad_norm", "policy_loss", "entropy", "ratio"):
                    a, b = got["stats"][step][key], ref["stats"][step][key]
                    assert abs(a - b) <= 1e-5 * max(abs(b), 1e-3), (mode, step, key, a, b)
        assert not torch.equal(got["weights"][0]["model.norm.weight"], init["model.norm.weight"])

        # a DP checkpoint resumes in a single process, optimizer state included
        resumed = TrainEngine(build_random_qwen2(seed=5), parallel="none", **ENGINE_ARGS)
        resumed.load_checkpoint(tmp_path / f"ck_{mode}")
        assert resumed.version == 2
        weights = resumed.state_dict_for_sync()
        assert rel_diff(got["weights"][1], {k: weights[k] for k in got["weights"][1]}) < 1e-7
        a_state, b_state = resumed.optimizer.state_dict()["state"], planned_engine.optimizer.state_dict()["state"]
        assert a_state.keys() == b_state.keys()
        for moment in ("exp_avg", "exp_avg_sq"):
            ma = {i: s[moment] for i, s in a_state.items()}
            mb = {i: s[moment] for i, s in b_state.items()}
            assert rel_diff(ma, mb) < 1e-4, (mode, moment, rel_diff(ma, mb))
