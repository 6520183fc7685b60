"""Tiny random models built from a config: tests never download weights."""

from __future__ import annotations

import torch


def build_random_qwen2(vocab_size: int = 128, hidden: int = 64, layers: int = 2, seed: int = 0):
    """A tiny randomly initialised Qwen2 CausalLM (fp32), the architecture of the real kit."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return Qwen2ForCausalLM(config).eval()


def build_spiky_qwen2(seed: int, vocab_size: int = 128, hidden: int = 64, layers: int = 2):
    """A random tiny Qwen2 with its weights re-drawn at std 0.15 (norms kept): the default init
    gives near-uniform logits, so greedy decoding would repeat one id; this one does not."""
    model = build_random_qwen2(vocab_size=vocab_size, hidden=hidden, layers=layers, seed=seed)
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.15)
    return model.eval()


def save_random_classifier(path, tokenizer, labels: int = 1, seed: int = 0, pad: bool = True):
    """A tiny random Qwen2ForSequenceClassification with `tokenizer`, saved in `path` (a reward
    model's directory); `pad=False` leaves it without a pad token."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        num_labels=labels,
        pad_token_id=tokenizer.pad_token_id if pad else None,
    )
    Qwen2ForSequenceClassification(cfg).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
