"""The lean training forward (engines/training/lean_train.py) against HF and a float64 loop.

Batches look like GRPO's: groups of answers to one prompt, answers that begin alike (so the
shared-prefix stream really shares), duplicates, masked tool spans, the pad token inside
sequences (its embedding row must get no gradient, as in HF)."""

from __future__ import annotations

import copy

import pytest
import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.engines.training.lean_train import LeanTrainForward, stream_layout, unsupported_reason
from areal_graph.engines.training.packed_scoring import lean_logprobs, rows_logprobs
from areal_graph.engines.training.train_engine import TrainEngine
from support.batches import grpo_batch
from support.reference_logprobs import naive_logprobs, packed_logprobs
from support.tiny_models import build_random_qwen2


def build_model(arch: str, seed: int = 0):
    if arch == "qwen2":
        return build_random_qwen2(seed=seed)
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    common = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    if arch == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(head_dim=16, tie_word_embeddings=True, **common)).eval()
    # untied head, biases everywhere: the paths Qwen2 does not take
    return LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, attention_bias=True, mlp_bias=True, **common)).eval()


def test_stream_layout_holds_common_prefixes_once():
    seqs = [[1, 2, 3, 4], [1, 2, 3, 5], [7, 8], [1, 2, 6], [1, 2, 3, 4]]
    cu = [0]
    for s in seqs:
        cu.append(cu[-1] + len(s))
    ids = torch.tensor([t for s in seqs for t in s])
    layout = stream_layout(ids, cu, torch.device("cpu"))
    # distinct (prefix) positions: 1 2 3 4 | 5 | 6 | 7 8
    assert layout.input_ids.numel() == 8
    assert torch.equal(layout.input_ids[layout.token_index], ids)
    pos = torch.cat([torch.arange(len(s)) for s in seqs])
    assert torch.equal(layout.positions[layout.token_index], pos)
    ix = layout.token_index.tolist()
    assert ix[0:4] == ix[-4:] and ix[0:3] == ix[4:7] and ix[0:2] == ix[10:12] and ix[7] != ix[3]
    # every stream position is queried exactly once, from a slot that holds it
    assert torch.equal(layout.query_gather[layout.scatter], torch.arange(8))
    assert sum(b.n * b.query_width for b in layout.blocks) == layout.query_gather.numel()
    assert sum(b.n * b.key_width for b in layout.blocks) == layout.key_gather.numel()
    # the duplicate owns nothing and takes no part; [1, 2, 3, 5] owns only its last token
    assert sum(b.n for b in layout.blocks) == 4
    masked = [b for b in layout.blocks if b.mask is not None]
    assert masked and all(b.query_width < b.key_width for b in masked)
    alone = stream_layout(ids, cu, torch.device("cpu"), share_prefixes=False)
    assert alone.input_ids.numel() == ids.numel()
    assert all(b.mask is None and b.query_width == b.key_width for b in alone.blocks)


def test_unsupported_models_are_reported():
    model = build_random_qwen2()
    assert unsupported_reason(model) is None
    model.train()
    assert "training mode" in unsupported_reason(model)
    from areal_graph.engines.training.value_model import ValueModel

    assert "architecture" in unsupported_reason(ValueModel(build_random_qwen2().model))


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("share", [True, False])
def test_lean_logprobs_and_entropy_match_hf_and_a_float64_loop(arch, share):
    model = build_model(arch)
    assert unsupported_reason(model) is None
    batch = grpo_batch(seed=1)
    with torch.no_grad():
        lp, ent = lean_logprobs(
            LeanTrainForward(model), batch, with_entropy=True, temperature=0.7, share_prefixes=share
        )
        hf_lp, hf_ent = packed_logprobs(model, batch, row_tokens=64, with_entropy=True, temperature=0.7)
    ref_lp, ref_ent = naive_logprobs(model, batch, temperature=0.7, entropy=True)
    assert torch.allclose(lp.double(), ref_lp, atol=1e-4), (lp.double() - ref_lp).abs().max()
    assert torch.allclose(ent.double(), ref_ent, atol=1e-4), (ent.double() - ref_ent).abs().max()
    assert (lp - hf_lp).abs().max() < 2e-5 and (ent - hf_ent).abs().max() < 2e-5
    assert torch.all(lp[batch.cu_seqlens[:-1].long()] == 0)


