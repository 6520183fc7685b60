"""A tiny model (hidden 64, 2 layers) fitted to one calculator episode with a tiny-calc-style
tokenizer (the tool chat template and `<tool_call>` tokens): greedy decoding replays the
episode, so a real engine makes a real tool call in a few seconds, without building the
builtin kit (minutes). The MCP tool agent's tests use it for token-exact checks and for a short
whole run of workflows/agent_calculator_mcp.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def build_memorised_calc(root: Path) -> tuple[Path, dict[str, Any], tuple[list[int], list[int]]]:
    """Into `root`: model/ (model + tokenizer) and test.jsonl/train.jsonl (the one row). Returns
    (root, the row, (the episode's token ids, its SFT labels: IGNORE off the policy's tokens))."""
    from areal_graph.data.arith import write_jsonl
    from areal_graph.data.calc import encode_teacher_row, generate, teacher_conversations, tokenizer_corpus
    from areal_graph.modelkit.tiny_model import TinyModelConfig, build_tiny_model, save_model_and_tokenizer
    from areal_graph.modelkit.tokenizer import train_tokenizer
    from areal_graph.modelkit.warm_start import SFTConfig, sft

    rows = generate(seed=5, n=200)
    tokenizer = train_tokenizer(tokenizer_corpus(teacher_conversations(rows, (0.5, 0.5, 0.5), 0)), 400, tools=True)
    row = next(r for r in rows if "+" not in r["expression"])
    [sft_row] = teacher_conversations([row], (0.0, 0.0, 0.0), 0)  # always the tool
    model = build_tiny_model(
        tokenizer,
        TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128),
        seed=0,
    )
    sft(
        model,
        tokenizer,
        [sft_row] * 4,
        SFTConfig(steps=120, batch_size=4, lr=1e-2, warmup_steps=5),
        encode=encode_teacher_row,
    )
    save_model_and_tokenizer(model, tokenizer, root / "model")
    write_jsonl([row], root / "test.jsonl")
    write_jsonl([row] * 8, root / "train.jsonl")
    return root, row, encode_teacher_row(tokenizer, sft_row)
