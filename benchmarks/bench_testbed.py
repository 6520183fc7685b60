"""The CPU testbed (workflows/ppo_async_testbed.yaml): the AReaL paper's findings in accuracy, 3 seeds each.

The testbed kit (builtin:tiny-arith-ladder: 1 to 12 steps of one-digit arithmetic, a warm start
that works out short problems and ever fewer long ones) keeps learning for 500 steps, so what
a method changes shows in greedy test accuracy, not only in reward area. Every cell is a real
`areal-graph run` of the testbed workflow with a few overrides, 500 steps, greedy accuracy on
all 500 test problems. Groups:

- staleness: naive PPO (`loss: ppo`, trust region around the behaviour policy) vs the decoupled
  objective (`loss: decoupled_ppo`) at max staleness eta 0, 4, 8, 16 (the paper's Table 2 /
  Figure 5). Staleness only happens if the generator can run ahead, so every cell lets (eta + 1)
  batches be in flight (`runtime.max_concurrent_rollouts`, `inference.max_running_requests`).
- interruption: at a weight update the engine recomputes the KV cache of the requests in flight
  and goes on with the new weights (`inference.kv_on_update: recompute`, AReaL's interruptible
  generation) vs waiting for them to finish on the old weights first (`wait`): throughput and accuracy.
- losses: GRPO (group-normalised advantages, decoupled PPO loss) vs RLOO advantages vs GSPO vs
  CISPO, at eta 4 and two updates per step (`ppo_minibatches: 2`; with one, as shipped, the
  ratio is exactly 1 where the gradient is taken and the four differ only in aggregation), GSPO
  and CISPO with their papers' clip ranges as in workflows/gspo.yaml and cispo.yaml.
- lora: full fine-tuning vs a LoRA adapter of rank 8 (lr 25x, as bench_lora_curve.py).

The shipped workflow is the "eta 4, decoupled" cell, which all four groups share. Cells run
seed by seed (all configurations of seed 1, then seed 2, ...) so that machine noise spreads
over all of them and an interrupted run has whole seeds; results accumulate in the JSON and
`--resume` skips cells already there.

    python benchmarks/bench_testbed.py                          # every group, 3 seeds (~2 h on 2 cores)
    python benchmarks/bench_testbed.py --configs base,wait --seeds 1 --steps 40   # a quick look
    python benchmarks/bench_testbed.py --report                 # tables and figure from the JSON only

Prints one table per group (accuracy at step 500: mean, standard deviation and each seed;
mean reward over the run; generation throughput; wall time) and writes
benchmarks/results/testbed.json and, with matplotlib, testbed.png (learning curves, response
length over training, and the groups' accuracies).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from areal_graph.runtime.observability.run_dir import METRICS_FILENAME, read_metrics_file

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
WORKFLOW = ROOT / "workflows" / "ppo_async_testbed.yaml"
BATCH = 32  # the workflow's runtime.batch_size
LORA_LR = 2.5e-4  # 25x the workflow's 1e-5


@dataclass(frozen=True)
class Config:
    """One configuration: its overrides on top of the testbed workflow, and the eta it runs at."""

    name: str
    eta: int
    overrides: tuple[str, ...] = ()


# In the order they run within a seed: the most informative first.
CONFIGS: tuple[Config, ...] = (
    Config("base", 4),  # decoupled PPO, GRPO advantages, interruptible (KV recomputed), full FT
    Config("naive eta 4", 4, ("nodes.train.loss=ppo",)),
    Config("decoupled eta 16", 16),
    Config("naive eta 16", 16, ("nodes.train.loss=ppo",)),
    Config("wait", 4, ("inference.kv_on_update=wait",)),
    # PipelineRL's in-flight update: the KV cache built by the old weights is kept (issue 46, item 4)
    Config("keep", 4, ("inference.kv_on_update=keep",)),
    # The losses at two updates per step, each with its paper's clip (as workflows/gspo.yaml and
    # cispo.yaml): with one update the ratio is exactly 1 and the four would differ only in aggregation.
    Config("grpo 2 updates", 4, ("nodes.train.ppo_minibatches=2",)),
    Config("rloo", 4, ("nodes.advantage.estimator=rloo", "nodes.train.ppo_minibatches=2")),
    Config(
        "gspo",
        4,
        (
            "nodes.train.loss=gspo",
            "nodes.train.clip_eps=3.0e-4",
            "nodes.train.eps_high=4.0e-4",
            "nodes.train.agg=seq-mean-token-mean",
            "nodes.train.ppo_minibatches=2",
        ),
    ),
    Config(
        "cispo",
        4,
        (
            "nodes.train.loss=cispo",
            "nodes.train.clip_eps=1.0",
            "nodes.train.eps_high=1.0",
            "nodes.train.ppo_minibatches=2",
        ),
    ),
    Config("lora r8", 4, ("models.actor.lora.r=8", "models.actor.lora.alpha=16", f"models.actor.train.lr={LORA_LR}")),
    Config("decoupled eta 0", 0),
    Config("decoupled eta 8", 8),
    Config("naive eta 8", 8, ("nodes.train.loss=ppo",)),
    Config("naive eta 0", 0, ("nodes.train.loss=ppo",)),
)
BY_NAME = {c.name: c for c in CONFIGS}

# The tables: (title, [(row label, config name)]).
GROUPS: dict[str, list[tuple[str, str]]] = {
    "staleness": [
        (f"eta {eta}, {method}", "base" if (eta, method) == (4, "decoupled") else f"{method} eta {eta}")
        for eta in (0, 4, 8, 16)
        for method in ("naive", "decoupled")
    ],
    "interruption": [
        ("interruptible (recompute KV)", "base"),
        ("interruptible, KV cache kept", "keep"),
        ("wait for in-flight requests", "wait"),
    ],
    "losses": [
        ("GRPO, 1 update per step (as shipped)", "base"),
        ("GRPO", "grpo 2 updates"),
        ("RLOO", "rloo"),
        ("GSPO", "gspo"),
        ("CISPO", "cispo"),
    ],
    "lora": [("full fine-tuning", "base"), ("LoRA r=8", "lora r8")],
}


def overrides(cfg: Config, seed: int, steps: int) -> list[str]:
    concurrency = (cfg.eta + 1) * BATCH
    base = cfg.name == "base"  # its curve: every 100 steps from the warm start; the others: the end only
    # every table here was measured with the KV cache recomputed at updates, the shipped behaviour
    # until `kv_on_update: auto` (keep, when asynchronous): a cell that says nothing keeps recomputing
    kv = (
        []
        if any(o.startswith("inference.kv_on_update=") for o in cfg.overrides)
        else ["inference.kv_on_update=recompute"]
    )
    return [
        *kv,
        *cfg.overrides,
        f"runtime.max_staleness={cfg.eta}",
        f"runtime.max_concurrent_rollouts={concurrency}",
        f"inference.max_running_requests={concurrency}",
        f"runtime.seed={seed}",
        f"runtime.steps={steps}",
        f"runtime.eval_every={max(steps // 5, 1) if base else steps}",
        f"runtime.eval_at_start={'true' if base else 'false'}",
    ]


def run_cell(cfg: Config, seed: int, steps: int, run_dir: Path, extra: list[str]) -> dict:
    """One `areal-graph run`; what its metrics.jsonl says, reduced."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "areal_graph.cli.main", "run", str(WORKFLOW), *overrides(cfg, seed, steps), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run([*cmd, "--run-dir", str(run_dir)], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{run_dir.name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    metrics = read_metrics_file(run_dir / METRICS_FILENAME).records
    curve = [(m.get("step", 0), m["eval/accuracy"]) for m in metrics if "eval/accuracy" in m]
    trained = [m for m in metrics if "reward/mean" in m]
    window = trained[-1]["time"] - trained[0]["time"] if len(trained) > 1 else float("nan")
    tokens = sum(m.get("response_len/mean", 0.0) * BATCH for m in trained[1:])
    return {
        "accuracy": curve[-1][1],
        "curve": curve,
        "reward_area": statistics.fmean(m["reward/mean"] for m in trained),
        "response_len": [
            (m["step"], m.get("response_len/mean"), m.get("response_len/p90"), m.get("response_len/max"))
            for m in trained
        ],
        "staleness_mean": statistics.fmean(m.get("staleness/mean", 0.0) for m in trained),
        "gen_tokens_per_s": tokens / window,
        "steps_window_s": window,
        "wall_s": wall,
        "steps": len(trained),
        **weight_swaps(run_dir),
    }


