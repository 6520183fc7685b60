"""Speculative decoding in the embedded engine, on against off, on the RL step's request mix.

For each shipped kit's workflow (ppo_async: tiny-arith; ppo_async_longtail: tiny-arith-long;
ppo_async_testbed: tiny-arith-ladder), the engine gets what an RL step gives it: prompts from
the kit's training set, `group_size` answers each (8), sampled at the workflow's temperature
with its `max_new_tokens`, seeded. Measured, interleaved (off, on, off, on, ...) so that a
shared machine's load hits both sides alike:

- **rows 1, 8 and 64**: the engine may run that many requests at once (`max_running`); 64
  requests (8 prompts x 8 answers) are submitted together. At 1 row the answers run one after
  another, so each finds its group's earlier answers: the tail of a step, where few rows are
  left and most of their group has finished.
- **step**: one whole step's generation, `batch_size` answers (4 prompts x 8) at the
  workflow's `max_running_requests`, from submission to the last answer (the tail included).

Each side keeps one engine per cell, as a run keeps its engine across steps: it is warmed on
one batch of other prompts (the speculation policy measures its costs there), then measured on
fresh batches, so no batch finds answers to its own prompts from an earlier one (`history`
would then flatter it). Every pair is checked token for token (the same seeds give the same answers with and without
speculation), and each row reports tokens/s, the speed-up, tokens per row and verifying forward,
and the accepted share of proposed tokens by source.

    python benchmarks/bench_speculative.py              # 3 interleaved repeats, best of each side
    python benchmarks/bench_speculative.py --quick      # 2 repeats, tiny-arith-ladder only

Prints a table and writes benchmarks/results/speculative[_quick].json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from areal_graph.data.datasets import load_prompts
from areal_graph.engines.inference.engine import EmbeddedEngine
from areal_graph.engines.inference.sampling import SamplingParams
from areal_graph.engines.inference.speculation.drafts import SOURCES
from areal_graph.engines.inference.speculation.speculator import SpeculativeSettings
from areal_graph.graph.loader import load_workflow
from areal_graph.modelkit.kit_cache import ensure_kit
from areal_graph.modelkit.recipes import BUILTIN_KITS

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
WORKFLOWS = {
    "tiny-arith": "ppo_async.yaml",
    "tiny-arith-long": "ppo_async_longtail.yaml",
    "tiny-arith-ladder": "ppo_async_testbed.yaml",
}


def kit_workload(kit_name: str) -> dict:
    """The kit's model, its training prompts, and the workflow's sampling and step size."""
    spec = load_workflow(ROOT.parent / "workflows" / WORKFLOWS[kit_name])
    rollout = next(n for n in spec.nodes.values() if n.kind == "rollout")
    kit = ensure_kit(BUILTIN_KITS[kit_name])
    model = str(kit.path / "model")
    probe = EmbeddedEngine(model)
    prompts, _ = load_prompts(kit.path / "data" / "train.jsonl", probe.tokenizer)
    sampling = rollout.params.sampling
    return {
        "model": model,
        "prompts": [p.input_ids for p in prompts],
        "group": int(rollout.params.group_size),
        "temperature": float(sampling.temperature),
        "max_new_tokens": int(sampling.max_new_tokens),
        "batch_size": spec.runtime.batch_size,
        "max_running": spec.inference.max_running_requests,
    }


def run_batch(engine: EmbeddedEngine, work: dict, answers: int, offset: int) -> dict:
    """Submit `answers` (answers // group prompts from `offset`, `group` seeded answers each)
    together and wait for the last; tokens/s over that wall."""
    group = work["group"]
    prompts = work["prompts"][offset : offset + answers // group]
    reqs = [
        (p, SamplingParams(max_new_tokens=work["max_new_tokens"], temperature=work["temperature"], seed=1000 * i + a))
        for i, p in enumerate(prompts)
        for a in range(group)
    ]
    before = dict(engine.stats().get("speculative") or {})
    t0, c0 = time.perf_counter(), time.process_time()
    futures = [engine.submit(ids, p) for ids, p in reqs]
    results = [f.result() for f in futures]
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(len(r.output_ids) for r in results)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "tok_cpu_s": tokens / cpu,
        "tokens": tokens,
        "tok_s": tokens / wall,
        "ids": [r.output_ids for r in results],
        **_since(before, engine.stats().get("speculative") or {}),
    }


def _since(before: dict, after: dict) -> dict:
    """The speculation counts of one batch: the engine's cumulative counts minus those before it."""
    if not after:
        return {}
    out = {k: after[k] - before.get(k, 0) for k in ("steps", "row_steps", "fed", "emitted")}
    for k in ("proposed", "accepted"):
        out[k] = {s: after[k][s] - before.get(k, {}).get(s, 0) for s in SOURCES}
    return out


def measure(work: dict, answers: int, rows: int, repeats: int, offset: int) -> dict:
    """Two long-lived engines (off, on), as a run keeps its engine across steps: each is warmed
    with one batch of other prompts (the speculation policy measures its costs there), then
    measured on `repeats` fresh batches, interleaved; no batch repeats a prompt, so answers to
    the same prompt from an earlier batch (the `history` source) never help."""
    group = work["group"]
    per = max(1, answers // group)
    engines = {
        spec: EmbeddedEngine(work["model"], max_running=rows, speculative=SpeculativeSettings(enabled=spec))
        for spec in (False, True)
    }
    off, on = [], []
    with engines[False], engines[True]:
        for spec in (False, True):
            run_batch(engines[spec], work, answers, offset)  # warm-up
        for i in range(repeats):  # interleaved: the machine's load hits both sides alike
            at = offset + per * (i + 1)
            off.append(run_batch(engines[False], work, answers, at))
            on.append(run_batch(engines[True], work, answers, at))
            if on[-1]["ids"] != off[-1]["ids"]:
                raise AssertionError(f"speculation changed the answers at {rows} rows: it must not")
    best_off = max(off, key=lambda r: r["tok_s"])
    best_on = max(on, key=lambda r: r["tok_s"])
    proposed = {s: sum(r.get("proposed", {}).get(s, 0) for r in on) for s in SOURCES}
    accepted = {s: sum(r.get("accepted", {}).get(s, 0) for r in on) for s in SOURCES}
    return {
        "rows": rows,
        "answers": answers,
        "off_tok_s": best_off["tok_s"],
        "on_tok_s": best_on["tok_s"],
        "speedup": best_on["tok_s"] / best_off["tok_s"],
        "median_speedup": sorted(b["tok_s"] / a["tok_s"] for a, b in zip(off, on))[len(on) // 2],
        # tokens per CPU-second of this process (the engine's thread does the work): on a shared
        # machine other processes stretch the wall time, much less the CPU time
        "cpu_speedup": max(b["tok_cpu_s"] for b in on) / max(a["tok_cpu_s"] for a in off),
        "off_wall_s": best_off["wall_s"],
        "on_wall_s": best_on["wall_s"],
        "tokens": best_on["tokens"],
        # emitted per row and verifying forward, over the measured batches (1.0: none verified)
        "tokens_per_forward": sum(r.get("emitted", 0) for r in on) / max(1, sum(r.get("row_steps", 0) for r in on))
        if any(r.get("row_steps") for r in on)
        else 1.0,
        "verify_steps": sum(r.get("steps", 0) for r in on),
        "acceptance_by_source": {s: (accepted[s] / proposed[s] if proposed[s] else None) for s in SOURCES},
        "proposed_by_source": proposed,
        "all_speedups": [b["tok_s"] / a["tok_s"] for a, b in zip(off, on)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="two repeats, the testbed kit only")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the shipped workflows give small models 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    kits = ["tiny-arith-ladder"] if args.quick else list(WORKFLOWS)
    repeats = 2 if args.quick else args.repeats
    console = Console()
    out = {"threads": args.threads, "repeats": repeats, "kits": {}}
    table = Table(title="Speculative decoding: on against off (same answers, token for token)")
    for col in (
        "kit",
        "rows",
        "off tok/s",
        "on tok/s",
        "speed-up",
        "CPU-time speed-up",
        "tokens/forward",
        "accepted: self/prompt/group/history",
    ):
        table.add_column(col, justify="right" if col != "kit" else "left")
    for name in kits:
        work = kit_workload(name)
        cells = [measure(work, 64, rows, repeats, offset=0) for rows in (1, 8, 64)]
        step = measure(work, work["batch_size"], work["max_running"], repeats, offset=0)
        cells.append({**step, "rows": "step"})
        out["kits"][name] = {"workflow": WORKFLOWS[name], "cells": cells}
        for c in cells:
            acc = "/".join("-" if v is None else f"{v:.0%}" for v in c["acceptance_by_source"].values())
            table.add_row(
                name,
                str(c["rows"]),
                f"{c['off_tok_s']:.0f}",
                f"{c['on_tok_s']:.0f}",
                f"{c['speedup']:.2f}x",
                f"{c['cpu_speedup']:.2f}x",
                f"{c['tokens_per_forward']:.2f}",
                acc,
            )
    console.print(table)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / ("speculative_quick.json" if args.quick else "speculative.json")
    path.write_text(json.dumps(out, indent=1))
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
