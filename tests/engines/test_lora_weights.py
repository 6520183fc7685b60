"""LoRA (engines/lora_weights.py and the training engine's `lora`): adapters train and the base
stays frozen; the adapter-only sync gives the inference engine the merged weights; checkpoints
and exports hold the adapters, against peft's own merge as the reference."""

from __future__ import annotations

import copy

import pytest
import torch

from areal_graph.engines.inference.engine import EmbeddedEngine
from areal_graph.engines.inference.sampling import SamplingParams
from areal_graph.engines.lora_weights import SCALING_KEY, adapter_tensors, apply_adapter, merged_tensors
from areal_graph.engines.training.train_engine import LORA_ADAPTER_DIR, TrainEngine
from support.batches import random_batch
from support.tiny_models import build_random_qwen2

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "o_proj"], "sync": "adapter"}


def answer_loss(lp, ent, mb):
    mask = mb["loss_mask"].float()
    return -(lp * mask).sum() / max(float(mask.sum()), 1.0), {}


def trained(steps: int = 3, seed: int = 0) -> TrainEngine:
    engine = TrainEngine(build_random_qwen2(seed=seed), lr=5e-2, total_steps=10, lora=LORA)
    for s in range(steps):
        engine.train_step(random_batch(seed=s), answer_loss)
    return engine


def peft_merged(engine: TrainEngine) -> dict[str, torch.Tensor]:
    """peft's own merge (on a copy), the reference for ours."""
    return copy.deepcopy(engine.model).merge_and_unload().state_dict()


def test_only_the_adapters_train_and_the_base_stays_as_loaded():
    base = build_random_qwen2()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    engine = TrainEngine(base, lr=5e-2, total_steps=10, lora=LORA)
    trainable = [n for n, p in engine.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * 3 * 2  # A and B for q, v, o in 2 layers
    lp0 = engine.compute_logprobs(random_batch())
    engine.train_step(random_batch(), answer_loss)
    for k, v in engine.model.get_base_model().state_dict().items():
        if ".lora_" not in k:
            assert torch.equal(v, before[k.replace(".base_layer.", ".")]), k
    assert not torch.allclose(engine.compute_logprobs(random_batch()), lp0)
    assert engine._lean is None  # the HF forward runs the adapters


def test_merged_weights_equal_peft_merge():
    engine = trained()
    ours, ref = merged_tensors(engine.model), peft_merged(engine)
    assert set(ours) == set(ref)
    assert max(float((ours[k] - ref[k]).abs().max()) for k in ref) < 1e-6


def test_the_engine_applies_adapters_to_its_frozen_base():
    engine = trained()
    server_model = build_random_qwen2()  # the inference side starts from the same base weights
    serve = EmbeddedEngine(model=server_model, max_running=4)
    serve.update_weights_from_state_dict(adapter_tensors(engine.model), version=1)
    want = merged_tensors(engine.model)
    got = server_model.state_dict()
    assert max(float((got[k] - want[k]).abs().max()) for k in want) < 1e-6
    # a second adapter applies to the base, not on top of the first
    engine.train_step(random_batch(seed=9), answer_loss)
    serve.update_weights_from_state_dict(adapter_tensors(engine.model), version=2)
    want = merged_tensors(engine.model)
    got = server_model.state_dict()
    assert max(float((got[k] - want[k]).abs().max()) for k in want) < 1e-6 and serve.version == 2
    # and it decodes what the merged model decodes
    merged = build_random_qwen2()
    merged.load_state_dict(want)
    prompt = [5, 6, 7, 8, 9]
    with serve:
        out = serve.submit(prompt, SamplingParams(max_new_tokens=6, greedy=True, ignore_eos=True)).result(timeout=60)
    with torch.no_grad():
        ref = merged.generate(
            torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    assert out.output_ids == ref[0, len(prompt) :].tolist()


def test_an_adapter_sync_moves_a_small_part_of_the_model():
    engine = trained(steps=1)
    adapter, merged = engine.state_dict_for_sync(), merged_tensors(engine.model)
    assert SCALING_KEY in adapter and float(adapter[SCALING_KEY]) == LORA["alpha"] / LORA["r"]
    size = lambda d: sum(t.numel() * t.element_size() for t in d.values())  # noqa: E731
    assert size(adapter) * 10 < size(merged), (size(adapter), size(merged))
    merged_sync = TrainEngine(build_random_qwen2(), lr=5e-2, lora={**LORA, "sync": "merged"})
    assert SCALING_KEY not in merged_sync.state_dict_for_sync()


def test_an_adapter_for_a_module_the_model_lacks_is_named():
    model = build_random_qwen2()
    with pytest.raises(KeyError, match="model.layers.9.self_attn.q_proj"):
        apply_adapter(
            model,
            {},
            {
                SCALING_KEY: torch.tensor([2.0]),
                "model.layers.9.self_attn.q_proj.lora_A.weight": torch.zeros(4, 64),
                "model.layers.9.self_attn.q_proj.lora_B.weight": torch.zeros(64, 4),
            },
        )


def test_checkpoint_resume_and_export(tmp_path):
    engine = trained(steps=2)
    engine.save_checkpoint(tmp_path / "ckpt")
    resumed = TrainEngine(build_random_qwen2(), lr=5e-2, total_steps=10, lora=LORA)
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert resumed.version == engine.version == 2
    a, b = adapter_tensors(engine.model), adapter_tensors(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the optimizer state came back too: the next step is the same step
    s1 = engine.train_step(random_batch(seed=7), answer_loss)
    s2 = resumed.train_step(random_batch(seed=7), answer_loss)
    assert s1["loss"] == pytest.approx(s2["loss"], abs=1e-7)
    a, b = adapter_tensors(engine.model), adapter_tensors(resumed.model)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
    # the export: a merged model any HF code loads, and the adapters in peft's layout beside it
    out = engine.export_hf(tmp_path / "final")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        want = engine.model(input_ids=ids).logits
        assert torch.allclose(merged(input_ids=ids).logits, want, atol=1e-5)
        adapted = PeftModel.from_pretrained(build_random_qwen2(), out / LORA_ADAPTER_DIR)
        assert torch.allclose(adapted(input_ids=ids).logits, want, atol=1e-6)
