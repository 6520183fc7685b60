"""The AReaL paper's staleness ablation, on our own runs: naive PPO vs the decoupled objective as eta grows.

Naive PPO centres its trust region on the behaviour policy (`loss: ppo`): on stale data the
clip binds against an old policy and cuts the gradient of the tokens that changed most. The
decoupled objective (`loss: decoupled_ppo`) centres it on pi_prox, the trainer's policy before
the step, and corrects for the behaviour policy with w = pi_prox / pi_behav; a correction
(`is_correction`) bounds w. The paper's claim: naive PPO degrades as max staleness grows,
the decoupled objective holds.

Each cell is a real `areal-graph run` of a workflow (default workflows/ppo_async.yaml) with
`runtime.max_staleness` = eta. Staleness only happens if the generator can run ahead: with
the shipped 64 concurrent rollouts (2 batches) a trajectory is at most ~2 versions old
whatever eta allows, so each cell sets `runtime.max_concurrent_rollouts` and the engine's
`inference.max_running_requests` to (eta + 1) x batch, making eta the binding limit.
Configurations are interleaved (seed, then eta, then method) so that machine noise spreads
over all of them; results accumulate in the JSON, and `--resume` skips cells already there.

    python benchmarks/bench_staleness_ablation.py                       # the shipped workflow
    python benchmarks/bench_staleness_ablation.py --regime stress       # where staleness hurts (see REGIMES)
    python benchmarks/bench_staleness_ablation.py --etas 0,4 --seeds 1 --steps 40   # a quick look

Prints a table (greedy test accuracy a quarter of the way and at the end, mean reward over the
run = the reward curve's area, wall time, measured staleness; the JSON adds the stale tokens'
train/inference gap and the clipped share) and writes
benchmarks/results/staleness_ablation_<regime>.json and, with matplotlib, a PNG beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from areal_graph.runtime.observability.run_dir import METRICS_FILENAME, read_metrics_file

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

METHODS: dict[str, list[str]] = {
    "naive PPO": ["nodes.train.loss=ppo"],
    "decoupled": ["nodes.train.loss=decoupled_ppo"],
    "decoupled+icepop": ["nodes.train.loss=decoupled_ppo", "nodes.train.is_correction=icepop"],
}
# Overrides on top of the workflow. "shipped": as users run it. "stress": more policy change
# per version (lr 5x, 4 PPO minibatches per step), the regime where the paper's gap shows.
REGIMES: dict[str, list[str]] = {
    "shipped": [],
    "stress": ["models.actor.train.lr=1.0e-4", "nodes.train.ppo_minibatches=4"],
}


def cell_overrides(eta: int, method: str, seed: int, steps: int, eval_size: int, batch: int) -> list[str]:
    concurrency = (eta + 1) * batch
    return [
        *METHODS[method],
        f"runtime.max_staleness={eta}",
        f"runtime.seed={seed}",
        f"runtime.steps={steps}",
        f"runtime.eval_every={max(steps // 4, 1)}",
        f"data.eval_size={eval_size}",
        "runtime.save_every=0",
        f"runtime.max_concurrent_rollouts={concurrency}",
        f"inference.max_running_requests={concurrency}",
    ]


def run_cell(workflow: Path, overrides: list[str], run_dir: Path) -> dict:
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier invocation's cell (a cell not in --out is rerun)
    cmd = [sys.executable, "-m", "areal_graph.cli.main", "run", str(workflow), *overrides, "--run-dir", str(run_dir)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{run_dir.name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    metrics = read_metrics_file(run_dir / METRICS_FILENAME).records
    curve = [(m.get("step", 0), m["eval/accuracy"]) for m in metrics if "eval/accuracy" in m]
    accs = [a for _, a in curve]
    steps = [m for m in metrics if "reward/mean" in m]
    mean = lambda key: statistics.fmean([m[key] for m in steps if key in m]) if any(key in m for m in steps) else None  # noqa: E731
    return {
        "before": accs[0],
        "after": accs[-1],
        "early": accs[1] if len(accs) > 2 else None,
        "curve": curve,
        "reward_auc": mean("reward/mean"),
        "wall_s": wall,
        "staleness_mean": mean("staleness/mean"),
        "staleness_max": max((m.get("staleness/max", 0) for m in steps), default=0),
        "stale_share": mean("train/mismatch/stale/share"),
        "stale_gap": mean("train/mismatch/stale/abs_mean"),
        "fresh_gap": mean("train/mismatch/fresh/abs_mean"),
        "clipped": mean("train/clipped"),
        "steps": len(steps),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workflow", type=Path, default=ROOT / "workflows" / "ppo_async.yaml")
    ap.add_argument("--regime", choices=sorted(REGIMES), default="shipped")
    ap.add_argument("--etas", default="0,1,2,4,8,16", help="max staleness values, comma-separated")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated among: {', '.join(METHODS)}")
    ap.add_argument("--seeds", default="1,2,3", help="RL seeds, comma-separated (default 1,2,3)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-size", type=int, default=500)
    ap.add_argument("--batch", type=int, default=32, help="the workflow's runtime.batch_size (sets the concurrency)")
    ap.add_argument(
        "--set",
        dest="extra",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more override for every cell (repeatable); recorded in the JSON",
    )
    ap.add_argument("--resume", action="store_true", help="skip cells already in the JSON (same regime, overrides)")
    ap.add_argument(
        "--out", type=Path, default=None, help="JSON path (default benchmarks/results/staleness_ablation_<regime>.json)"
    )
    ap.add_argument("--runs", type=Path, default=RESULTS / "ablation_runs", help="where run directories go")
    args = ap.parse_args()
    etas = [int(x) for x in args.etas.split(",") if x]
    seeds = [int(x) for x in args.seeds.split(",") if x]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        ap.error(f"unknown method(s) {unknown}; choose among {list(METHODS)}")
    out = args.out or RESULTS / f"staleness_ablation_{args.regime}.json"
    extra = REGIMES[args.regime] + args.extra
    done = json.loads(out.read_text()) if args.resume and out.exists() else {"cells": []}
    if done.get("extra", extra) != extra or done.get("steps", args.steps) != args.steps:
        ap.error(
            f"{out} holds cells of other settings ({done.get('extra')}, {done.get('steps')} steps); "
            "use another --out or drop --resume"
        )
    have = {(c["eta"], c["method"], c["seed"]) for c in done["cells"]}
    console = Console(width=max(Console().width, 200))
    cells = list(done["cells"])
    for seed in seeds:
        for eta in etas:
            for method in methods:
                if (eta, method, seed) in have:
                    continue
                label = f"{args.regime}-eta{eta}-{method.replace(' ', '_').replace('+', '_')}-s{seed}"
                console.print(f"{label} ...")
                r = run_cell(
                    args.workflow,
                    cell_overrides(eta, method, seed, args.steps, args.eval_size, args.batch) + extra,
                    args.runs / label,
                )
                cells.append({"eta": eta, "method": method, "seed": seed, **r})
                console.print(
                    f"  {r['before']:.1%} -> {r['after']:.1%}, reward area {r['reward_auc']:.3f}, "
                    f"staleness {r['staleness_mean'] or 0:.2f}, {r['wall_s']:.0f} s"
                )
                RESULTS.mkdir(parents=True, exist_ok=True)
                out.write_text(
                    json.dumps(
                        {
                            "regime": args.regime,
                            "extra": extra,
                            "steps": args.steps,
                            "workflow": str(args.workflow.relative_to(ROOT)),
                            "cells": cells,
                        },
                        indent=2,
                    )
                    + "\n"
                )
    print_table(console, args.regime, cells)
    png = plot(cells, out.with_suffix(".png"), args.regime)
    console.print(f"wrote {out}" + (f" and {png}" if png else " (no PNG: pip install matplotlib)"))
    return 0


def _stat(values: list[float], fmt: str = "{:.3f}") -> str:
    if not values:
        return "-"
    m = fmt.format(statistics.fmean(values))
    return m if len(values) == 1 else f"{m} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def print_table(console: Console, regime: str, cells: list[dict]) -> None:
    methods = list(dict.fromkeys(c["method"] for c in cells))
    etas = sorted({c["eta"] for c in cells})
    t = Table(
        title=f"staleness ablation ({regime}): greedy test accuracy a quarter of the way and at the end, "
        "mean reward over the run (mean over seeds, range in brackets)"
    )
    t.add_column("eta", justify="right")
    t.add_column("measured staleness", justify="right")
    for m in methods:
        t.add_column(f"{m}: accuracy at 1/4", justify="right")
        t.add_column(f"{m}: at the end", justify="right")
        t.add_column(f"{m}: reward area", justify="right")
    t.add_column("wall s (decoupled)", justify="right")
    for eta in etas:
        at = [c for c in cells if c["eta"] == eta]
        row = [str(eta), _stat([c["staleness_mean"] for c in at if c["staleness_mean"] is not None], "{:.1f}")]
        for m in methods:
            mine = [c for c in at if c["method"] == m]
            row += [
                _stat([c["early"] for c in mine if c.get("early") is not None]),
                _stat([c["after"] for c in mine]),
                _stat([c["reward_auc"] for c in mine]),
            ]
        row.append(_stat([c["wall_s"] for c in at if c["method"] == "decoupled"], "{:.0f}"))
        t.add_row(*row)
    console.print(t)


def plot(cells: list[dict], path: Path, regime: str) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for m in dict.fromkeys(c["method"] for c in cells):
        mine = [c for c in cells if c["method"] == m]
        for ax, key in zip(axes, ("early", "reward_auc")):
            have = [c for c in mine if c.get(key) is not None]
            xs = sorted({c["eta"] for c in have})
            means = [statistics.fmean([c[key] for c in have if c["eta"] == e]) for e in xs]
            (line,) = ax.plot(xs, means, marker="o", label=m)
            ax.scatter([c["eta"] for c in have], [c[key] for c in have], s=10, alpha=0.4, color=line.get_color())
    for ax, title in zip(axes, ("greedy accuracy a quarter of the way", "mean reward over the run")):
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("max staleness eta")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"staleness ablation ({regime})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
