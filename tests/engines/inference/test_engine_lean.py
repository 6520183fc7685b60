"""The engine's fast paths against the plain ones: lean forward vs HF, shared vs separate prefill.

- The lean forward (engines/inference/lean_forward.py) must give HF's logits and KV rows,
  for left-padded prefill and for decode steps over right-aligned cache rows of different
  lengths, on Qwen2, Qwen3 (q/k norms, explicit head_dim) and Llama (untied head, biases).
- Prefix sharing (identical prompts prefilled once) must not change any request's tokens
  or log-probs, and a seeded request's tokens must not depend on its batch.
- Models outside the lean family fall back to the HF forward.
"""

from __future__ import annotations

import pytest
import torch

from areal_graph.engines.inference.engine import EmbeddedEngine
from areal_graph.engines.inference.kv_cache import BatchedKVCache
from areal_graph.engines.inference.lean_forward import LeanForward, unsupported_reason
from areal_graph.engines.inference.sampling import SamplingParams, sample_tokens
from support.tiny_models import build_random_qwen2

VOCAB = 128


def _spiky(model, seed: int):
    """Weights at std 0.15 so logits are far from uniform (differences would show)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.15)
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def build(arch: str, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if arch == "qwen2":
        return _spiky(build_random_qwen2(vocab_size=VOCAB, seed=seed), seed)
    if arch == "qwen3":
        return _spiky(Qwen3ForCausalLM(Qwen3Config(head_dim=24, tie_word_embeddings=True, **common)), seed)
    if arch == "llama":
        cfg = LlamaConfig(tie_word_embeddings=False, attention_bias=True, mlp_bias=True, **common)
        return _spiky(LlamaForCausalLM(cfg), seed)
    raise ValueError(arch)


def _left_padded(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.tensor([[0] * (width - len(s)) + s for s in seqs])
    mask = (torch.arange(width).unsqueeze(0) >= torch.tensor([width - len(s) for s in seqs]).unsqueeze(1)).long()
    return ids, mask, torch.tensor([len(s) for s in seqs])


def _seqs(n: int, seed: int, lo: int = 2, hi: int = 20) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, VOCAB, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_lean_prefill_matches_hf_logits_and_kv(arch):
    from transformers.cache_utils import DynamicCache

    model = build(arch)
    assert unsupported_reason(model) is None
    seqs = _seqs(5, seed=1)
    ids, mask, lens = _left_padded(seqs)
    with torch.no_grad():
        ref = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(1) - 1).clamp(min=0),
            past_key_values=DynamicCache(),
            use_cache=True,
        )
        logits, keys, values = LeanForward(model).prefill(ids, lens)
    assert (logits - ref.logits[:, -1]).abs().max() < 1e-4
    real = mask.bool().view(len(seqs), 1, -1, 1)
    for layer, k, v in zip(ref.past_key_values.layers, keys, values):
        assert ((k - layer.keys).abs() * real).max() < 1e-4
        assert ((v - layer.values).abs() * real).max() < 1e-4


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_lean_decode_over_right_aligned_rows_matches_full_forward(arch):
    """Rows of different lengths share the cache (right-aligned, stale columns masked); each decode
    step's logits must equal HF's full forward over that row's whole sequence."""
    model = build(arch)
    lean = LeanForward(model)
    seqs = _seqs(4, seed=2)
    ids, _, lens = _left_padded(seqs)
    cache = BatchedKVCache(row_capacity=8)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        _, keys, values = lean.prefill(ids, lens)
        cache.append(keys, values, lens.tolist())
        for _ in range(6):
            new = torch.randint(3, VOCAB, (len(seqs),), generator=g)
            seqs = [s + [int(t)] for s, t in zip(seqs, new)]
            start, end = cache.decode_window(1)
            positions = torch.tensor(cache.lens)
            logits = lean.decode(new, positions, cache.decode_mask(1), cache.keys, cache.values, start, end)
            cache.advance(1)
            for j, s in enumerate(seqs):
                ref = model(torch.tensor([s])).logits[0, -1]
                assert (logits[j] - ref).abs().max() < 1e-4, (arch, j)


def test_lean_forward_sees_weight_updates():
    """The lean path reads the model's own tensors: a load_state_dict is visible without a rebuild."""
    model, other = build("qwen2", 0), build("qwen2", 1)
    lean = LeanForward(model)
    ids, _, lens = _left_padded(_seqs(2, seed=4))
    model.load_state_dict(other.state_dict())
    with torch.no_grad():
        got = lean.prefill(ids, lens)[0]
        want = LeanForward(other).prefill(ids, lens)[0]
    assert torch.equal(got, want)


def test_models_outside_the_family_use_the_hf_forward():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(
        GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=128, bos_token_id=1, eos_token_id=2)
    ).eval()
    assert "GPT2LMHeadModel" in unsupported_reason(gpt2)
    sliding = build_random_qwen2(vocab_size=VOCAB)
    sliding.config.use_sliding_window = True
    assert unsupported_reason(sliding) is not None
    with EmbeddedEngine(model=gpt2, max_running=8) as eng:
        assert eng._runner.lean is None
        prompt = [5, 6, 7, 8]
        out = eng.submit(prompt, SamplingParams(max_new_tokens=6, greedy=True, ignore_eos=True)).result()
    with torch.no_grad():
        ref = gpt2.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert out.output_ids == ref[0, 4:].tolist()


