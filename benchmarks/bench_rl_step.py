"""The RL-step generation workload: the embedded engine vs HF `generate`, as TRL's GRPOTrainer runs it.

Run through `python benchmarks/bench_generation.py --rl-step` (options there).

One round = one training step's generation: 4 prompts of the builtin kit's training set
(chat template applied, ~20-30 tokens) x 8 answers, all 32 requests submitted at once,
temperature 1.0, top-p 1, no top-k, at most 64 new tokens, stop at EOS.
- engine: `EmbeddedEngine.submit` x 32 from this (main) thread, every request with its own
  seed (so its tokens do not depend on the batch), then all 32 futures awaited.
- HF: `model.generate` on the 32 prompts left-padded into one batch (`do_sample=True`, the
  same settings), as TRL's GRPOTrainer does; it stops when every row has hit EOS.
Both sides count generated tokens up to and including each answer's EOS; tokens/s is that
count over the round's wall time. Both sides use the same model object.

Each thread count gets its own engine, started after `torch.set_num_threads(n)`: a torch
worker thread fixes its OpenMP thread count at its first parallel op, so an engine started
under one setting keeps it. Rounds interleave the sides (order alternating per round) and
each round uses new prompts, the same for every side; the ratios are taken per round, then
their median (the machine is shared and noisy). CPU time is the process's, which is only
the side being measured (the other is idle).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from areal_graph.engines.inference.engine import EmbeddedEngine
from areal_graph.engines.inference.sampling import SamplingParams

PROMPTS_PER_STEP, ANSWERS = 4, 8
MAX_NEW = 64


def load_kit() -> tuple[Any, Any, list[list[int]], str]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_graph.data.datasets import load_prompts
    from areal_graph.modelkit.builtin import resolve_dataset_path, resolve_model_path

    path = resolve_model_path("builtin:tiny-arith")
    tok = AutoTokenizer.from_pretrained(path)
    prompts, _ = load_prompts(resolve_dataset_path("builtin:arith/train"), tok)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, tok, [p.input_ids for p in prompts], str(path)


def step_prompts(prompts: list[list[int]], r: int) -> list[list[int]]:
    """Round r's 32 requests: 4 consecutive prompts, each repeated 8 times (identical token ids)."""
    chunk = prompts[r * PROMPTS_PER_STEP : (r + 1) * PROMPTS_PER_STEP]
    return [list(p) for p in chunk for _ in range(ANSWERS)]


def _answer_len(row: list[int], eos: set[int]) -> int:
    for i, t in enumerate(row):
        if t in eos:
            return i + 1
    return len(row)


def run_hf(model, ids: list[list[int]], pad: int, eos: set[int], seed: int) -> tuple[float, float, int]:
    """One step with HF generate on the left-padded batch; (wall s, CPU s, tokens up to EOS)."""
    width = max(len(x) for x in ids)
    inp = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros_like(inp)
    for j, x in enumerate(ids):
        inp[j, width - len(x) :] = torch.tensor(x)
        mask[j, width - len(x) :] = 1
    torch.manual_seed(seed)
    c0, t0 = time.process_time(), time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=inp,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=MAX_NEW,
            pad_token_id=pad,
        )
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall, cpu, sum(_answer_len(row, eos) for row in out[:, width:].tolist())


def run_engine(eng: EmbeddedEngine, ids: list[list[int]], seed: int) -> tuple[float, float, int]:
    """One step through `submit` x 32 and waiting on every future; (wall s, CPU s, tokens)."""
    c0, t0 = time.process_time(), time.perf_counter()
    futs = [
        eng.submit(x, SamplingParams(max_new_tokens=MAX_NEW, temperature=1.0, top_p=1.0, seed=seed * 1000 + j))
        for j, x in enumerate(ids)
    ]
    res = [f.result() for f in futs]
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall, cpu, sum(len(r.output_ids) for r in res)


def _sides(model, path: str, pad: int, eos: set[int], ablate: bool) -> dict[str, Callable]:
    """The measured sides, each a function (ids, seed) -> (wall, cpu, tokens); engines start here."""
    variants = {"engine": {}}
    if ablate:
        variants["engine, HF forward"] = {"lean_forward": False}
        variants["engine, no prefix sharing"] = {"prefix_sharing": False}
        variants["engine, neither"] = {"lean_forward": False, "prefix_sharing": False}
    sides: dict[str, Callable] = {"HF generate": lambda ids, seed: run_hf(model, ids, pad, eos, seed)}
    for name, kw in variants.items():
        eng = EmbeddedEngine(path, model=model, max_running=64, seed=0, **kw)
        eng.start()
        sides[name] = lambda ids, seed, eng=eng: run_engine(eng, ids, seed)
        sides[name].engine = eng  # type: ignore[attr-defined]
    return sides


