"""The weights digest (engines/weights_digest.py) and the engine's own (`EmbeddedEngine.weights_digest`):
read from tensors, a shared-memory file or safetensors it is the same digest; a server holding
bfloat16 has the digest of the float32 weights it was given, rounded; another version, a copy
that stopped part-way or a swapped tensor give another one."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from areal_graph.engines import shared_weights
from areal_graph.engines.inference.engine import EmbeddedEngine
from areal_graph.engines.lora_weights import SCALING_KEY
from areal_graph.engines.weights_digest import (
    SAMPLES,
    digest,
    dtype_named,
    positions,
    sample_safetensors,
    sample_shared_file,
    sample_tensors,
)
from support.tiny_models import build_random_qwen2


def state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"layer.w": torch.randn(33, 17, generator=g), "layer.b": torch.randn(5, generator=g)}


def test_positions_spread_over_the_tensor_first_and_last_included():
    assert positions(1000) == sorted(set(positions(1000))) and len(positions(1000)) == SAMPLES
    assert positions(1000)[0] == 0 and positions(1000)[-1] == 999
    assert positions(3) == [0, 1, 2] and positions(0) == []


def test_another_version_a_half_copy_and_a_swapped_tensor_each_change_the_digest():
    a, b = state(0), state(1)
    d = digest(sample_tensors(a), torch.float32)
    assert digest(sample_tensors({k: v.clone() for k, v in a.items()}), torch.float32) == d
    assert digest(sample_tensors(b), torch.float32) != d
    half = {k: v.clone() for k, v in a.items()}
    half["layer.w"].view(-1)[300:] = b["layer.w"].view(-1)[300:]  # a copy of version b that stopped part-way
    assert digest(sample_tensors(half), torch.float32) not in (d, digest(sample_tensors(b), torch.float32))
    mixed = {"layer.w": a["layer.w"], "layer.b": b["layer.b"]}
    assert digest(sample_tensors(mixed), torch.float32) != d
    renamed = {"layer.v": a["layer.w"], "layer.b": a["layer.b"]}
    assert digest(sample_tensors(renamed), torch.float32) != d


def test_a_bfloat16_server_has_the_digest_of_the_float32_weights_it_was_given():
    full = state(0)
    held = {k: torch.empty_like(v, dtype=torch.bfloat16).copy_(v) for k, v in full.items()}  # what a load does
    assert digest(sample_tensors(held), torch.bfloat16) == digest(sample_tensors(full), torch.bfloat16)
    assert digest(sample_tensors(full), torch.bfloat16) != digest(sample_tensors(full), torch.float32)
    with pytest.raises(ValueError, match="unknown weights dtype 'int8'"):
        dtype_named("int8")


def test_a_shared_file_and_safetensors_read_back_as_the_tensors(tmp_path):
    s = state(3)
    manifest = shared_weights.publish(str(tmp_path / "shm"), s)
    assert digest(sample_shared_file(tmp_path / "shm", manifest), torch.float32) == digest(
        sample_tensors(s), torch.float32
    )
    (tmp_path / "dir").mkdir()
    save_file({k: v.to(torch.bfloat16) for k, v in s.items()}, tmp_path / "dir" / "model.safetensors")
    read = sample_safetensors(tmp_path / "dir")
    assert {k: v[0] for k, v in read.items()} == {k: tuple(v.shape) for k, v in s.items()}
    assert digest(read, torch.bfloat16) == digest(sample_tensors(s), torch.bfloat16)
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors file"):
        sample_safetensors(tmp_path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_engine_reports_the_digest_of_what_it_loaded(dtype):
    trainer = build_random_qwen2(seed=1)
    published = dict(trainer.state_dict())
    engine = EmbeddedEngine(model=build_random_qwen2(seed=0), dtype=dtype, max_running=2)
    before = engine.weights_digest()
    assert before == digest(sample_tensors(build_random_qwen2(seed=0).to(dtype).state_dict()), dtype)
    engine.update_weights_from_state_dict(published, version=1)
    assert engine.weights_digest() == digest(sample_tensors(published), dtype) != before


def test_after_a_lora_adapter_the_engine_reports_the_adapters_digest():
    model = build_random_qwen2(seed=0)
    g = torch.Generator().manual_seed(5)
    adapter = {
        SCALING_KEY: torch.tensor([2.0]),
        "model.layers.0.self_attn.q_proj.lora_A.weight": torch.randn(4, 64, generator=g),
        "model.layers.0.self_attn.q_proj.lora_B.weight": torch.randn(64, 4, generator=g),
    }
    engine = EmbeddedEngine(model=model, max_running=2)
    engine.update_weights_from_state_dict(adapter, version=1)
    assert engine.weights_digest() == digest(sample_tensors(adapter), torch.float32)
    engine.update_weights_from_state_dict(dict(build_random_qwen2(seed=2).state_dict()), version=2)
    assert engine.weights_digest() == digest(sample_tensors(build_random_qwen2(seed=2).state_dict()), torch.float32)