def weight_swaps(run_dir: Path) -> dict:
    """From the engine's `weight_swap` spans: how long updates waited for a step boundary (under
    kv_on_update=wait: for the requests in flight to finish) and how many requests were in flight
    (under recompute: re-prefilled) at each swap."""
    path = run_dir / "trace.json"
    if not path.exists():
        return {}
    trace = json.loads(path.read_text())
    events = trace if isinstance(trace, list) else trace.get("traceEvents", [])
    swaps = [e.get("args", {}) for e in events if e.get("name") == "weight_swap" and e.get("ph") == "X"]
    if not swaps:
        return {}
    return {
        "swaps": len(swaps),
        "swap_waited_s": sum(a.get("waited_s", 0.0) for a in swaps),
        "swap_in_flight_mean": statistics.fmean(a.get("interrupted", 0) for a in swaps),
    }


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    m = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{100 * m:.1f} ± {100 * sd:.1f}" if len(values) > 1 else f"{100 * m:.1f}"


def _by_config(cells: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for c in cells:
        out.setdefault(c["config"], []).append(c)
    return out


def print_curve(console: Console, cells: list[dict]) -> None:
    """The shipped workflow's learning curve per seed, and its response length early and late."""
    base = sorted(_by_config(cells).get("base", []), key=lambda c: c["seed"])
    if not base:
        return
    points = sorted({step for c in base for step, _ in c["curve"]})
    t = Table(title="testbed as shipped: greedy test accuracy (%) by step, and response length (tokens)")
    t.add_column("seed", justify="right")
    for step in points:
        t.add_column(f"step {step}", justify="right")
    t.add_column("length mean / p90 / max, steps 1-50", justify="right")
    t.add_column("steps 451-500", justify="right")
    for c in base:
        acc = dict(c["curve"])
        first, last = c["response_len"][:50], c["response_len"][-50:]
        t.add_row(
            str(c["seed"]),
            *(f"{100 * acc[s]:.1f}" if s in acc else "-" for s in points),
            _lengths(first),
            _lengths(last),
        )
    by_step = [[100 * dict(c["curve"]).get(s, float("nan")) for c in base] for s in points]
    t.add_row("mean ± std", *(_mean_std(v) for v in by_step), "", "")
    console.print(t)


def _lengths(rows: list) -> str:
    """Mean over the steps of the per-step mean, p90 and max response length."""
    cols = [[r[k] for r in rows if r[k] is not None] for k in (1, 2, 3)]
    return " / ".join(f"{statistics.fmean(v):.0f}" if v else "-" for v in cols)


def _mean_std(values: list[float]) -> str:
    return f"{statistics.fmean(values):.1f} ± {statistics.stdev(values):.1f}" if len(values) > 1 else f"{values[0]:.1f}"


def print_tables(console: Console, cells: list[dict], steps: int) -> None:
    print_curve(console, cells)
    by = _by_config(cells)
    for group, rows in GROUPS.items():
        t = Table(
            title=f"testbed, {group}: greedy accuracy at step {steps} on 500 test problems (%, mean ± std over seeds)"
        )
        for col in (
            "configuration",
            "seeds",
            f"accuracy @{steps}",
            "per seed",
            "reward area",
            "staleness",
            "gen tok/s",
            "wall s",
            *(["updates waited s", "in flight at a swap"] if group == "interruption" else []),
        ):
            t.add_column(col, justify="left" if col in ("configuration", "per seed") else "right")
        for label, name in rows:
            cs = sorted(by.get(name, []), key=lambda c: c["seed"])
            if not cs:
                t.add_row(label, "0", "not run")
                continue
            mean = lambda k: statistics.fmean(c[k] for c in cs)  # noqa: E731
            swaps = [c for c in cs if "swaps" in c]
            extra = (
                [
                    f"{statistics.fmean(c['swap_waited_s'] for c in swaps):.1f}" if swaps else "-",
                    f"{statistics.fmean(c['swap_in_flight_mean'] for c in swaps):.1f}" if swaps else "-",
                ]
                if group == "interruption"
                else []
            )
            t.add_row(
                label,
                str(len(cs)),
                _spread([c["accuracy"] for c in cs]),
                " / ".join(f"{100 * c['accuracy']:.1f}" for c in cs),
                f"{mean('reward_area'):.3f}",
                f"{mean('staleness_mean'):.1f}",
                f"{mean('gen_tokens_per_s'):.0f}",
                f"{mean('wall_s'):.0f}",
                *extra,
            )
        console.print(t)


def plot(cells: list[dict], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    by = _by_config(cells)
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    ax = axes[0][0]
    for c in sorted(by.get("base", []), key=lambda c: c["seed"]):
        xs, ys = zip(*c["curve"])
        ax.plot(xs, [100 * y for y in ys], marker="o", label=f"seed {c['seed']}")
    ax.set(title="testbed as shipped: greedy test accuracy", xlabel="step", ylabel="%")
    ax.legend()
    ax = axes[0][1]
    for c in sorted(by.get("base", []), key=lambda c: c["seed"])[:1]:
        rows = [r for r in c["response_len"] if r[1] is not None]
        xs = [r[0] for r in rows]
        for k, name in ((1, "mean"), (2, "p90"), (3, "max")):
            ys = [r[k] for r in rows]
            w = 10
            smooth = [statistics.fmean(ys[max(0, i - w + 1) : i + 1]) for i in range(len(ys))]
            ax.plot(xs, smooth, label=f"{name} (seed {c['seed']}, 10-step mean)")
    ax.set(title="response length per step (tokens)", xlabel="step", ylabel="tokens")
    ax.legend()
    _staleness_panel(axes[0][2], by)
    for ax, group in ((axes[1][0], "interruption"), (axes[1][1], "losses"), (axes[1][2], "lora")):
        labels, means, sds, points = [], [], [], []
        for label, name in GROUPS[group]:
            accs = [100 * c["accuracy"] for c in by.get(name, [])]
            if not accs:
                continue
            labels.append(label.replace(", ", "\n").replace(" (", "\n("))
            means.append(statistics.fmean(accs))
            sds.append(statistics.stdev(accs) if len(accs) > 1 else 0.0)
            points.append(accs)
        xs = list(range(len(labels)))
        ax.bar(xs, means, yerr=sds, capsize=4, color="#8ab")
        for x, ps in zip(xs, points):
            ax.plot([x] * len(ps), ps, "k.", ms=5)
        ax.set_xticks(xs, labels, fontsize=7)
        low = min((p for ps in points for p in ps), default=0.0)
        ax.set_ylim(max(0.0, low - 10), None)
        ax.set(title=f"{group}: accuracy at step 500 (mean ± std, dots: seeds)", ylabel="%")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return path


def _staleness_panel(ax, by: dict[str, list[dict]]) -> None:
    """The paper's Figure 5 shape: accuracy against max staleness, one line per objective."""
    for method, color in (("naive", "#c44"), ("decoupled", "#36a")):
        xs, means, sds = [], [], []
        for label, name in GROUPS["staleness"]:
            accs = [100 * c["accuracy"] for c in by.get(name, [])]
            if label.endswith(method) and accs:
                eta = BY_NAME[name].eta
                xs.append(eta)
                means.append(statistics.fmean(accs))
                sds.append(statistics.stdev(accs) if len(accs) > 1 else 0.0)
                ax.plot([eta] * len(accs), accs, ".", color=color, ms=5)
        ax.errorbar(xs, means, yerr=sds, capsize=4, marker="o", color=color, label=f"{method} PPO")
    ax.set(title="staleness: accuracy at step 500 (mean ± std, dots: seeds)", xlabel="max staleness eta", ylabel="%")
    ax.set_xticks([0, 4, 8, 16])
    lows = [100 * c["accuracy"] for label, name in GROUPS["staleness"] for c in by.get(name, [])]
    if lows:
        ax.set_ylim(max(0.0, min(lows) - 10), max(lows) + 5)  # the bars' scale: small gaps stay small
    ax.legend()


def save(out: Path, steps: int, cells: list[dict]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"steps": steps, "workflow": str(WORKFLOW.relative_to(ROOT)), "cells": cells}) + "\n")