@pytest.mark.parametrize("lean", [True, False])
def test_restricted_positions_equal_full_positions(lean):
    model = build_random_qwen2()
    batch = grpo_batch(seed=2)
    score = batch["loss_mask"] != 0
    rows = [[i] for i in range(batch.num_seqs)]
    with torch.no_grad():
        if lean:
            full = lean_logprobs(LeanTrainForward(model), batch, with_entropy=True)
            part = lean_logprobs(LeanTrainForward(model), batch, with_entropy=True, score=score)
        else:
            full = rows_logprobs(model, batch, rows, with_entropy=True)
            part = rows_logprobs(model, batch, rows, with_entropy=True, score=score)
    for f, p in zip(full, part):
        assert torch.all(p[~score] == 0)
        # HF: the same forward, fewer rows through the head; lean: the last layer too runs on fewer rows
        assert (f[score] - p[score]).abs().max() <= (0.0 if not lean else 2e-6)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_lean_gradients_match_hf(arch):
    base = build_model(arch, seed=3)
    batch = grpo_batch(seed=3)
    score = batch["loss_mask"] != 0
    g = torch.Generator().manual_seed(0)
    w_lp, w_ent = torch.randn(batch.num_tokens, generator=g), torch.randn(batch.num_tokens, generator=g)
    grads = []
    for lean in (True, False):
        model = copy.deepcopy(base)
        if lean:
            lp, ent = lean_logprobs(LeanTrainForward(model), batch, with_entropy=True, temperature=0.9, score=score)
        else:
            lp, ent = rows_logprobs(
                model, batch, [[i] for i in range(batch.num_seqs)], with_entropy=True, temperature=0.9, score=score
            )
        ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    lean_g, hf_g = grads
    assert lean_g.keys() == hf_g.keys()
    num = sum(float(((lean_g[k] - hf_g[k]).double() ** 2).sum()) for k in hf_g) ** 0.5
    den = sum(float((hf_g[k].double() ** 2).sum()) for k in hf_g) ** 0.5
    assert num / den < 1e-5, num / den
    emb = "model.embed_tokens.weight"
    if arch == "llama":  # untied: the pad row of the input embedding gets nothing, as in HF
        assert torch.all(lean_g[emb][0] == 0) and torch.all(hf_g[emb][0] == 0)


def test_engine_uses_lean_only_where_it_can():
    assert TrainEngine(build_random_qwen2())._lean is not None
    assert TrainEngine(build_random_qwen2(), lean=False)._lean is None
    engine = TrainEngine(build_random_qwen2())
    engine.model.train()  # e.g. dropout wanted: the HF modules run
    assert engine._lean_now() is None
    batch = grpo_batch(seed=4)
    lp = engine.compute_logprobs(batch)
    engine.model.eval()
    assert engine._lean_now() is not None
    assert (engine.compute_logprobs(batch) - lp).abs().max() < 2e-5


def test_a_micro_batch_with_nothing_to_train_on_steps_cleanly():
    batch = PackedBatch.from_sequences({"input_ids": [[3, 4, 5], [6, 7]], "loss_mask": [[0, 0, 0], [0, 0]]})
    engine = TrainEngine(build_random_qwen2(), lr=1e-3)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}

    def loss_fn(lp, ent, mb):
        return (lp * mb["loss_mask"].float()).sum(), {}

    stats = engine.train_step(batch, loss_fn)
    assert stats["loss"] == 0.0 and stats["grad_norm"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in engine.model.state_dict().items())
