"""Does the shipped recipe learn on any kit it builds? Kits x RL seeds -> accuracy before and after.

A kit's warm start is float arithmetic: another CPU, another thread count or another seed
gives other weights. A recipe whose RL result depends on which of those a user's machine
happened to produce is not one a user can rely on (issue 19: the same recipe went 13% -> 61%
on one machine's kit and 13% -> 21% on another's). This script builds the kit from its recipe
for every SFT seed x torch thread count asked for, in a cache of its own (never the shared
one), measures each warm start, then runs each shipped workflow on each kit for each RL
seed, as `areal-graph run` with the workflow's own settings, and reports greedy test accuracy
before and after.

    python benchmarks/bench_kit_robustness.py                          # tiny-arith: 3 seeds x 2 threads x 2 RL seeds
    python benchmarks/bench_kit_robustness.py --kit tiny-calc          # its shipped workflows
    python benchmarks/bench_kit_robustness.py --builds-only            # the warm starts alone
    python benchmarks/bench_kit_robustness.py --quick                  # 1 kit, 1 seed, 20 steps

The SFT runs torch's deterministic kernels, so on one machine a kit is the same bits at 1 and
2 threads (the table shows each kit's weights hash); RL runs only once per distinct kit, and
the variation that remains comes from the seeds. Per kit it also reports what the warm start
gives RL to work with: the share of sampled
answers that are hasty (the first token is "The"), and the accuracy of sampled answers and
of greedy answers made to work it out (the first solution token forced), on 200 test
problems x 8 samples. Writes benchmarks/results/kit_robustness_<kit>.json.
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

from areal_graph.modelkit.shipped import sha256
from areal_graph.runtime.observability.run_dir import METRICS_FILENAME, read_metrics_file

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

# kit -> its shipped workflows
WORKFLOWS = {
    "tiny-arith": ["ppo_async.yaml", "grpo_sync.yaml"],
    "tiny-arith-long": ["ppo_async_longtail.yaml"],
    "tiny-calc": ["agent_calculator.yaml", "agent_calculator_openai.yaml"],
}

BUILD = """
import json, sys, torch
torch.set_num_threads({threads})
from areal_graph.modelkit.builtin import ensure_kit, BUILTIN_KITS
import dataclasses
cfg = dataclasses.replace(BUILTIN_KITS[{kit!r}], sft_seed={seed})
kit = ensure_kit(cfg, root=__import__("pathlib").Path({root!r}), from_recipe=True)  # never the shipped one
print("KIT " + json.dumps({{"path": str(kit.path), "info": kit.info}}))
"""


def build(kit: str, seed: int, threads: int, cache: Path) -> dict:
    """Build (or reuse) one kit in a subprocess that runs torch with `threads` threads."""
    root = cache / f"t{threads}"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", BUILD.format(kit=kit, seed=seed, threads=threads, root=str(root))],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"kit build {kit} seed {seed} threads {threads} failed:\n{proc.stderr[-3000:]}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("KIT "))
    out = json.loads(line[4:])
    out["wall_s"] = time.perf_counter() - t0
    return out


def diagnose_arith(model_dir: Path, test: Path, max_new_tokens: int, problems: int = 200, samples: int = 8) -> dict:
    """What an arithmetic warm start gives RL: greedy accuracy, greedy accuracy when made to
    work it out, and the hasty share and accuracy of answers sampled at temperature 1."""
    from areal_graph.data.arith import read_jsonl
    from areal_graph.engines.inference.engine import EmbeddedEngine, SamplingParams
    from areal_graph.modelkit.warm_start import IGNORE, encode_pair
    from areal_graph.tools.reward_pool import RewardPool

    engine = EmbeddedEngine(str(model_dir), max_running=256, max_queue=1 << 30, seed=0)
    tok = engine.tokenizer
    rows = list(read_jsonl(test))[:problems]
    encoded = [encode_pair(tok, r["question"], r["solution"]) for r in rows]
    prompts = [[t for t, y in zip(ids, labels) if y == IGNORE] for ids, labels in encoded]
    first = [next(t for t, y in zip(ids, labels) if y != IGNORE) for ids, labels in encoded]
    greedy = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    requests = [(p, greedy) for p in prompts] + [(p + [f], greedy) for p, f in zip(prompts, first)]
    requests += [
        (p, SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=i * 1009 + j))
        for i, p in enumerate(prompts)
        for j in range(samples)
    ]
    with engine:
        results = [f.result() for f in [engine.submit(ids, sp) for ids, sp in requests]]
    n = len(rows)
    texts = [tok.decode(r.output_ids, skip_special_tokens=True) for r in results]
    texts[n : 2 * n] = [
        tok.decode([f] + r.output_ids, skip_special_tokens=True) for f, r in zip(first, results[n : 2 * n])
    ]
    answers = [r["answer"] for r in rows] * 2 + [r["answer"] for r in rows for _ in range(samples)]
    with RewardPool(fn="math_verify", num_workers=1) as pool:
        ok = [s.reward > 0.5 for s in pool.score(texts, answers)]
    sampled, sampled_ok = texts[2 * n :], ok[2 * n :]
    hasty = [t.startswith("The answer") for t in sampled]
    worked_ok = [o for o, h in zip(sampled_ok, hasty) if not h]
    return {
        "greedy": sum(ok[:n]) / n,
        "greedy_worked_out": sum(ok[n : 2 * n]) / n,
        "sampled": sum(sampled_ok) / len(sampled),
        "sampled_hasty_share": sum(hasty) / len(hasty),
        "sampled_worked_out": sum(worked_ok) / max(1, len(worked_ok)),
    }


def run_rl(workflow: str, kit_path: Path, seed: int, run_dir: Path, steps: int | None, eval_size: int) -> dict:
    model, data = kit_path / "model", kit_path / "data"
    args = [
        sys.executable,
        "-m",
        "areal_graph.cli.main",
        "run",
        str(ROOT / "workflows" / workflow),
        "--run-dir",
        str(run_dir),
        f"models.actor.path={model}",
        f"data.train={data / 'train.jsonl'}",
        f"data.eval={data / 'test.jsonl'}",
        f"data.eval_size={eval_size}",
        f"runtime.seed={seed}",
        "runtime.save_every=0",
    ]
    if steps is not None:
        args.append(f"runtime.steps={steps}")
    args.append(f"runtime.eval_every={steps or 100000}")
    shutil.rmtree(run_dir, ignore_errors=True)  # a run dir of an earlier invocation would be continued
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{workflow} on {kit_path.name} seed {seed} failed:\n{proc.stderr[-3000:]}")
    metrics = read_metrics_file(run_dir / METRICS_FILENAME).records
    accs = [m["eval/accuracy"] for m in metrics if "eval/accuracy" in m]
    return {"before": accs[0], "after": accs[-1], "wall_s": wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kit", default="tiny-arith", choices=sorted(WORKFLOWS))
    ap.add_argument("--sft-seeds", default="0,1,2", help="comma-separated (default 0,1,2)")
    ap.add_argument("--threads", default="1,2", help="torch threads during the SFT, comma-separated (default 1,2)")
    ap.add_argument("--rl-seeds", default="1,2", help="comma-separated (default 1,2)")
    ap.add_argument("--workflows", default=None, help="comma-separated (default: the kit's shipped workflows)")
    ap.add_argument("--steps", type=int, default=None, help="RL steps (default: the workflow's own)")
    ap.add_argument("--eval-size", type=int, default=500, help="greedy test problems before and after (default 500)")
    ap.add_argument(
        "--cache",
        type=Path,
        default=ROOT / "benchmarks" / "results" / "kit_cache",
        help="where the kits are built (reused across invocations; never the user's cache)",
    )
    ap.add_argument("--builds-only", action="store_true", help="build and measure the warm starts, run no RL")
    ap.add_argument(
        "--no-diagnose",
        action="store_true",
        help="skip the sampled look at each arithmetic warm start (minutes on the long kit)",
    )
    ap.add_argument("--quick", action="store_true", help="1 kit (seed 0, 2 threads), 1 RL seed, 20 steps, 64 problems")
    args = ap.parse_args()
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    seeds, threads, rl_seeds = ints(args.sft_seeds), ints(args.threads), ints(args.rl_seeds)
    steps, eval_size = args.steps, args.eval_size
    if args.quick:
        seeds, threads, rl_seeds, steps, eval_size = [0], [2], [1], 20, 64
    workflows = args.workflows.split(",") if args.workflows else WORKFLOWS[args.kit]
    console = Console()
    kits = []
    for seed in seeds:
        for t in threads:
            console.print(f"kit {args.kit} sft_seed {seed}, {t} thread(s) ...")
            built = build(args.kit, seed, t, args.cache)
            info = built["info"]
            kit = {
                "sft_seed": seed,
                "threads": t,
                "path": built["path"],
                "build_s": info["timings"]["total_s"],
                "warm_start_greedy": info["warm_start_greedy_accuracy"],
                "weights_sha256": sha256(Path(built["path"]) / "model" / "model.safetensors"),
            }
            if args.kit != "tiny-calc" and not args.no_diagnose:
                kit.update(
                    diagnose_arith(
                        Path(built["path"]) / "model",
                        Path(built["path"]) / "data" / "test.jsonl",
                        info["eval_max_new_tokens"],
                    )
                )
            kits.append(kit)
    runs = []
    if not args.builds_only:
        run_root = args.cache / "runs"
        done: dict[str, list[dict]] = {}  # weights hash -> its runs: a bit-identical kit is not run twice
        for kit in kits:
            twin = done.get(kit["weights_sha256"])
            if twin is not None:
                console.print(
                    f"kit seed {kit['sft_seed']} threads {kit['threads']}: the same weights as seed "
                    f"{twin[0]['sft_seed']} threads {twin[0]['threads']}; its runs stand for both"
                )
                runs += [{**r, "threads": kit["threads"], "same_weights_as_threads": r["threads"]} for r in twin]
                continue
            mine = []
            for wf in workflows:
                for rl_seed in rl_seeds:
                    label = f"{Path(wf).stem}-s{kit['sft_seed']}-t{kit['threads']}-rl{rl_seed}"
                    console.print(f"{label} ...")
                    r = run_rl(wf, Path(kit["path"]), rl_seed, run_root / label, steps, eval_size)
                    mine.append(
                        {
                            "workflow": wf,
                            "sft_seed": kit["sft_seed"],
                            "threads": kit["threads"],
                            "rl_seed": rl_seed,
                            **r,
                        }
                    )
                    console.print(f"  {r['before']:.1%} -> {r['after']:.1%} in {r['wall_s']:.0f} s")
            done[kit["weights_sha256"]] = mine
            runs += mine
    out = RESULTS / f"kit_robustness_{args.kit}.json"
    kept = earlier_runs(out, kits, runs)
    if kept:
        console.print(f"kept {len(kept)} run(s) of an earlier invocation on the same weights (in {out.name})")
    runs = kept + runs
    print_tables(console, args.kit, kits, runs)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"kit": args.kit, "kits": kits, "runs": runs, "steps": steps, "eval_size": eval_size}, indent=2)
        + "\n"
    )
    console.print(f"wrote {out}")
    return 0


def earlier_runs(out: Path, kits: list[dict], runs: list[dict]) -> list[dict]:
    """Runs of an earlier invocation that still describe this invocation's kits.

    A run is kept when its kit (SFT seed, threads) was rebuilt now with bit-identical weights
    and this invocation did not run the same (workflow, RL seed) again: so adding RL seed 2
    later (`--rl-seeds 2`) extends the table instead of replacing seed 1's rows, and a recipe
    change (other weights) drops every stale row."""
    if not out.exists():
        return []
    earlier = json.loads(out.read_text())
    sha_then = {(k["sft_seed"], k["threads"]): k["weights_sha256"] for k in earlier.get("kits", [])}
    sha_now = {(k["sft_seed"], k["threads"]): k["weights_sha256"] for k in kits}
    key = lambda r: (r["workflow"], r["sft_seed"], r["threads"], r["rl_seed"])  # noqa: E731
    fresh = {key(r) for r in runs}
    return [
        r
        for r in earlier.get("runs", [])
        if sha_now.get((r["sft_seed"], r["threads"])) is not None
        and sha_now[(r["sft_seed"], r["threads"])] == sha_then.get((r["sft_seed"], r["threads"]))
        and key(r) not in fresh
    ]


def print_tables(console: Console, kit_name: str, kits: list[dict], runs: list[dict]) -> None:
    pct = lambda x: f"{x:.1%}" if x is not None else "-"  # noqa: E731
    table = Table(title=f"{kit_name}: warm starts built from the recipe")
    cols = ["sft seed", "threads", "build s", "weights", "greedy (500)"]
    keys = ["greedy_worked_out", "sampled", "sampled_hasty_share", "sampled_worked_out"]
    if any("sampled" in k for k in kits):
        cols += ["greedy, worked out", "sampled", "sampled hasty", "sampled worked out"]
    for c in cols:
        table.add_column(c, justify="right")
    for k in kits:
        row = [
            str(k["sft_seed"]),
            str(k["threads"]),
            f"{k['build_s']:.0f}",
            k["weights_sha256"][:8],
            pct(k["warm_start_greedy"]),
        ]
        if "sampled" in k:
            row += [pct(k[x]) for x in keys]
        table.add_row(*row)
    console.print(table)
    if not runs:
        return
    table = Table(title=f"{kit_name}: greedy test accuracy before -> after RL (kit x RL seed)")
    for c in ("workflow", "sft seed", "threads", "rl seed", "before", "after", "gain (points)", "wall s"):
        table.add_column(c, justify="right")
    for r in runs:
        twin = r.get("same_weights_as_threads")
        table.add_row(
            r["workflow"],
            str(r["sft_seed"]),
            str(r["threads"]) + (f" (= {twin})" if twin else ""),
            str(r["rl_seed"]),
            pct(r["before"]),
            pct(r["after"]),
            f"{100 * (r['after'] - r['before']):+.1f}",
            f"{r['wall_s']:.0f}",
        )
    console.print(table)
    for wf in dict.fromkeys(r["workflow"] for r in runs):
        gains = [
            100 * (r["after"] - r["before"]) for r in runs if r["workflow"] == wf and "same_weights_as_threads" not in r
        ]
        console.print(
            f"{wf}: gain min {min(gains):+.1f}, median {statistics.median(gains):+.1f}, "
            f"max {max(gains):+.1f} points over {len(gains)} runs on distinct kits"
        )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