def measure(threads: int, rounds: int, ablate: bool, model, path, prompts, pad, eos, offset: int) -> dict:
    """Interleaved rounds at `threads`; per side medians and per-round ratios against HF."""
    torch.set_num_threads(threads)
    sides = _sides(model, path, pad, eos, ablate)
    names = list(sides)
    for w in range(3):  # warm-up: allocator, rope tables, first-call paths
        for name in names:
            sides[name](step_prompts(prompts, offset + w), w)
    raw: dict[str, list[tuple[float, float, int]]] = {n: [] for n in names}
    for r in range(rounds):
        ids = step_prompts(prompts, offset + 3 + r)
        for name in names if r % 2 == 0 else names[::-1]:
            raw[name].append(sides[name](ids, 100 + r))
    for fn in sides.values():
        if hasattr(fn, "engine"):
            fn.engine.stop()
    out: dict[str, Any] = {"threads": threads, "rounds": rounds, "sides": {}}
    hf = raw["HF generate"]
    for name in names:
        rows = raw[name]
        out["sides"][name] = {
            "s_per_step_median": statistics.median(w for w, _, _ in rows),
            "cpu_s_per_step_median": statistics.median(c for _, c, _ in rows),
            "tokens_per_step_mean": statistics.mean(n for _, _, n in rows),
            "tok_s_median": statistics.median(n / w for w, _, n in rows),
            "speedup_tok_s_median": statistics.median((n / w) / (hn / hw) for (w, _, n), (hw, _, hn) in zip(rows, hf)),
            "speedup_cpu_median": statistics.median((hc / hn) / (c / n) for (_, c, n), (_, hc, hn) in zip(rows, hf)),
            "raw": rows,
        }
    return out


def main_rl_step(args: Any, results_dir: Path) -> int:
    console = Console(width=150)
    model, tok, prompts, path = load_kit()
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    eos = set(EmbeddedEngine(path, model=model).eos_token_ids)
    counts = [int(x) for x in args.thread_counts.split(",")]
    lens = [len(p) for p in prompts[:400]]
    console.print(
        f"RL step: {PROMPTS_PER_STEP} prompts x {ANSWERS} answers, prompt tokens median "
        f"{statistics.median(lens)}, max_new_tokens {MAX_NEW}, T=1, {args.rounds} rounds per thread count"
    )
    res: dict[str, Any] = {
        "workload": "rl_step",
        "prompts_per_step": PROMPTS_PER_STEP,
        "answers": ANSWERS,
        "max_new_tokens": MAX_NEW,
        "runs": [],
    }
    for i, n in enumerate(counts):
        res["runs"].append(
            measure(n, args.rounds, args.ablate, model, path, prompts, pad, eos, offset=i * (args.rounds + 3))
        )
    table = Table(title="RL step (4 x 8 identical prompts, T=1, <= 64 new tokens): engine vs HF generate")
    for col in (
        "threads",
        "side",
        "s/step (median)",
        "CPU s/step",
        "tokens/step",
        "tok/s (median)",
        "tok/s vs HF (median of rounds)",
        "CPU-time vs HF",
    ):
        table.add_column(col, justify="right" if col not in ("side",) else "left")
    for run in res["runs"]:
        for name, m in run["sides"].items():
            table.add_row(
                str(run["threads"]),
                name,
                f"{m['s_per_step_median']:.3f}",
                f"{m['cpu_s_per_step_median']:.3f}",
                f"{m['tokens_per_step_mean']:.0f}",
                f"{m['tok_s_median']:.0f}",
                f"{m['speedup_tok_s_median']:.2f}x",
                f"{m['speedup_cpu_median']:.2f}x",
            )
    console.print(table)
    results_dir.mkdir(parents=True, exist_ok=True)
    out = results_dir / "generation_rl_step.json"
    out.write_text(json.dumps(res, indent=2))
    console.print(f"wrote {out}")
    return 0
