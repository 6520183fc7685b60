"""Asynchronous vs synchronous RL on the same workload.

Each configuration is a real `areal-graph run` (subprocesses, gRPC, embedded inference
server) of workflows/ppo_async.yaml with the same model, steps, batch and cores; only
`runtime.max_staleness` changes. The staleness ablation (eta 0-16, naive vs decoupled PPO,
seeds) is benchmarks/bench_staleness_ablation.py. Output lengths are
long-tailed because sampling is at temperature 1 with a generous max_new_tokens.

    python benchmarks/bench_async_vs_sync.py            # sync vs async (eta=4)
    python benchmarks/bench_async_vs_sync.py --quick    # a few steps, to check it works
    python benchmarks/bench_async_vs_sync.py --steps 100 --set models.actor.device=cuda \
        --set inference.args.device=cuda --out gpu_async_vs_sync.json   # one GPU, time-shared
    python benchmarks/bench_async_vs_sync.py --workflow workflows/ppo_async_longtail.yaml  # long-tailed
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from areal_graph.runtime.observability.run_dir import METRICS_FILENAME, read_metrics_file

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def run_config(
    label: str, overrides: list[str], workdir: Path, workflow: Path = ROOT / "workflows" / "ppo_async.yaml"
) -> dict:
    run_dir = workdir / label
    cmd = [sys.executable, "-m", "areal_graph.cli.main", "run", str(workflow), *overrides, "--run-dir", str(run_dir)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{label} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    metrics = read_metrics_file(run_dir / METRICS_FILENAME).records
    accs = [m["eval/accuracy"] for m in metrics if "eval/accuracy" in m]
    steps = [m for m in metrics if "time/step" in m]
    train_time = sum(m["time/step"] for m in steps)
    return {
        "label": label,
        "overrides": overrides,
        "wall_s": wall,
        "initial_accuracy": accs[0] if accs else None,
        "final_accuracy": accs[-1] if accs else None,
        "mean_reward_last10": sum(m["reward/mean"] for m in steps[-10:]) / max(len(steps[-10:]), 1),
        "mean_staleness": sum(m.get("staleness/mean", 0.0) for m in steps) / max(len(steps), 1),
        "train_time_s": train_time,
        "steps": len(steps),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 steps per configuration")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--workflow", type=Path, default=ROOT / "workflows" / "ppo_async.yaml")
    ap.add_argument(
        "--set",
        dest="extra",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override for both runs, e.g. models.actor.device=cuda (repeatable)",
    )
    ap.add_argument("--eval-size", type=int, default=500, help="greedy-evaluated test problems at start and end")
    ap.add_argument("--out", default="async_vs_sync.json", help="JSON name under benchmarks/results/, or a path")
    args = ap.parse_args()
    steps = 4 if args.quick else args.steps
    common = [
        f"runtime.steps={steps}",
        f"runtime.eval_every={steps}",
        f"data.eval_size={args.eval_size}",
        "runtime.save_every=0",
        *args.extra,
    ]

    configs = [("sync", common + ["runtime.max_staleness=0"]), ("async", common + ["runtime.max_staleness=4"])]

    console = Console()
    rows = []
    with tempfile.TemporaryDirectory(prefix="areal-bench-") as tmp:
        for label, overrides in configs:
            console.print(f"running {label} ...")
            rows.append(run_config(label, overrides, Path(tmp), args.workflow))
    base = rows[0]
    table = Table(title=f"async vs sync RL, {args.workflow.name} (same workload; ratios are from this one run)")
    for col in ("config", "wall s", "speedup vs sync", "acc start -> end", "reward (last 10)", "mean staleness"):
        table.add_column(col, justify="right")
    for r in rows:
        r["speedup_vs_sync"] = base["wall_s"] / r["wall_s"]
        table.add_row(
            r["label"],
            f"{r['wall_s']:.0f}",
            f"{r['speedup_vs_sync']:.2f}x",
            "-" if r["final_accuracy"] is None else f"{r['initial_accuracy']:.3f} -> {r['final_accuracy']:.3f}",
            f"{r['mean_reward_last10']:.3f}",
            f"{r['mean_staleness']:.2f}",
        )
    console.print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if "/" in args.out else RESULTS / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"steps": steps, "workflow": args.workflow.name, "overrides": args.extra, "results": rows}, indent=2)
    )
    console.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
