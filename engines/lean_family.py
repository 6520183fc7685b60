"""Which models the lean forwards (engines/inference/lean_forward.py for decoding,
engines/training/lean_train.py for training) can run: one rule for both.

Both forwards reimplement the Qwen2 / Qwen3 / Llama decoder without HF's module stack, so
both rest on the same facts about a model's configuration; each adds checks of its own
(the module types its fast path reads)."""

from __future__ import annotations

from typing import Any

SUPPORTED = {"Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM"}
STATIC_ROPE = {"default", "linear", "llama3", "yarn"}  # inv_freq fixed after init: a table is exact


def family_reason(model: Any) -> str | None:
    """Why `model`'s architecture or configuration is outside the lean family (None: inside)."""
    name = type(model).__name__
    if name not in SUPPORTED:
        return f"architecture {name} is not in the lean family {sorted(SUPPORTED)}"
    cfg = model.config
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return "sliding-window layers"
    if getattr(cfg, "use_sliding_window", False):
        return "sliding-window attention"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"MLP activation {cfg.hidden_act!r}"
    if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    rope = getattr(model.model.rotary_emb, "rope_type", "default")
    if rope not in STATIC_ROPE:
        return f"rope type {rope!r} (its frequencies change with the sequence length)"
    return None
