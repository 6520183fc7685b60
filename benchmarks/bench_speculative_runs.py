"""Speculative decoding end to end: each shipped workflow run with it on and off, interleaved.

`bench_speculative.py` measures the engine alone on an RL step's request mix; this measures what a
user sees: the steps window of a whole run (`areal-graph trace --json`'s `steps_window_s`, first
step's start to last step's end) with `inference.speculative.enabled` true against false, and
nothing else changed. Workflows: `ppo_async.yaml` (the shipped kit), `grpo_sync.yaml` (the same
kit, synchronous: every step ends in a tail of a few rows, where speculation pays most),
`ppo_async_longtail.yaml` and `ppo_async_testbed.yaml` (their own kits), each with its own KV
default (`keep` in the asynchronous ones).

Interleaved: every round runs each workflow off and on back to back, the order alternating by
round, so the shared machine's drift hits both sides alike; the speed-up is the median of the
rounds' own ratios (off window / on window), never a ratio across rounds. Beside it, from the
speculative runs' traces: the share of decode steps that verified and the tokens a row emitted
per verifying forward; and from both sides' metrics the mean reward over the run (speculation
keeps the tokens and their log-probs exact, so only the runs' own nondeterminism moves it).

    python benchmarks/bench_speculative_runs.py                 # 60 steps, 3 rounds (~12 min on 2 cores)
    python benchmarks/bench_speculative_runs.py --quick         # 10 steps, 1 round, ppo_async only

Prints a table and writes benchmarks/results/speculative_runs[_quick].json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
WORKFLOWS = ("ppo_async.yaml", "grpo_sync.yaml", "ppo_async_longtail.yaml", "ppo_async_testbed.yaml")
COMMON = ["runtime.eval_every=0", "runtime.save_every=0"]


def one_run(workflow: str, steps: int, speculative: bool, run_dir: Path, log: Path) -> dict[str, Any]:
    """One run; its window, its mean reward, and (speculating) what its engine verified."""
    from areal_graph.cli.measured_run import measured_run
    from areal_graph.runtime.observability.run_dir import METRICS_FILENAME, read_metrics_file
    from areal_graph.trace_analysis.speculation_summary import speculation_summary
    from areal_graph.trace_analysis.trace_model import load_timeline

    overrides = [f"runtime.steps={steps}", f"inference.speculative.enabled={str(speculative).lower()}", *COMMON]
    got = measured_run(ROOT.parent / "workflows" / workflow, overrides, run_dir, log, cwd=ROOT.parent)
    if got.exit_code != 0 or got.window_s is None:
        raise RuntimeError(f"{workflow} {' '.join(overrides)} failed (exit {got.exit_code}); log {log}")
    rewards = [m["reward/mean"] for m in read_metrics_file(run_dir / METRICS_FILENAME).records if "reward/mean" in m]
    out: dict[str, Any] = {"window_s": got.window_s, "reward_mean": statistics.fmean(rewards) if rewards else None}
    if speculative:
        spec = speculation_summary(load_timeline(run_dir))
        out["verifying_share"] = spec["verifying_share"] if spec["available"] else 0.0
        out["tokens_per_row_forward"] = spec["tokens_per_forward"] if spec["available"] else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60, help="training steps per run (default 60)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--workflows", default=",".join(WORKFLOWS), help="comma-separated workflow files")
    ap.add_argument("--quick", action="store_true", help="10 steps, 1 round, ppo_async.yaml only")
    ap.add_argument(
        "--out", type=Path, default=None, help="JSON path (default benchmarks/results/speculative_runs[_quick].json)"
    )
    args = ap.parse_args()
    if args.quick:
        args.steps, args.rounds, args.workflows = 10, 1, "ppo_async.yaml"
    if args.steps < 1 or args.rounds < 1:
        ap.error("--steps and --rounds must be >= 1")
    workflows = [w for w in args.workflows.split(",") if w]
    unknown = [w for w in workflows if not (ROOT.parent / "workflows" / w).is_file()]
    if unknown:
        ap.error(f"no such workflow in workflows/: {', '.join(unknown)}")
    console = Console() if sys.stdout.isatty() else Console(width=200)  # a pipe or log: no wrapping
    work = Path(tempfile.mkdtemp(prefix="bench-speculative-runs-"))
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {w: {"off": [], "on": []} for w in workflows}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        for w in workflows:
            order = (False, True) if r % 2 == 0 else (True, False)
            for spec in order:
                side = "on" if spec else "off"
                got = one_run(w, args.steps, spec, work / f"{w}-{side}-{r}", work / f"{w}-{side}-{r}.log")
                runs[w][side].append(got)
                console.print(f"  round {r + 1} {w:26s} {side:3s} {got['window_s']:6.1f} s", highlight=False)
    rows = [_row(w, runs[w]) for w in workflows]
    _print(console, rows, args)
    out = args.out or RESULTS / f"speculative_runs{'_quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "steps": args.steps,
                "rounds": args.rounds,
                "wall_s": time.perf_counter() - t0,
                "date": time.strftime("%Y-%m-%d"),
                "rows": rows,
                "runs": runs,
            },
            indent=1,
        )
    )
    console.print(f"wrote {out}")


def _row(workflow: str, sides: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    off = [x["window_s"] for x in sides["off"]]
    on = [x["window_s"] for x in sides["on"]]
    ratios = [a / b for a, b in zip(off, on)]  # within each round: > 1, speculation faster

    def mean_of(key: str, side: str) -> float | None:
        vals = [x[key] for x in sides[side] if x.get(key) is not None]
        return statistics.fmean(vals) if vals else None

    return {
        "workflow": workflow,
        "off_window_s": statistics.median(off),
        "on_window_s": statistics.median(on),
        "speedup": statistics.median(ratios),
        "speedups": ratios,
        "verifying_share": mean_of("verifying_share", "on"),
        "tokens_per_row_forward": mean_of("tokens_per_row_forward", "on"),
        "reward_off": mean_of("reward_mean", "off"),
        "reward_on": mean_of("reward_mean", "on"),
    }


def _print(console: Console, rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    table = Table(
        title=f"speculative decoding end to end: {args.steps} steps, median of {args.rounds} interleaved round(s)",
        title_justify="left",
    )
    for col in ("workflow", "off", "on", "speed-up (rounds)", "verifying share", "tokens/row/fwd", "reward off / on"):
        table.add_column(col, justify="left" if col == "workflow" else "right")
    for r in rows:
        tpf = r["tokens_per_row_forward"]
        table.add_row(
            r["workflow"],
            f"{r['off_window_s']:.1f} s",
            f"{r['on_window_s']:.1f} s",
            f"{r['speedup']:.2f}x ({', '.join(f'{v:.2f}' for v in r['speedups'])})",
            f"{r['verifying_share']:.0%}" if r["verifying_share"] is not None else "-",
            f"{tpf:.2f}" if tpf else "-",
            f"{r['reward_off']:.3f} / {r['reward_on']:.3f}"
            if r["reward_off"] is not None and r["reward_on"] is not None
            else "-",
        )
    console.print(table)


if __name__ == "__main__":
    main()
