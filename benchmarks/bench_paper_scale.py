"""The AReaL paper's cluster, on paper: the simulator on first-principles GPU costs, beside the paper.

    python benchmarks/bench_paper_scale.py            # every table (a few minutes on 2 cores)
    python benchmarks/bench_paper_scale.py --quick    # small batches and GPU counts: checks it runs

The settings are the paper's (Fu et al., NeurIPS 2025, arXiv 2505.24298; Section 7 and Appendix B
as read from the paper's text and its repository: see docs/placement.md): H800 GPUs, batches of
512 prompts x 16 answers, answers up to 27,648 tokens, max staleness 8 for math, 4 PPO
mini-batches a step (so the proximal log-probs are a separate forward: 8 x params FLOPs per
token trained), three quarters of the GPUs generating and one quarter training. What the paper
does not give is assumed and said: the answers' length distribution (lognormal around a
median of 7,000 tokens, a harder or easier prompt shifting all 16, cut at 27,648: mean ~9,500)
and how close the engines come to the hardware's roofline (perfmodel/cluster.py: the
production preset, or this project's own engine as measured on an H200).

Tables: (1) synchronous vs asynchronous on the same GPUs, against the paper's Table 1 hours;
(2) throughput from 32 to 512 GPUs (strong scaling: the batch stays 8,192 answers);
(3) throughput against max staleness, against the paper's Figure 5c; (4) the generation share
of the GPUs. Output: tables and benchmarks/results/paper_scale.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

# the paper's Table 1 (training hours, same GPUs: AReaL vs its synchronous variant) and Figure 5c
PAPER_TABLE1 = {("1.5B", 128): (41.0, 14.8), ("7B", 192): (57.7, 25.4)}
PAPER_STALENESS = {0: 128.7e3, 1: 269.3e3, 2: 356.6e3, 4: 356.6e3, 8: 371.7e3}  # effective tokens/s, 1.5B


H200_REFERENCE = ROOT / "benchmarks" / "reference" / "h200-2026-11-26"
CPU_COSTS = {"ppo_async.yaml": ROOT / "benchmarks" / "reference" / "costs-shipped-2core.json",
             "ppo_async_longtail.yaml": ROOT / "benchmarks" / "reference" / "costs-longtail-2core.json"}


def predict_h200_runs(console, args) -> list[dict]:
    """(0) The H200 runs of 2026-11-26 (the tiny kits, engine and trainer time-sharing one GPU), predicted
    from the 2-core calibration of the same kit (lengths, overheads) with the forwards moved to the GPU
    (perfmodel.cluster.on_gpu: the graphed step's per-layer overhead measured by bench_gpu) and the
    training side at what that run's own metrics say a synchronous step's training took."""
    import dataclasses

    from areal_graph.perfmodel.cluster import h200_measured, on_gpu
    from areal_graph.perfmodel.cost_model import CostModel
    from areal_graph.perfmodel.simulator import SimConfig, simulate

    rows = []
    table = Table(title="(0) the H200 runs of 2026-11-26 (tiny kits, one GPU time-shared), predicted from a "
                        "2-core calibration with the forwards moved to the GPU")
    for col in ("workflow", "predicted sync / async window", "predicted speed-up", "measured sync / async wall",
                "measured speed-up (walls)"):
        table.add_column(col)
    for name in ("rl_short.json", "rl_longtail.json"):
        path = H200_REFERENCE / name
        ref = json.loads(path.read_text())
        costs_path = CPU_COSTS[ref["workflow"]]
        if not costs_path.exists():
            console.print(f"(0) skipped: {costs_path} is missing (areal-graph costs RUN --save it)")
            return []
        sync, async_ = (next(r for r in ref["results"] if r["label"] == k) for k in ("sync", "async"))
        cpu = CostModel.from_json(costs_path.read_text())
        gpu = on_gpu(cpu, layers=4, eff=h200_measured(), train_step_s=sync["train_time_s"] / sync["steps"])
        cal = cpu.calibrated
        base = SimConfig(steps=ref["steps"], batch_size=cal["batch_size"], group_size=cal["group_size"],
                         max_concurrent=cal["max_concurrent_rollouts"], max_running=cal["max_running_requests"],
                         max_new_tokens=cal["max_new_tokens"], machine_cores=list(range(16)), seed=1)
        pred = {eta: simulate(dataclasses.replace(base, max_staleness=eta), gpu).steps_window_s for eta in (0, 4)}
        rows.append({"workflow": ref["workflow"], "predicted_sync_s": pred[0], "predicted_async_s": pred[4],
                     "predicted_speedup": pred[0] / pred[4], "measured_sync_wall_s": sync["wall_s"],
                     "measured_async_wall_s": async_["wall_s"], "measured_speedup": sync["wall_s"] / async_["wall_s"]})
        table.add_row(ref["workflow"], f"{pred[0]:.1f} / {pred[4]:.1f} s", f"{pred[0] / pred[4]:.2f}x",
                      f"{sync['wall_s']:.1f} / {async_['wall_s']:.1f} s", f"{sync['wall_s'] / async_['wall_s']:.2f}x")
    console.print(table)
    console.print("the reference holds whole-run walls (startup, two evaluations of 200 problems and the steps), "
                  "not steps windows: the measured ratio understates the steps' own speed-up")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="64 prompts a step, fewer GPU counts: checks that it runs")
    ap.add_argument("--steps", type=int, default=5, help="simulated steps per setting (the median step is reported)")
    args = ap.parse_args()
    from areal_graph.perfmodel.cluster import PRODUCTION, ClusterRun, h200_measured, speedup

    console = Console()
    base = ClusterRun(steps=args.steps, eta=8)
    if args.quick:
        base = replace(base, batch_prompts=64, steps=3)
    efficiencies = [PRODUCTION, h200_measured()]
    out: dict = {"date": time.strftime("%Y-%m-%d"), "quick": args.quick, "efficiencies": [e.__dict__ for e in efficiencies]}
    t0 = time.perf_counter()

    h200 = predict_h200_runs(console, args)
    if h200:
        out["h200_runs"] = h200

    table = Table(title="(1) synchronous vs asynchronous on the same GPUs (eta 8, 3/4 of the GPUs generating)")
    for col in ("model", "GPUs", "efficiency", "sync s/step", "async s/step", "speed-up", "paper (Table 1 hours)"):
        table.add_column(col)
    rows = []
    for (model, gpus), (sync_h, async_h) in PAPER_TABLE1.items():
        for eff in efficiencies:
            r = speedup(replace(base, model=model, gpus=gpus if not args.quick else gpus // 4, efficiency=eff))
            rows.append({"model": model, "gpus": gpus, "efficiency": eff.name, **r,
                         "paper_speedup": sync_h / async_h})
            table.add_row(model, str(gpus), eff.name.split(" (")[0], f"{r['sync_step_s']:.0f}", f"{r['async_step_s']:.0f}",
                          f"{r['speedup']:.2f}x", f"{sync_h} h / {async_h} h = {sync_h / async_h:.2f}x")
    console.print(table)
    out["same_gpus"] = rows

    table = Table(title="(2) strong scaling, 1.5B (8,192 answers a step whatever the GPUs; production preset)")
    for col in ("GPUs", "async tokens/s", "per GPU", "scaling vs 32", "sync tokens/s", "async / sync"):
        table.add_column(col, justify="right")
    counts = (32, 64, 128, 256, 512) if not args.quick else (16, 32)
    scaling = []
    for gpus in counts:
        r = speedup(replace(base, model="1.5B", gpus=gpus))
        scaling.append({"gpus": gpus, **r})
        first = scaling[0]
        eff = (r["async_tokens_per_s"] / gpus) / (first["async_tokens_per_s"] / first["gpus"])
        table.add_row(str(gpus), f"{r['async_tokens_per_s']:,.0f}", f"{r['async_tokens_per_s'] / gpus:,.0f}",
                      f"{eff:.0%}", f"{r['sync_tokens_per_s']:,.0f}", f"{r['speedup']:.2f}x")
    console.print(table)
    out["strong_scaling"] = scaling

    table = Table(title="(3) throughput against max staleness, 1.5B on 128 GPUs (production preset)")
    for col in ("eta", "tokens/s", "vs eta 0", "paper (Fig. 5c) tokens/s", "paper vs eta 0"):
        table.add_column(col, justify="right")
    stal = []
    gpus = 128 if not args.quick else 32
    for eta in PAPER_STALENESS:
        run = replace(base, model="1.5B", gpus=gpus, eta=eta)
        r = speedup(run)
        tps = r["sync_tokens_per_s"] if eta == 0 else r["async_tokens_per_s"]
        stal.append({"eta": eta, "tokens_per_s": tps})
        t0_ = stal[0]["tokens_per_s"]
        table.add_row(str(eta), f"{tps:,.0f}", f"{tps / t0_:.2f}x",
                      f"{PAPER_STALENESS[eta]:,.0f}", f"{PAPER_STALENESS[eta] / PAPER_STALENESS[0]:.2f}x")
    console.print(table)
    out["staleness"] = stal

    table = Table(title="(4) the generation share of the GPUs, 1.5B on 128 GPUs, eta 8 (production preset)")
    for col in ("generation share", "async s/step", "engines busy", "trainer busy"):
        table.add_column(col, justify="right")
    shares = []
    for share in (0.5, 0.625, 0.75, 0.875):
        r = speedup(replace(base, model="1.5B", gpus=gpus, inference_share=share))
        shares.append({"share": share, **r})
        table.add_row(f"{share:.0%}", f"{r['async_step_s']:.0f}", f"{r['async_engine_busy']:.0%}",
                      f"{r['async_trainer_busy']:.0%}")
    console.print(table)
    out["split"] = shares
    console.print(f"({time.perf_counter() - t0:.0f} s of simulation)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / ("paper_scale_quick.json" if args.quick else "paper_scale.json")
    path.write_text(json.dumps(out, indent=1, default=str))
    console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
