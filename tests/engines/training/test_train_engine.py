"""The training engine: packed forward without leaks, split-independent steps, checkpoints."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.engines.training.packed_scoring import row_forwards
from areal_graph.engines.training.train_engine import TrainEngine
from support.batches import random_batch
from support.reference_logprobs import naive_logprobs, packed_logprobs
from support.tiny_models import build_random_qwen2


@pytest.mark.parametrize("row_tokens", [16, 64, 4096])
def test_packed_logprobs_equal_each_sequence_alone(row_tokens):
    model = build_random_qwen2()
    batch = random_batch()
    lp, _ = packed_logprobs(model, batch, row_tokens=row_tokens)
    ref = naive_logprobs(model, batch)
    assert torch.allclose(lp.double(), ref, atol=1e-4), (lp.double() - ref).abs().max()
    starts = batch.cu_seqlens[:-1].long()
    assert torch.all(lp[starts] == 0)


def test_entropy_and_temperature_match_the_loop_reference():
    model = build_random_qwen2()
    batch = random_batch(n=5, seed=11)
    with torch.no_grad():
        lp, ent = packed_logprobs(model, batch, row_tokens=24, with_entropy=True, temperature=0.7)
    ref_lp, ref_ent = naive_logprobs(model, batch, temperature=0.7, entropy=True)
    assert torch.allclose(lp.double(), ref_lp, atol=1e-4), (lp.double() - ref_lp).abs().max()
    assert torch.allclose(ent.double(), ref_ent, atol=1e-4), (ent.double() - ref_ent).abs().max()
    assert float(ent.max()) > 1.0  # a random model's next-token distributions are broad


def test_row_forwards_cover_every_sequence_once_in_few_forwards_of_similar_width():
    rng = random.Random(2)
    lens = [max(0, int(rng.lognormvariate(4.5, 1.0))) for _ in range(500)] + [0, 1]
    forwards = row_forwards(lens, 256)
    placed = sorted(i for f in forwards for row in f for i in row)
    assert placed == [i for i, n in enumerate(lens) if n > 0]  # zero-length: nothing to score
    for f in forwards:
        loads = [sum(lens[i] for i in row) for row in f]
        longest = [max(lens[i] for i in row) for row in f]
        if max(longest) <= 256:
            assert max(loads) <= 256  # the forward of packed short rows
        else:  # a long sequence per row, widths within the slack, fillers only in its padding
            assert all(n > 256 for n in longest) and max(loads) == max(longest)
            assert min(longest) * 1.25 >= max(longest)
            assert all(sum(1 for i in row if lens[i] > 256) == 1 for row in f)
    assert len(forwards) <= 12
    assert row_forwards(lens, 256) == forwards  # deterministic


def sum_logprob_loss(batch: PackedBatch):
    """A simple loss with a batch-level normaliser (as the train node builds them)."""
    total = float(batch["loss_mask"].sum())

    def loss_fn(lp, ent, mb):
        loss = -(lp * mb["loss_mask"].float()).sum() / total
        return loss, {"tok": float(mb["loss_mask"].sum()) / total}

    return loss_fn


def rel_diff(a: dict, b: dict) -> float:
    num = sum(float(((a[k] - b[k]).double() ** 2).sum()) for k in a) ** 0.5
    den = sum(float((a[k].double() ** 2).sum()) for k in a) ** 0.5
    return num / den


def step_params(max_tokens, batch, seed=0, row_tokens=256, lean=True):
    torch.manual_seed(seed)
    engine = TrainEngine(build_random_qwen2(), lr=1e-3, grad_clip=0.5, row_tokens=row_tokens, lean=lean)
    assert (engine._lean is not None) == lean
    stats = engine.train_step(batch, sum_logprob_loss(batch), max_tokens_per_mb=max_tokens)
    return {k: v.detach().clone() for k, v in engine.model.state_dict().items()}, stats


# lean: one pass per micro-batch; HF rows of 12 tokens: several forwards per micro-batch
@pytest.mark.parametrize("row_tokens,lean", [(256, True), (256, False), (12, False)])
def test_one_step_is_the_same_however_the_batch_is_split(row_tokens, lean):
    batch = random_batch(n=12, seed=3)
    whole, s1 = step_params(10_000, batch, lean=lean)
    split, s2 = step_params(60, batch, row_tokens=row_tokens, lean=lean)
    assert s1["n_microbatches"] == 1 and s2["n_microbatches"] > 3
    assert s1["n_forwards"] == 1
    if lean:
        assert s2["n_forwards"] == s2["n_microbatches"]
    else:
        assert s2["n_forwards"] >= (s2["n_microbatches"] if row_tokens > 100 else 8)
    assert abs(s1["tok"] - 1.0) < 1e-6 and abs(s2["tok"] - 1.0) < 1e-6  # stats summed over micro-batches
    assert abs(s1["grad_norm"] - s2["grad_norm"]) / s1["grad_norm"] < 1e-5
    init = build_random_qwen2().state_dict()
    # Adam's first step is ~lr*sign(g), so compare as norms: elementwise, float noise in
    # gradients ~1e-9 flips a sign. Parameters agree to ~1e-7 relative, updates to ~1e-5.
    diff = rel_diff(whole, split)
    update = rel_diff({k: whole[k] - init[k] for k in whole}, {k: split[k] - init[k] for k in whole})
    assert diff < 1e-5 and update < 1e-4, (diff, update)
    assert any(not torch.equal(init[k], whole[k]) for k in whole)  # the step did something


def test_grad_clipping_matches_torch_reference():
    batch = random_batch(n=6, seed=4)
    model = build_random_qwen2()
    ref = copy.deepcopy(model)
    engine = TrainEngine(model, lr=1e-2, grad_clip=0.1)
    stats = engine.train_step(batch, sum_logprob_loss(batch), 10_000)
    # reference: plain loop, full-batch loss, torch's clip and AdamW
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.0)
    lp = naive_logprobs(ref, batch)  # only for the value check below
    logits_loss = 0.0
    total = float(batch["loss_mask"].sum())
    for i in range(batch.num_seqs):
        ids = batch.sequence(i, "input_ids").unsqueeze(0)
        logp = torch.log_softmax(ref(input_ids=ids, use_cache=False).logits[0], -1)
        m = batch.sequence(i, "loss_mask")[1:].float()
        logits_loss = logits_loss - (logp[:-1].gather(-1, ids[0, 1:, None])[:, 0] * m).sum() / total
    logits_loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1)
    opt.step()
    assert abs(float(norm) - stats["grad_norm"]) / float(norm) < 1e-4
    assert abs(stats["loss"] - float(logits_loss.detach())) < 1e-4
    assert rel_diff(engine.model.state_dict(), ref.state_dict()) < 1e-5
    assert lp.numel() == batch.num_tokens


def test_checkpoint_resume_continues_identically(tmp_path):
    batch = random_batch(n=6, seed=5)
    a = TrainEngine(build_random_qwen2(), lr=1e-3)
    a.train_step(batch, sum_logprob_loss(batch), 10_000)
    a.save_checkpoint(tmp_path / "ck")
    b = TrainEngine(build_random_qwen2(seed=9), lr=1e-3)
    b.load_checkpoint(tmp_path / "ck")
    assert b.version == 1
    a.train_step(batch, sum_logprob_loss(batch), 10_000)
    b.train_step(batch, sum_logprob_loss(batch), 10_000)
    for (k, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.allclose(x, y, atol=1e-7), k


def test_export_loads_with_auto_class_and_gives_identical_logits(tmp_path):
    from transformers import AutoModelForCausalLM

    engine = TrainEngine(build_random_qwen2(), lr=1e-3)
    engine.export_hf(tmp_path / "w")
    engine.export_hf(tmp_path / "w")  # overwriting is atomic and allowed
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "w")
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, engine.model(ids).logits)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine's error")
def test_model_worker_on_cuda_without_a_gpu_is_a_clear_error():
    from areal_graph.runtime.hosts.model_host import ModelHost

    with pytest.raises(RuntimeError, match="no CUDA device.*device: cpu"):
        ModelHost("/nonexistent/model", device="cuda")


@pytest.mark.parametrize("lean", [True, False])
def test_bf16_mixed_precision_keeps_fp32_master_weights_and_tracks_the_fp32_step(lean):
    """mixed_precision=bf16 without FSDP: autocast computes in bf16, the weights, their
    gradients and Adam's moments stay fp32, and the step stays near the fp32 one."""
    batch = random_batch(n=8, seed=5)
    torch.manual_seed(0)
    fp32 = TrainEngine(build_random_qwen2(), lr=1e-3, lean=lean)
    torch.manual_seed(0)
    bf16 = TrainEngine(build_random_qwen2(), lr=1e-3, lean=lean, mixed_precision=torch.bfloat16)
    lp32 = fp32.compute_logprobs(batch)
    lp16 = bf16.compute_logprobs(batch)
    assert lp16.dtype == torch.float32
    gap = float((lp16 - lp32).abs().max())
    assert 0 < gap < 0.05, gap  # bf16 products (8 mantissa bits) differ, but not by much
    s32 = fp32.train_step(batch, sum_logprob_loss(batch))
    s16 = bf16.train_step(batch, sum_logprob_loss(batch))
    assert abs(s16["loss"] - s32["loss"]) / abs(s32["loss"]) < 1e-2
    assert abs(s16["grad_norm"] - s32["grad_norm"]) / s32["grad_norm"] < 5e-2
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())
    moments = [v for st in bf16.optimizer.state.values() for k, v in st.items() if k in ("exp_avg", "exp_avg_sq")]
    assert moments and all(m.dtype == torch.float32 for m in moments)


def test_mixed_precision_refuses_a_dtype_name():
    with pytest.raises(ValueError, match="mixed_precision"):
        TrainEngine(build_random_qwen2(), mixed_precision="bf16")


def test_precision_names_the_compute_dtype():
    assert TrainEngine(build_random_qwen2(), precision="bf16")._autocast_dtype == torch.bfloat16
    assert TrainEngine(build_random_qwen2(), precision="fp32", mixed_precision=torch.bfloat16)._autocast_dtype is None
    with pytest.raises(ValueError, match="precision must be fp32 or bf16"):
        TrainEngine(build_random_qwen2(), precision="fp16")
