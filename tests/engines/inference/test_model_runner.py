"""`ModelRunner`, the engine's prefill and decode step, against a plain transformers forward.

The runner left-pads a batch of prompts, picks the lean forward for the Qwen2/Qwen3/Llama
family and HF's forward otherwise, and must give the same thing either way: each prompt's
last-position logits, its keys and values in the last `len` columns of its row, and decode
steps over the batched cache whose greedy tokens and log-probs are those of running each
sequence alone through `model(...)`. Also: the fallback for models whose forward has no
`logits_to_keep`, and `rebind()` after a weight load replaced the parameter objects.
(tests/engines/inference/test_engine_lean.py compares `LeanForward` itself with HF; here the
unit is the runner: padding, positions, path choice and the cache round trip.)
"""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicCache

from areal_graph.engines.inference.kv_cache import BatchedKVCache
from areal_graph.engines.inference.lean_forward import LeanForward
from areal_graph.engines.inference.model_runner import ModelRunner
from support.tiny_models import build_random_qwen2

VOCAB = 96
CPU = torch.device("cpu")
SEQS = [[5, 9, 14], [3, 4, 5, 6, 7, 8, 90], [42]]


def spiky(seed: int = 0):
    """A tiny Qwen2 with weights at std 0.15, so logits are far from uniform and argmaxes are clear."""
    model = build_random_qwen2(vocab_size=VOCAB, hidden=64, layers=2, seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(
                1.0 + 0.1 * torch.randn(p.shape, generator=g)
                if "norm" in name
                else 0.15 * torch.randn(p.shape, generator=g)
            )
    return model.eval()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model():
    return spiky()


def alone(model, seq: list[int]):
    """HF's forward of one unpadded sequence: (logits [L, V], per-layer keys, values [kv_heads, L, D])."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([seq]), past_key_values=DynamicCache(), use_cache=True)
    layers = out.past_key_values.layers
    return out.logits[0], [layer.keys[0] for layer in layers], [layer.values[0] for layer in layers]


def test_the_lean_path_is_taken_for_the_family_only(model):
    assert isinstance(ModelRunner(model, CPU).lean, LeanForward)
    assert ModelRunner(model, CPU, lean=False).lean is None
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=32)).eval()
    assert ModelRunner(gpt2, CPU).lean is None
    training = build_random_qwen2(vocab_size=VOCAB).train()
    assert ModelRunner(training, CPU).lean is None  # the lean path is for inference only


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "hf"])
def test_prefill_left_pads_and_matches_each_sequence_alone(model, lean):
    runner = ModelRunner(model, CPU, lean=lean)
    with torch.no_grad():
        logits, keys, values, lens = runner.prefill(SEQS, pad_id=0)
    assert lens == [3, 7, 1] and logits.shape == (3, VOCAB)
    assert len(keys) == len(values) == 2 and keys[0].shape == (3, 2, 7, 16)
    for j, seq in enumerate(SEQS):
        ref_logits, ref_keys, ref_values = alone(model, seq)
        assert (logits[j] - ref_logits[-1]).abs().max() < 1e-4, j
        n = len(seq)
        for k, v, rk, rv in zip(keys, values, ref_keys, ref_values):
            # row j's real tokens sit in its last n columns, at positions 0..n-1 (padding does not shift them)
            assert (k[j, :, 7 - n :] - rk).abs().max() < 1e-4 and (v[j, :, 7 - n :] - rv).abs().max() < 1e-4


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "hf"])
def test_greedy_decode_over_the_cache_matches_transformers(model, lean):
    runner = ModelRunner(model, CPU, lean=lean)
    cache = BatchedKVCache(row_capacity=4)
    seqs = [list(s) for s in SEQS]
    with torch.no_grad():
        logits, keys, values, lens = runner.prefill(seqs, pad_id=0)
        cache.append(keys, values, lens)
        for step in range(5):
            tokens = logits.argmax(-1)
            logprobs = torch.log_softmax(logits, -1).gather(1, tokens.view(-1, 1)).squeeze(1)
            for j, seq in enumerate(seqs):
                ref = torch.log_softmax(alone(model, seq)[0][-1].double(), -1)
                assert int(tokens[j]) == int(ref.argmax()), (step, j)
                assert abs(float(logprobs[j]) - float(ref.max())) < 1e-4, (step, j)
            seqs = [s + [int(t)] for s, t in zip(seqs, tokens)]
            logits = runner.decode(tokens.tolist(), cache)
            assert cache.lens == [len(s) for s in seqs]
    assert len({tuple(s[-5:]) for s in seqs}) > 1  # the rows really decoded different things


def test_lean_and_hf_runners_give_the_same_tokens(model):
    outs = []
    for lean in (True, False):
        runner, cache = ModelRunner(model, CPU, lean=lean), BatchedKVCache()
        with torch.no_grad():
            logits, keys, values, lens = runner.prefill(SEQS, pad_id=0)
            cache.append(keys, values, lens)
            toks = []
            for _ in range(6):
                t = logits.argmax(-1).tolist()
                toks.append(t)
                logits = runner.decode(t, cache)
        outs.append((toks, logits))
    assert outs[0][0] == outs[1][0]
    assert (outs[0][1] - outs[1][1]).abs().max() < 1e-4


class NoLogitsToKeep(torch.nn.Module):
    """A CausalLM whose forward does not take `logits_to_keep` (as some HF models do not)."""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.calls = 0

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=True):
        self.calls += 1
        return self.inner(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
        )


def test_a_forward_without_logits_to_keep_falls_back_once(model):
    wrapped = NoLogitsToKeep(model).eval()
    runner = ModelRunner(wrapped, CPU)
    assert runner.lean is None
    with torch.no_grad():
        logits, keys, _, lens = runner.prefill(SEQS, pad_id=0)
        assert runner._logits_to_keep is False and wrapped.calls == 1  # the TypeError came before the forward
        again, _, _, _ = runner.prefill(SEQS, pad_id=0)
        assert wrapped.calls == 2  # no second try with logits_to_keep
    ref, _, _, _ = ModelRunner(model, CPU, lean=False).prefill(SEQS, pad_id=0)
    assert torch.allclose(logits, ref, atol=1e-5) and torch.equal(logits, again)
    assert keys[0].shape == (3, 2, 7, 16) and lens == [3, 7, 1]


def test_rebind_reads_replaced_parameters():
    model = spiky(seed=1)
    runner = ModelRunner(model, CPU)
    with torch.no_grad():
        old, _, _, _ = runner.prefill(SEQS, pad_id=0)
        model.model.norm.weight = torch.nn.Parameter(model.model.norm.weight.detach() * 2.0 + 0.5)
        hf, _, _, _ = ModelRunner(model, CPU, lean=False).prefill(SEQS, pad_id=0)
        stale, _, _, _ = runner.prefill(SEQS, pad_id=0)
        runner.rebind()
        fresh, _, _, _ = runner.prefill(SEQS, pad_id=0)
    assert torch.equal(stale, old)  # the lean path held the old tensor until rebind()
    assert (hf - old).abs().max() > 1e-2
    assert (fresh - hf).abs().max() < 1e-4
    ModelRunner(model, CPU, lean=False).rebind()  # a no-op on the HF path
