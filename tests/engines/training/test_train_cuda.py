"""The training engine on a GPU (`make test-gpu`): the lean forward and the HF path against a
float64 CPU reference, a CUDA step against the CPU step, bf16 mixed precision by autocast and
by FSDP2's MixedPrecisionPolicy (one rank), fp32 master weights throughout."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist

from areal_graph.engines.training.train_engine import TrainEngine
from support.batches import grpo_batch, random_batch
from support.reference_logprobs import naive_logprobs
from support.tiny_models import build_random_qwen2

pytestmark = pytest.mark.gpu


def nll_loss(batch):
    total = float(batch["loss_mask"].sum())

    def loss_fn(lp, ent, mb):
        return -(lp * mb["loss_mask"].float()).sum() / total, {}

    return loss_fn


def engine(device="cuda", **kw) -> TrainEngine:
    torch.manual_seed(0)
    return TrainEngine(build_random_qwen2(), lr=1e-3, device=device, **kw)


@pytest.mark.parametrize("lean", [True, False])
def test_cuda_logprobs_match_the_float64_cpu_reference(lean):
    torch.backends.cuda.matmul.allow_tf32 = False
    batch = grpo_batch(groups=4, answers=4, seed=2)
    eng = engine(lean=lean)
    assert (eng._lean is not None) == lean
    ref = naive_logprobs(build_random_qwen2(), batch)
    gap = float((eng.compute_logprobs(batch).double() - ref).abs().max())
    assert gap <= 1e-4, gap


def test_a_cuda_step_equals_the_cpu_step():
    torch.backends.cuda.matmul.allow_tf32 = False
    batch = random_batch(n=12, seed=3)
    cpu, gpu = engine("cpu"), engine("cuda")
    s_cpu, s_gpu = cpu.train_step(batch, nll_loss(batch)), gpu.train_step(batch, nll_loss(batch))
    assert abs(s_cpu["loss"] - s_gpu["loss"]) <= 1e-5 * abs(s_cpu["loss"])
    assert abs(s_cpu["grad_norm"] - s_gpu["grad_norm"]) <= 1e-4 * s_cpu["grad_norm"]
    a, b = cpu.state_dict_for_sync(), gpu.state_dict_for_sync()
    assert all(b[k].device.type == "cpu" for k in b)
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= 1e-5, worst  # lr 1e-3 Adam: a sign flip of a tiny gradient would show as ~2e-3


def test_bf16_autocast_step_tracks_fp32_with_fp32_master_weights():
    batch = grpo_batch(groups=4, answers=4, seed=4)
    fp32, bf16 = engine(), engine(mixed_precision=torch.bfloat16)
    s32, s16 = fp32.train_step(batch, nll_loss(batch)), bf16.train_step(batch, nll_loss(batch))
    assert abs(s16["loss"] - s32["loss"]) <= 1e-2 * abs(s32["loss"])
    assert abs(s16["grad_norm"] - s32["grad_norm"]) <= 5e-2 * s32["grad_norm"]
    assert all(p.dtype == torch.float32 and p.device.type == "cuda" for p in bf16.model.parameters())


@pytest.fixture()
def one_rank_group():
    """A one-rank process group; one already made in this process (the Megatron tests make one
    and keep it, as Megatron's parallel state needs) is used as it is."""
    if dist.is_initialized():
        assert dist.get_world_size() == 1
        yield
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_fsdp2_bf16_on_one_gpu_tracks_fp32_and_syncs_fp32_weights(one_rank_group):
    batch = grpo_batch(groups=4, answers=4, seed=5)
    ref = engine(parallel="none")
    fsdp = engine(parallel="fsdp")  # mixed_precision "auto": bf16 compute under FSDP on CUDA
    assert fsdp.parallel == "fsdp"
    s_ref, s_fsdp = ref.train_step(batch, nll_loss(batch)), fsdp.train_step(batch, nll_loss(batch))
    assert abs(s_fsdp["loss"] - s_ref["loss"]) <= 1e-2 * abs(s_ref["loss"])
    assert abs(s_fsdp["grad_norm"] - s_ref["grad_norm"]) <= 5e-2 * s_ref["grad_norm"]
    synced, plain = fsdp.state_dict_for_sync(), ref.state_dict_for_sync()
    assert set(synced) >= set(plain) - {"lm_head.weight"}
    assert all(synced[k].dtype == torch.float32 for k in synced)
    drift = max(float((synced[k].cpu() - plain[k]).abs().max()) for k in plain if k in synced)
    assert drift <= 5e-3, drift  # both took one Adam step of lr 1e-3 from the same weights
