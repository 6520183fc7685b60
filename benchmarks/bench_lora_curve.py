"""LoRA RL beside full fine-tuning at a matched budget, over seeds (issue 21).

Each cell is a real `areal-graph run` of the shipped async workflow: the same steps, batch,
group size, data and evaluation, with only the trained weights changed. Full fine-tuning uses
the workflow's learning rate; LoRA (r 8, alpha 16, q/k/v/o, adapter-only weight sync) uses
`--lora-lr`, since adapters starting at zero need a larger step than a whole model (peft's and
TRL's LoRA recipes use 10-100x the full fine-tuning rate). Cells are interleaved (seed, then
method) so that machine noise spreads over both.

    python benchmarks/bench_lora_curve.py                      # 3 seeds x 100 steps, ~12 min on 2 cores
    python benchmarks/bench_lora_curve.py --seeds 1 --steps 30  # a quick look

Prints greedy test accuracy at steps 0, 25%, 50%, 75% and 100% (mean and range over seeds),
the weight-sync bytes and time per step and the wall time; writes
benchmarks/results/lora_curve.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from areal_graph.runtime.observability.run_dir import METRICS_FILENAME, read_metrics_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_staleness_ablation import RESULTS, ROOT, run_cell  # noqa: E402  (the same `areal-graph run` cell)


def methods(lora_lr: float) -> dict[str, list[str]]:
    return {
        "full fine-tuning": [],
        "LoRA r8": ["models.actor.lora.r=8", "models.actor.lora.alpha=16", f"models.actor.train.lr={lora_lr}"],
    }


def sync_stats(run_dir: Path) -> dict[str, float | None]:
    """Mean weight-sync bytes and seconds per step, from the run's metrics."""
    rows = read_metrics_file(run_dir / METRICS_FILENAME).records

    def mean(key: str) -> float | None:
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        return statistics.fmean(vals) if vals else None

    return {"sync_bytes": mean("weight_sync/bytes"), "sync_s": mean("time/weight_sync")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workflow", type=Path, default=ROOT / "workflows" / "ppo_async.yaml")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--eval-size", type=int, default=128)
    ap.add_argument("--lora-lr", type=float, default=5e-4)
    ap.add_argument("--out", type=Path, default=RESULTS / "lora_curve.json")
    args = ap.parse_args()

    cells: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="lora-curve-") as tmp:
        for seed in range(1, args.seeds + 1):
            for name, extra in methods(args.lora_lr).items():
                overrides = [
                    *extra,
                    f"runtime.seed={seed}",
                    f"runtime.steps={args.steps}",
                    f"runtime.eval_every={max(args.steps // 4, 1)}",
                    f"data.eval_size={args.eval_size}",
                    "runtime.save_every=0",
                ]
                run_dir = Path(tmp) / f"{name.split()[0]}-{seed}"
                cell = {
                    "method": name,
                    "seed": seed,
                    **run_cell(args.workflow, overrides, run_dir),
                    **sync_stats(run_dir),
                }
                cells.append(cell)
                Console().print(
                    f"{name} seed {seed}: {[round(a, 3) for _, a in cell['curve']]} ({cell['wall_s']:.0f} s)"
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"steps": args.steps, "seeds": args.seeds, "lora_lr": args.lora_lr, "cells": cells}, indent=1)
    )
    table = Table(title=f"greedy test accuracy, {args.seeds} seed(s) x {args.steps} steps (mean [min, max])")
    for col in ("method", *[f"step {s}" for s, _ in cells[0]["curve"]], "sync bytes/step", "sync s/step", "wall s"):
        table.add_column(col)
    for name in methods(args.lora_lr):
        mine = [c for c in cells if c["method"] == name]
        cols = []
        for k in range(len(mine[0]["curve"])):
            accs = [c["curve"][k][1] for c in mine]
            cols.append(f"{statistics.fmean(accs):.1%} [{min(accs):.1%}, {max(accs):.1%}]")

        def fmt(key, f, mine=mine):
            return f(statistics.fmean([c[key] for c in mine])) if all(c[key] is not None for c in mine) else "-"

        table.add_row(
            name,
            *cols,
            fmt("sync_bytes", lambda v: f"{v / 1e6:.2f} MB"),
            fmt("sync_s", lambda v: f"{v * 1e3:.1f} ms"),
            fmt("wall_s", lambda v: f"{v:.0f}"),
        )
    Console().print(table)
    Console().print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