def _run(model, prompts: list[list[int]], params: list[SamplingParams], **kw) -> list:
    """Queue everything before the scheduler starts, so the whole batch is admitted in one step."""
    eng = EmbeddedEngine(model=model, max_running=64, **kw)
    futs = [eng.submit(p, sp) for p, sp in zip(prompts, params)]
    eng.start()
    try:
        return [f.result(timeout=60) for f in futs]
    finally:
        eng.stop()


def test_lean_and_hf_forward_give_the_same_generations():
    model = build("qwen2")
    prompts = _seqs(12, seed=5)
    params = [SamplingParams(max_new_tokens=12, temperature=0.8, seed=i, ignore_eos=True) for i in range(12)]
    fast = _run(model, prompts, params)
    slow = _run(model, prompts, params, lean_forward=False)
    for a, b in zip(fast, slow):
        assert a.output_ids == b.output_ids
        assert max(abs(x - y) for x, y in zip(a.output_logprobs, b.output_logprobs)) < 1e-4


def test_prefix_sharing_prefills_once_and_changes_nothing():
    model = build("qwen2")
    groups = _seqs(3, seed=6, lo=5)
    prompts = [p for p in groups for _ in range(6)]
    params = [
        SamplingParams(max_new_tokens=10, temperature=1.0, seed=100 + i, ignore_eos=True) for i in range(len(prompts))
    ]
    prefilled: list[int] = []
    eng = EmbeddedEngine(model=model, max_running=64)
    inner = eng._runner.prefill
    eng._runner.prefill = lambda seqs, pad: (prefilled.append(len(seqs)), inner(seqs, pad))[1]
    futs = [eng.submit(p, sp) for p, sp in zip(prompts, params)]
    eng.start()
    shared = [f.result(timeout=60) for f in futs]
    eng.stop()
    assert prefilled == [3]  # 18 requests, 3 distinct prompts: one forward over 3 rows
    separate = _run(model, prompts, params, prefix_sharing=False)
    for a, b in zip(shared, separate):
        assert a.output_ids == b.output_ids
        assert abs(a.output_logprobs[0] - b.output_logprobs[0]) < 1e-5  # the first token: the copied logits
        assert max(abs(x - y) for x, y in zip(a.output_logprobs, b.output_logprobs)) < 1e-4
    # the copies really sample on their own: 6 answers of one prompt are not all the same
    assert len({tuple(r.output_ids) for r in shared[:6]}) > 1


def test_seeded_request_same_tokens_alone_or_among_duplicates():
    model = build("qwen2")
    prompt, others = _seqs(1, seed=7, lo=8)[0], _seqs(5, seed=8)
    mine = SamplingParams(max_new_tokens=16, temperature=1.0, seed=1234, ignore_eos=True)
    alone = _run(model, [prompt], [mine])[0]
    crowd_prompts = [prompt] * 7 + others
    crowd_params = [mine] + [
        SamplingParams(max_new_tokens=int(4 + 3 * i), temperature=1.0, seed=i, ignore_eos=True)
        for i in range(len(crowd_prompts) - 1)
    ]
    crowd = _run(model, crowd_prompts, crowd_params)
    assert crowd[0].output_ids == alone.output_ids
    assert max(abs(x - y) for x, y in zip(crowd[0].output_logprobs, alone.output_logprobs)) < 1e-4


def test_a_burst_of_submits_to_a_running_engine_is_prefilled_together():
    model = build("qwen2")
    eng = EmbeddedEngine(model=model, max_running=64, admit_wait_s=0.5)  # generous: no timing flakiness
    prefilled: list[int] = []
    inner = eng._runner.prefill
    eng._runner.prefill = lambda seqs, pad: (prefilled.append(len(seqs)), inner(seqs, pad))[1]
    with eng:
        prompt = _seqs(1, seed=9, lo=5)[0]
        futs = [eng.submit(prompt, SamplingParams(max_new_tokens=4, seed=i)) for i in range(8)]
        [f.result(timeout=60) for f in futs]
    assert prefilled == [1]


def test_inverse_cdf_sampling_picks_the_first_token_past_u():
    """Given uniforms, the sampler is a deterministic function: token = min{i : cdf_i > u * total}."""
    logits = torch.log(torch.tensor([[0.1, 0.0, 0.2, 0.3, 0.4]]))  # token 1 has zero probability
    params = [SamplingParams(temperature=1.0)]
    cases = [(0.0, 0), (0.0999, 0), (0.1001, 2), (0.2999, 2), (0.3001, 3), (0.9999, 4)]
    for u, want in cases:
        tok, lp = sample_tokens(logits, params, uniforms=torch.tensor([u], dtype=torch.float64))
        assert int(tok) == want, (u, int(tok))
        assert abs(float(lp) - float(torch.log_softmax(logits, -1)[0, want])) < 1e-6
