"""The models users bring, at a size that runs in a second: eleven architectures, random tiny
weights, served by the embedded engine and trained by the training engine.

Served: several prompts decoded together, greedy; the output ids equal transformers'
`generate` of each prompt alone, and every behaviour log-prob equals the log-softmax of
transformers' forward over prompt + output (fp32, 1e-4). Trained: the engine's packed
log-probs equal the forward of each sequence alone, and two optimizer steps lower a loss
that pushes up the log-probs (the weights move, nothing is NaN).
"""

from __future__ import annotations

import pytest
import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.engines.inference.engine import EmbeddedEngine
from areal_graph.engines.inference.sampling import SamplingParams
from areal_graph.engines.training.train_engine import TrainEngine

VOCAB = 96
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=128,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def _llama3():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(
        LlamaConfig(
            num_key_value_heads=2,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            **COMMON,
        )
    )


def _build(name: str) -> torch.nn.Module:
    import transformers as T

    kv = dict(num_key_value_heads=2)
    builders = {
        "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**kv, **COMMON)),
        "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(head_dim=8, **kv, **COMMON)),
        "llama3": _llama3,
        "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(sliding_window=None, **kv, **COMMON)),
        "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(head_dim=8, sliding_window=16, **kv, **COMMON)),
        "gemma3": lambda: T.Gemma3ForCausalLM(T.Gemma3TextConfig(head_dim=8, sliding_window=16, **kv, **COMMON)),
        "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(**kv, **COMMON)),
        "gpt2": lambda: T.GPT2LMHeadModel(
            T.GPT2Config(
                vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128, bos_token_id=1, eos_token_id=2
            )
        ),
        "gpt_neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**COMMON)),
        "olmo2": lambda: T.Olmo2ForCausalLM(T.Olmo2Config(**kv, **COMMON)),
        "qwen3_moe": lambda: T.Qwen3MoeForCausalLM(
            T.Qwen3MoeConfig(head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, **kv, **COMMON)
        ),
    }
    torch.manual_seed(sum(map(ord, name)))
    return builders[name]().eval()


ARCHITECTURES = [
    "qwen2",
    "qwen3",
    "llama3",
    "mistral",
    "gemma2",
    "gemma3",
    "phi3",
    "gpt2",
    "gpt_neox",
    "olmo2",
    "qwen3_moe",
]
PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [20, 21]]
NEW = 6


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_served_greedy_ids_and_logprobs_equal_transformers(arch):
    model = _build(arch)
    eng = EmbeddedEngine(model=model, max_running=8)
    greedy = SamplingParams(max_new_tokens=NEW, greedy=True, ignore_eos=True)
    futures = [eng.submit(p, greedy) for p in PROMPTS]  # queued before the start: decoded together
    eng.start()
    try:
        outs = [f.result(timeout=60) for f in futures]
    finally:
        eng.stop()
    for prompt, out in zip(PROMPTS, outs):
        with torch.no_grad():
            want = model.generate(
                torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, pad_token_id=0, eos_token_id=None
            )[0, len(prompt) :].tolist()
            full = torch.tensor([prompt + out.output_ids])
            lp = torch.log_softmax(model(input_ids=full).logits[0].float(), -1)
        assert out.output_ids == want, arch
        ref = [float(lp[len(prompt) - 1 + t, tok]) for t, tok in enumerate(out.output_ids)]
        assert max(abs(a - b) for a, b in zip(out.output_logprobs, ref)) < 1e-4, arch


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_trained_packed_logprobs_are_exact_and_steps_lower_the_loss(arch):
    model = _build(arch)
    seqs = [p + [30 + i, 31 + i, 32 + i] for i, p in enumerate(PROMPTS)]
    batch = PackedBatch.from_sequences({"input_ids": seqs, "loss_mask": [[0] * len(p) + [1] * 3 for p in PROMPTS]})
    with torch.no_grad():
        alone = []
        for s in seqs:
            lp = torch.log_softmax(model(input_ids=torch.tensor([s])).logits[0].float(), -1)
            alone += [0.0] + [float(lp[t - 1, s[t]]) for t in range(1, len(s))]
    engine = TrainEngine(model, lr=1e-2, total_steps=4)
    got = engine.compute_logprobs(batch)
    assert torch.allclose(got, torch.tensor(alone), atol=1e-4), (arch, (got - torch.tensor(alone)).abs().max())

    def loss_fn(lp, ent, mb):  # maximise the answer tokens' log-probs (mean over the batch's answer tokens)
        mask = mb["loss_mask"].float()
        return -(lp * mask).sum() / batch["loss_mask"].float().sum(), {}

    before = {k: v.clone() for k, v in model.state_dict().items()}
    losses = [engine.train_step(batch, loss_fn)["loss"] for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], (arch, losses)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items()), arch