def _keys(cells: list[dict]) -> set[tuple[str, int]]:
    return {(c["config"], c["seed"]) for c in cells}


def _claim(claims: Path | None, name: str, seed: int) -> bool:
    """Claim a cell for this invocation (an exclusive create); False when another has it."""
    if claims is None:
        return True
    claims.mkdir(parents=True, exist_ok=True)
    try:
        (claims / f"{name.replace(' ', '_')}-s{seed}").open("x").close()
    except FileExistsError:
        return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=",".join(c.name for c in CONFIGS), help="comma-separated config names")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--resume", action="store_true", help="skip cells already in the JSON")
    ap.add_argument("--report", action="store_true", help="print the tables and draw the figure from the JSON only")
    ap.add_argument("--deadline", type=float, default=None, help="start no new cell after this many seconds")
    ap.add_argument(
        "--set", dest="extra", action="append", default=[], metavar="KEY=VALUE", help="one more override for every cell"
    )
    ap.add_argument(
        "--claims",
        type=Path,
        default=None,
        help="a folder where each cell is claimed before it runs: two invocations sharing it (one with "
        "--reverse, each its own --out) split the cells between them; --merge joins their JSON",
    )
    ap.add_argument("--reverse", action="store_true", help="run the cells in the opposite order")
    ap.add_argument("--merge", type=Path, action="append", default=[], help="add the cells of another JSON to --out")
    ap.add_argument(
        "--swaps-from",
        type=Path,
        action="append",
        default=[],
        help="run directories' parent(s) to read the weight-swap stats of cells that lack them",
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "testbed.json")
    ap.add_argument("--runs", type=Path, default=Path("/tmp/testbed_runs"), help="where run directories go")
    args = ap.parse_args()
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown config(s) {unknown}; choose among {list(BY_NAME)}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    console = Console(width=max(Console().width, 160))
    done = json.loads(args.out.read_text()) if (args.resume or args.report) and args.out.exists() else {"cells": []}
    if done.get("steps", args.steps) != args.steps:
        ap.error(f"{args.out} holds {done['steps']}-step cells; use another --out")
    cells = list(done["cells"])
    for extra_json in args.merge:
        cells += [
            c for c in json.loads(extra_json.read_text())["cells"] if (c["config"], c["seed"]) not in _keys(cells)
        ]
    for c in cells:
        for parent in args.swaps_from:
            if "swaps" not in c:
                c.update(weight_swaps(parent / f"{c['config'].replace(' ', '_')}-s{c['seed']}"))
    have = _keys(cells)
    start = time.perf_counter()
    order = [(seed, name) for seed in ([] if args.report else seeds) for name in names]
    for seed, name in reversed(order) if args.reverse else order:
        if (name, seed) in have or not _claim(args.claims, name, seed):
            continue
        if args.deadline is not None and time.perf_counter() - start > args.deadline:
            console.print(f"deadline reached: {name} seed {seed} and later cells not run")
            break
        console.print(f"{name}, seed {seed} ...")
        r = run_cell(BY_NAME[name], seed, args.steps, args.runs / f"{name.replace(' ', '_')}-s{seed}", args.extra)
        cells.append(
            {
                "config": name,
                "seed": seed,
                "overrides": overrides(BY_NAME[name], seed, args.steps) + args.extra,
                **r,
            }
        )
        console.print(
            f"  {100 * r['accuracy']:.1f}% at step {args.steps}, reward area {r['reward_area']:.3f}, "
            f"{r['gen_tokens_per_s']:.0f} generated tok/s, {r['wall_s']:.0f} s"
        )
        save(args.out, args.steps, cells)
    if args.merge or args.swaps_from:
        save(args.out, args.steps, cells)
    print_tables(console, cells, args.steps)
    png = plot(cells, args.out.with_suffix(".png"))
    console.print(f"wrote {args.out}" + (f" and {png}" if png else " (no PNG: pip install matplotlib)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
