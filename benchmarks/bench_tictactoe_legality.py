"""How well does a TicTacToe warm start read the board? The probe behind issue 50's self-play
diagnosis (docs/agents.md, "What it measured").

Self-play trains a seat away from the moves that lost. Under a softmax, the probability taken off
a move goes to the other moves in proportion to what they had, so a model that puts mass on cells
already taken drifts onto them: its games end on refused moves instead of getting better. This
script measures that mass where the teacher's games go: for each position of TextArena
TicTacToe-v0 games played by data/tictactoe_teacher.py (the kit's own mix, fresh seeds), the
model's probability of each of the nine moves "[0]".."[8]" after the conversation so far (laid out
with the tokenizer's chat template, as the rollout lays it out), and how much of it falls on cells
that are taken. Prints a table and writes benchmarks/results/tictactoe_legality.json.

    python benchmarks/bench_tictactoe_legality.py builtin:tiny-tictactoe
    python benchmarks/bench_tictactoe_legality.py RUN/checkpoints/step_100/model other/model --games 60
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent
console = Console(width=160)


def move_probabilities(model, tok, messages: list[dict[str, str]]) -> torch.Tensor:
    """P(move k) for k in 0..8: the product of the move's token probabilities after the prompt."""
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    moves = [tok.encode(f"[{k}]", add_special_tokens=False) for k in range(9)]
    logps = []
    with torch.no_grad():
        for move in moves:
            x = torch.cat([ids, torch.tensor([move])], dim=1)
            out = model(x).logits.log_softmax(-1)[0]
            logps.append(sum(out[ids.shape[1] - 1 + j, t].item() for j, t in enumerate(move)))
    return torch.tensor(logps).exp()


def probe(model_dir: str, games: int, seed: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_graph.data import tictactoe_teacher as tt
    from areal_graph.modelkit.builtin import resolve_model_path

    path = resolve_model_path(model_dir) if model_dir.startswith("builtin:") else model_dir
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    rng = random.Random(seed)
    sides = [s for i in range(games) for s in tt.teacher_game(10**6 + i, 0.3, rng, ("self", "random")[i % 2])]
    illegal, habit = [], []
    for side in sides:
        messages = [{"role": "user", "content": side["question"]}]
        for msg in side["messages"]:
            if msg["role"] == "assistant":
                listed = messages[-1]["content"].rsplit("Available Moves:", 1)[1]
                legal = [int(k) for k in re.findall(r"'\[(\d)\]'", listed)]
                p = move_probabilities(model, tok, messages)
                illegal.append(1.0 - p[legal].sum().item())
                habit.append(p[legal[-1]].item())
            messages.append(msg)
    return {
        "model": model_dir,
        "positions": len(illegal),
        "illegal_mass_mean": statistics.mean(illegal),
        "illegal_mass_median": statistics.median(illegal),
        "positions_over_10pct_illegal": sum(x > 0.1 for x in illegal) / len(illegal),
        "last_free_mass_mean": statistics.mean(habit),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="model directories or builtin:NAME")
    ap.add_argument("--games", type=int, default=30, help="teacher games (seats of both kinds) probed")
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args(argv)
    results = [probe(m, args.games, args.seed) for m in args.models]
    table = Table(title="probability on taken cells, at the teacher's positions")
    for col in ("model", "positions", "mean", "median", "positions > 10%", "on the last free cell"):
        table.add_column(col)
    for r in results:
        table.add_row(
            r["model"],
            str(r["positions"]),
            f"{r['illegal_mass_mean']:.1%}",
            f"{r['illegal_mass_median']:.1%}",
            f"{r['positions_over_10pct_illegal']:.0%}",
            f"{r['last_free_mass_mean']:.1%}",
        )
    console.print(table)
    dest = ROOT / "results" / "tictactoe_legality.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(results, indent=2) + "\n")
    console.print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
