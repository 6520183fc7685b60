"""Does self-play learn (issue 50)? The learning curve in docs/agents.md.

Runs workflows/textarena_selfplay.yaml (TicTacToe-v0 on the shipped kit tiny-tictactoe, both seats
played by the policy and trained) with each RL seed, with the advantage's baseline per seat
(`baseline: seat`, the workflow's) and shared by the seats (`baseline: group`), one run at a time,
and reads back from each run's metrics.jsonl the greedy evaluation against the fixed opponents:
games won, drawn and lost against the random and the heuristic opponent, from each seat, at every
evaluation. Prints a table and writes benchmarks/results/selfplay.json.

    python benchmarks/bench_selfplay.py                                 # seeds 1 and 2, both baselines
    python benchmarks/bench_selfplay.py --baselines seat --seeds 1 --steps 100
    python benchmarks/bench_selfplay.py --read /tmp/selfplay            # summarise runs made before
                                                                        # (DIR/<baseline>_s<seed>/)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
WORKFLOW = "workflows/textarena_selfplay.yaml"
OPPONENTS = ("random", "heuristic")
console = Console(width=220)


def summarise(run_dir: Path) -> dict:
    """Every evaluation's games won / drawn / lost per opponent and seat, from metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals: dict[int, dict[str, float]] = {}
    for r in rows:
        if "eval/accuracy" not in r:
            continue
        evals[int(r["step"])] = {
            f"{k}_vs_{o}_seat{s}": r.get(f"eval/env/{k}_vs_{o}_seat{s}")
            for o in OPPONENTS
            for s in (0, 1)
            for k in ("won", "drawn", "lost")
        } | {f"{k}_vs_{o}": r.get(f"eval/env/{k}_vs_{o}") for o in OPPONENTS for k in ("won", "drawn", "lost")}
        evals[int(r["step"])]["invalid_move"] = r.get("eval/env/invalid_move")
    trained = [r for r in rows if "env/won_seat0" in r]
    return {
        "run_dir": str(run_dir),
        "steps": max((int(r["step"]) for r in trained), default=0),
        "evals": evals,
        "selfplay_seat0_won_first10": _mean(trained[:10], "env/won_seat0"),
        "selfplay_seat0_won_last10": _mean(trained[-10:], "env/won_seat0"),
    }


def _mean(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if key in r]
    return sum(vals) / len(vals) if vals else None


def run(baseline: str, seed: int, steps: int, out: Path) -> dict:
    run_dir = out / f"{baseline}_s{seed}"
    t0 = time.perf_counter()
    cmd = [
        sys.executable,
        "-m",
        "areal_graph.cli.main",
        "run",
        WORKFLOW,
        f"runtime.seed={seed}",
        f"runtime.steps={steps}",
        f"nodes.advantage.baseline={baseline}",
        "--run-dir",
        str(run_dir),
    ]
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return {**summarise(run_dir), "wall_s": round(time.perf_counter() - t0, 1)}


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baselines", nargs="+", choices=["seat", "group"], default=["seat", "group"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("/tmp/selfplay"), help="where the runs go")
    ap.add_argument("--read", type=Path, help="summarise DIR/<baseline>_s<seed>/ instead of running")
    args = ap.parse_args(argv)
    results = []
    for seed in args.seeds:  # interleaved: both baselines of one seed, then the next seed
        for baseline in args.baselines:
            if args.read:
                res = summarise(args.read / f"{baseline}_s{seed}")
            else:
                res = run(baseline, seed, args.steps, args.out)
            results.append({"baseline": baseline, "seed": seed, **res})
    table = Table(title="greedy games against fixed opponents: won / drawn / lost, seat 0 | seat 1 (32 games each)")
    for col in ("baseline", "RL seed", "step", *(f"vs {o}" for o in OPPONENTS), "invalid moves"):
        table.add_column(col)
    for r in results:
        for step, e in sorted(r["evals"].items()):
            cells = [
                " | ".join(
                    "/".join(pct(e.get(f"{k}_vs_{o}_seat{s}")) for k in ("won", "drawn", "lost")) for s in (0, 1)
                )
                for o in OPPONENTS
            ]
            table.add_row(r["baseline"], str(r["seed"]), str(step), *cells, pct(e.get("invalid_move")))
    console.print(table)
    dest = ROOT / "results" / "selfplay.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(results, indent=2) + "\n")
    console.print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
