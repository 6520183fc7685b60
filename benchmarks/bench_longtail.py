"""Asynchronous vs synchronous RL on a long-tailed workload (the AReaL paper's regime).

    python benchmarks/bench_longtail.py                  # 1 round of 100 steps, eta 4 vs eta 0
    python benchmarks/bench_longtail.py --rounds 3       # interleaved rounds, medians
    python benchmarks/bench_longtail.py --quick          # 4 steps, small evals: checks that it works

Workload: workflows/ppo_async_longtail.yaml on builtin:tiny-arith-long (1- to 20-step arithmetic,
most problems short, a few very long; answers sampled at temperature 1 run from ~9 to ~210
tokens). Both systems are that file, run as `areal-graph run` processes with the same steps,
batch, seed and cores; only `runtime.max_staleness` differs: 4 (async, decoupled PPO) or 0
(sync: every step generates its batch with the current weights, then trains on it).

What is measured
----------------
- The warm-start model's answer lengths first (one process, the embedded engine): `--length-prompts`
  test prompts x `--length-samples` answers at the workflow's temperature and max_new_tokens:
  min / median / p90 / max tokens, the truncated share, and for batches of 4 prompts x 8
  answers (the workflow's batch) the longest-to-median ratio and the *decode occupancy*: the
  mean share of a batch's 32 answers still decoding while the batch decodes (sum of lengths /
  (32 x the longest)). A synchronous step decodes with that occupancy; the asynchronous engine
  refills its batch as answers finish.
- The window of each run = its N training steps, from metrics.jsonl: `time(N) - time(1) +
  time/step(1) + time/wait_batch(1)` (step 1's wait for its first batch included, so its first
  generation counts for both; server and worker start, model load and the final export are
  outside). Runs evaluate nothing during training (`runtime.eval_every=0`), so no evaluation
  sits inside a window (and async gets no head start generating during a step-0 eval).
- Where a step's time goes (sums over the run): `time/wait_batch` (the trainer waiting for
  generation), `time/train`, `time/weight_sync`; the mean response length of the trained
  answers, their truncated share and their mean staleness.
- Accuracy: `areal-graph eval` (greedy, the first `--eval-size` test problems, the workflow's
  max_new_tokens) of the warm-start model (start) and of each run's final model (end), all by
  the same evaluator. Not timed.
- Speedup = sync window / async window, within a round; medians over rounds.

Output: per-run lines while running, a rich table, and benchmarks/results/longtail.json
(longtail_quick.json with --quick).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
WORKFLOW = ROOT / "workflows" / "ppo_async_longtail.yaml"
SYSTEMS = [("async", 4), ("sync", 0)]


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _run(cmd: list[str], log_path: Path) -> tuple[int, float, float]:
    """(exit code, wall s, CPU s of the process tree) of `cmd`, output to `log_path`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return rc, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _quantiles(values: list[int]) -> dict[str, float]:
    v = sorted(values)
    return {
        "min": v[0],
        "median": statistics.median(v),
        "p90": v[min(len(v) - 1, int(0.9 * len(v)))],
        "max": v[-1],
        "mean": statistics.fmean(v),
        "n": len(v),
    }


def workflow_settings() -> dict[str, Any]:
    from areal_graph.graph.loader import load_workflow

    spec = load_workflow(WORKFLOW)
    rollout = next(n for n in spec.nodes.values() if n.kind == "rollout")
    return {
        "model": spec.models["actor"].path,
        "eval_data": spec.data.eval,
        "group_size": rollout.params.group_size,
        "batch_size": spec.runtime.batch_size,
        "temperature": rollout.params.sampling.temperature,
        "max_new_tokens": rollout.params.sampling.max_new_tokens,
    }


