"""A tiny Qwen2-architecture causal LM, built from a config, and the one loader everything uses.

Size choice (see /work/shared/ENVIRONMENT.md): hidden 256 x 4 layers generates ~4k tok/s at
batch 64 on 2 cores, hidden 128 trains ~2.5x faster. RL here is dominated by generation of
group samples *and* by training on them, on the same 2 cores, so the default is in between:
hidden 192, 4 layers, intermediate 512 (~1.6M parameters with a ~300-token vocabulary). That
is big enough to learn carry arithmetic on 2-3 step problems from a short SFT, small enough
for a few hundred RL steps in ~10 minutes.

`load_model_and_tokenizer` goes through `AutoModelForCausalLM` / `AutoTokenizer`, so a real
checkpoint directory (e.g. a Qwen2.5 download) loads the same way as a built kit's (a
`builtin:` name resolves to its directory first: modelkit/builtin.py `resolve_model_path`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from areal_graph.modelkit.tokenizer import save_tokenizer


@dataclass(frozen=True)
class TinyModelConfig:
    hidden_size: int = 192
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 256


def build_tiny_model(tokenizer, cfg: TinyModelConfig = TinyModelConfig(), seed: int = 0):
    """A randomly initialised Qwen2ForCausalLM (fp32) whose vocab and special ids match `tokenizer`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if cfg.hidden_size % cfg.num_heads or cfg.num_heads % cfg.num_kv_heads:
        raise ValueError(f"TinyModelConfig: hidden_size must divide by num_heads and num_heads by num_kv_heads: {cfg}")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def count_parameters(model) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def save_model_and_tokenizer(model, tokenizer, path: str | Path) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    save_tokenizer(tokenizer, path)
    return path


def load_model_and_tokenizer(path: str | Path, dtype=None):
    """(model in eval mode, tokenizer) from a directory, via the Auto* classes."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    model.eval()
    return model, tokenizer