def answer_lengths(wf: dict, n_prompts: int, n_samples: int, seed: int = 0) -> dict[str, Any]:
    """Token lengths of the warm-start model's sampled answers on the first test prompts."""
    from areal_graph.data.datasets import load_prompts
    from areal_graph.engines.inference.engine import EmbeddedEngine, SamplingParams
    from areal_graph.modelkit.builtin import resolve_dataset_path, resolve_model_path

    model_dir = resolve_model_path(wf["model"])
    engine = EmbeddedEngine(str(model_dir), max_running=64, max_queue=1 << 30, seed=seed)
    prompts, _ = load_prompts(
        resolve_dataset_path(wf["eval_data"]),
        engine.tokenizer,
        max_prompt_tokens=engine.max_context - wf["max_new_tokens"],
    )
    prompts = prompts[:n_prompts]
    t0 = time.perf_counter()
    with engine:
        futures = [
            [
                engine.submit(
                    p.input_ids,
                    SamplingParams(
                        max_new_tokens=wf["max_new_tokens"],
                        temperature=wf["temperature"],
                        seed=seed * 1_000_003 + i * 1009 + j,
                    ),
                )
                for j in range(n_samples)
            ]
            for i, p in enumerate(prompts)
        ]
        results = [[f.result() for f in group] for group in futures]
    gen_s = time.perf_counter() - t0
    lengths = [[len(r.output_ids) for r in group] for group in results]
    flat = [x for group in lengths for x in group]
    out: dict[str, Any] = {
        "prompts": len(prompts),
        "samples_per_prompt": n_samples,
        "generation_s": gen_s,
        "tokens": _quantiles(flat),
        "truncated_share": sum(r.finish_reason == "length" for g in results for r in g) / len(flat),
        "prompt_tokens": _quantiles([len(p.input_ids) for p in prompts]),
    }
    out["max_over_min"] = out["tokens"]["max"] / max(out["tokens"]["min"], 1)
    # batches as the workflow draws them: batch_size / group_size prompts, group_size answers each
    per_batch = max(1, wf["batch_size"] // wf["group_size"])
    g = min(n_samples, wf["group_size"])
    rng = random.Random(seed)
    ratios, occupancy = [], []
    for _ in range(2000):
        batch = [x for i in rng.sample(range(len(prompts)), min(per_batch, len(prompts))) for x in lengths[i][:g]]
        ratios.append(max(batch) / statistics.median(batch))
        occupancy.append(sum(batch) / (len(batch) * max(batch)))
    out["batch"] = {
        "prompts": per_batch,
        "answers_per_prompt": g,
        "longest_over_median": _quantiles(ratios),
        "decode_occupancy": _quantiles(occupancy),
    }
    return out


def run_eval(model: str, out_json: Path, limit: int, max_new_tokens: int, data: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "areal_graph.cli.main",
        "eval",
        model,
        "--data",
        data,
        "--json",
        str(out_json),
        "--show",
        "0",
        "--limit",
        str(limit),
        "--max-new-tokens",
        str(max_new_tokens),
    ]
    log_path = out_json.with_suffix(".log")
    rc, _, _ = _run(cmd, log_path)
    if rc != 0:
        raise RuntimeError(f"eval of {model} failed ({rc}):\n{_tail(log_path)}")
    res = json.loads(out_json.read_text())
    return {
        "greedy_accuracy": res["greedy_accuracy"],
        "eval_problems": res["prompts"],
        "eval_generated_tokens": res.get("generated_tokens"),
    }


def window(metrics: list[dict]) -> dict[str, Any]:
    """The N-step window and where its time went, from metrics.jsonl (see the docstring)."""
    steps = sorted((m for m in metrics if "time/step" in m), key=lambda m: m["step"])
    if not steps:
        raise RuntimeError("metrics.jsonl has no step lines")
    first, last = steps[0], steps[-1]
    win = last["time"] - first["time"] + first["time/step"] + float(first.get("time/wait_batch", 0.0))
    step_s = [first["time/step"] + float(first.get("time/wait_batch", 0.0))]
    step_s += [b["time"] - a["time"] for a, b in zip(steps, steps[1:])]
    sums = {
        key: sum(float(m.get(key, 0.0)) for m in steps)
        for key in sorted({k for m in steps for k in m if k.startswith("time/")})
    }

    def mean(key: str) -> float | None:
        vals = [m[key] for m in steps if key in m]
        return statistics.fmean(vals) if vals else None

    return {
        "steps": len(steps),
        "window_s": win,
        "median_step_s": statistics.median(step_s),
        "time_sums_s": sums,
        "response_len_mean": mean("response_len/mean"),
        "truncated_share": mean("no_eos/frac"),
        "staleness_mean": mean("staleness/mean") or 0.0,
        "versions_per_traj_mean": mean("versions_per_traj/mean"),
        "reward_first10": statistics.fmean(m.get("reward/mean", 0.0) for m in steps[:10]),
        "reward_last10": statistics.fmean(m.get("reward/mean", 0.0) for m in steps[-10:]),
    }


def run_system(eta: int, run_dir: Path, steps: int, seed: int, extra: list[str]) -> dict:
    overrides = [
        f"runtime.max_staleness={eta}",
        f"runtime.steps={steps}",
        "runtime.eval_every=0",
        "runtime.save_every=0",
        f"runtime.seed={seed}",
        *extra,
    ]
    cmd = [sys.executable, "-m", "areal_graph.cli.main", "run", str(WORKFLOW), *overrides, "--run-dir", str(run_dir)]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = run_dir.parent / f"{run_dir.name}.log"
    load = os.getloadavg()[0]
    rc, total, cpu = _run(cmd, log_path)
    if rc != 0:
        raise RuntimeError(f"areal-graph run (eta {eta}) failed ({rc}):\n{_tail(log_path)}")
    from areal_graph.runtime.observability.run_dir import METRICS_FILENAME, read_metrics_file

    metrics = read_metrics_file(run_dir / METRICS_FILENAME).records
    res = window(metrics)
    res.update(eta=eta, seed=seed, overrides=overrides, total_s=total, total_cpu_s=cpu, loadavg_1min_at_start=load)
    return res


def _med(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarise(rounds: list[dict]) -> dict:
    out: dict[str, Any] = {}
    for name, _ in SYSTEMS:
        ok = [r["runs"][name] for r in rounds if "error" not in r["runs"].get(name, {"error": 1})]
        out[name] = {
            "runs_ok": len(ok),
            "window_s": _med([x["window_s"] for x in ok]),
            "total_s": _med([x["total_s"] for x in ok]),
            "greedy_accuracy": _med([x.get("greedy_accuracy") for x in ok]),
            "response_len_mean": _med([x["response_len_mean"] for x in ok]),
            "staleness_mean": _med([x["staleness_mean"] for x in ok]),
        }
    speedups = [r["speedup"] for r in rounds if r.get("speedup")]
    out["speedup_per_round"] = speedups
    out["speedup_median"] = _med(speedups)
    return out


def print_table(console, rounds: list[dict], start_acc: float | None, steps: int, lengths: dict | None) -> None:
    from rich.table import Table

    if lengths:
        t, b = lengths["tokens"], lengths["batch"]
        console.print(
            f"warm-start answers ({lengths['prompts']} test prompts x {lengths['samples_per_prompt']}, temperature 1): "
            f"min {t['min']} / median {t['median']:.0f} / p90 {t['p90']} / max {t['max']} tokens "
            f"({lengths['max_over_min']:.0f}x), truncated {lengths['truncated_share']:.1%}; per batch of "
            f"{b['prompts']}x{b['answers_per_prompt']}: longest/median {b['longest_over_median']['median']:.1f}x, "
            f"decode occupancy {b['decode_occupancy']['median']:.2f} (median)",
            highlight=False,
        )
    table = Table(title=f"async (eta 4) vs sync (eta 0) on the long-tailed kit: {steps} steps per run")
    for col in (
        "round",
        "system",
        "window s",
        "s/step (median)",
        "speedup",
        "acc start -> end",
        "resp. len",
        "truncated",
        "staleness",
        "wait batch s",
        "train s",
        "weight sync s",
        "total s",
    ):
        table.add_column(col, justify="right")
    for r in rounds:
        for name, _ in SYSTEMS:
            x = r["runs"].get(name, {})
            if "error" in x or not x:
                table.add_row(str(r["round"] + 1), name, "failed", *[""] * 10)
                continue
            sums = x["time_sums_s"]
            acc = (
                "-"
                if x.get("greedy_accuracy") is None
                else (
                    f"{start_acc:.1%} -> {x['greedy_accuracy']:.1%}"
                    if start_acc is not None
                    else f"{x['greedy_accuracy']:.1%}"
                )
            )
            table.add_row(
                str(r["round"] + 1),
                name,
                f"{x['window_s']:.1f}",
                f"{x['median_step_s']:.2f}",
                f"{r['speedup']:.2f}x" if name == "async" and r.get("speedup") else "",
                acc,
                f"{x['response_len_mean']:.0f}" if x["response_len_mean"] is not None else "-",
                f"{x['truncated_share']:.1%}" if x["truncated_share"] is not None else "-",
                f"{x['staleness_mean']:.2f}",
                f"{sums.get('time/wait_batch', 0):.1f}",
                f"{sums.get('time/train', 0):.1f}",
                f"{sums.get('time/weight_sync', 0):.1f}",
                f"{x['total_s']:.0f}",
            )
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds (default 1)")
    ap.add_argument("--steps", type=int, default=100, help="training steps per run (default 100)")
    ap.add_argument("--eval-size", type=int, default=200, help="greedy-evaluated test problems (default 200)")
    ap.add_argument("--length-prompts", type=int, default=200, help="test prompts for the answer-length report")
    ap.add_argument("--length-samples", type=int, default=8, help="sampled answers per prompt for it (default 8)")
    ap.add_argument("--seed", type=int, default=1, help="seed of round 0; round r uses seed + r (default 1)")
    ap.add_argument(
        "--set",
        dest="extra",
        action="append",
        default=[],
        help="an extra override for both systems, e.g. --set runtime.batch_size=64 (repeatable)",
    )
    ap.add_argument("--quick", action="store_true", help="4 steps, 1 round, small evals: checks that it works")
    ap.add_argument("--work-dir", type=Path, default=None, help="keep run directories here (default: a temp dir)")
    ap.add_argument(
        "--out", type=Path, default=None, help="JSON path (default benchmarks/results/longtail[_quick].json)"
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.rounds, args.eval_size = 4, 1, 16
        args.length_prompts, args.length_samples = 16, 2
    if min(args.steps, args.rounds, args.eval_size) < 1:
        ap.error("--steps, --rounds and --eval-size must be >= 1")

    from rich.console import Console

    from areal_graph.cli.cmd_init_model import kit_progress
    from areal_graph.modelkit.builtin import resolve_model_path

    console = Console() if sys.stdout.isatty() else Console(width=220)
    wf = workflow_settings()
    with kit_progress(console) as progress:  # builds the kit on first use (minutes), once
        resolve_model_path(wf["model"], progress)

    out_path = args.out or RESULTS / ("longtail_quick.json" if args.quick else "longtail.json")
    settings = {
        "workflow": str(WORKFLOW.relative_to(ROOT)),
        "steps": args.steps,
        "rounds": args.rounds,
        "eval_size": args.eval_size,
        "extra_overrides": args.extra,
        "systems": dict(SYSTEMS),
        "seeds": [args.seed + r for r in range(args.rounds)],
        **wf,
        "cpu_count": os.cpu_count(),
        "window": "time(N) - time(1) + time/step(1) + time/wait_batch(1) from metrics.jsonl",
    }
    record: dict[str, Any] = {"settings": settings, "rounds": []}

    def write_json() -> None:
        record["summary"] = summarise(record["rounds"])
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(record, indent=2) + "\n")

    console.print(
        f"sampling the warm-start model's answers ({args.length_prompts} prompts x {args.length_samples}) ..."
    )
    record["warm_start_lengths"] = answer_lengths(wf, args.length_prompts, args.length_samples)
    print_table(console, [], None, args.steps, record["warm_start_lengths"])

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="areal-longtail-"))
    work.mkdir(parents=True, exist_ok=True)
    failures = 0
    t_all = time.perf_counter()
    try:
        start = run_eval(
            wf["model"], work / "warm_start.eval.json", args.eval_size, wf["max_new_tokens"], wf["eval_data"]
        )
        record["warm_start_accuracy"] = start
        console.print(f"warm-start greedy accuracy {start['greedy_accuracy']:.1%} on {start['eval_problems']} problems")
        for r in range(args.rounds):
            seed = args.seed + r
            order = SYSTEMS[r % 2 :] + SYSTEMS[: r % 2]
            rec: dict[str, Any] = {"round": r, "seed": seed, "order": [n for n, _ in order], "runs": {}}
            record["rounds"].append(rec)
            for name, eta in order:
                run_dir = work / f"r{r}" / name
                console.print(
                    f"[bold]round {r + 1}/{args.rounds}[/] {name} (eta {eta}, seed {seed}) ...", highlight=False
                )
                try:
                    res = run_system(eta, run_dir, args.steps, seed, args.extra)
                    res.update(
                        run_eval(
                            str(run_dir / "final_model"),
                            run_dir.parent / f"{name}.eval.json",
                            args.eval_size,
                            wf["max_new_tokens"],
                            wf["eval_data"],
                        )
                    )
                except Exception as exc:  # noqa: BLE001 - record it, go on with the other system
                    failures += 1
                    res = {"error": str(exc)}
                    console.print(f"  [red]failed:[/] {str(exc)[-2000:]}", highlight=False)
                else:
                    console.print(
                        f"  window {res['window_s']:.1f} s, total {res['total_s']:.1f} s, mean response "
                        f"{res['response_len_mean']:.0f} tokens, greedy acc {res['greedy_accuracy']:.1%}",
                        highlight=False,
                    )
                rec["runs"][name] = res
                a, s = rec["runs"].get("async", {}), rec["runs"].get("sync", {})
                if a.get("window_s") and s.get("window_s"):
                    rec["speedup"] = s["window_s"] / a["window_s"]
                write_json()
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    settings["benchmark_wall_s"] = time.perf_counter() - t_all
    write_json()
    print_table(
        console,
        record["rounds"],
        record["warm_start_accuracy"]["greedy_accuracy"],
        args.steps,
        record["warm_start_lengths"],
    )
    summary = record["summary"]
    if summary["speedup_median"]:
        console.print(
            f"speedup (sync window / async window), median over {len(summary['speedup_per_round'])} "
            f"round(s): {summary['speedup_median']:.2f}x",
            highlight=False,
        )
    console.print(f"wrote {out_path}" + (f" ({failures} run(s) failed)" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
