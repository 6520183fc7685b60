"""Do TextArena games learn on the builtin game kit (issue 48)? The table in docs/agents.md.

Runs each game on the kit `tiny-games` (workflows/textarena_hanoi.yaml and textarena_blackjack.yaml;
Cryptarithm-v0 and FrozenLake-v0 as the Hanoi workflow with their data, FrozenLake with `reward:
won`: neither learns here) with each RL seed, one run at a time, and reads back from each run's
metrics.jsonl the game's measure of learning: for Hanoi, FrozenLake and Cryptarithm the share of
games won (sampled in training: `env/won`; greedy at each evaluation: `eval/env/won`), for
Blackjack the share of hands won, which is its reward (`reward/mean`, `eval/rewards`): the mean
over training steps 1-10, 41-50 and the last 10, and the greedy value at every evaluation.
Prints a table and writes benchmarks/results/game_learning.json.

    python benchmarks/bench_game_learning.py                        # TowerOfHanoi, RL seeds 1 and 2
    python benchmarks/bench_game_learning.py --games hanoi blackjack --seeds 1 2 3
    python benchmarks/bench_game_learning.py --read /tmp/games      # summarise runs made before
                                                                    # (DIR/<game>_s<seed>/)

About 7-10 minutes per run on 2 cores.
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
console = Console(width=200)
HANOI = "workflows/textarena_hanoi.yaml"
# a game's measure -> (its training metric, its evaluation metric)
MEASURES = {"games won": ("env/won", "eval/env/won"), "hands won": ("reward/mean", "eval/rewards")}
MEASURE = {"blackjack": "hands won"}  # every other game: games won
# game -> (workflow, overrides)
GAMES: dict[str, tuple[str, list[str]]] = {
    "hanoi": (HANOI, []),
    "crypt": (
        HANOI,
        [
            "data.train=textarena:Cryptarithm-v0?size=4000&seed=1",
            "data.eval=textarena:Cryptarithm-v0?size=1&seed=2",
        ],
    ),
    "blackjack": ("workflows/textarena_blackjack.yaml", []),
    "lake": (
        HANOI,
        [
            "data.train=textarena:FrozenLake-v0?size=4000&seed=1",
            "data.eval=textarena:FrozenLake-v0?size=128&seed=2",
            "data.eval_size=128",
            "nodes.rollout.rollout_args.reward=won",  # FrozenLake pays a fall into a hole its share of the way
        ],
    ),
}


def window(rows: list[dict], key: str, lo: int, hi: int) -> float | None:
    """Mean of metric `key` over training steps lo..hi (inclusive)."""
    vals = [r[key] for r in rows if key in r and lo <= r.get("step", -1) <= hi]
    return sum(vals) / len(vals) if vals else None


def summarise(run_dir: Path, measure: str = "games won") -> dict:
    """What the table shows of one run, from its metrics.jsonl (`measure`: a key of MEASURES)."""
    train_key, eval_key = MEASURES[measure]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    last = max((r.get("step", 0) for r in rows if train_key in r), default=0)
    evals = {r["step"]: r[eval_key] for r in rows if eval_key in r}
    return {
        "run_dir": str(run_dir),
        "measure": measure,
        "steps": last,
        "sampled_won_first10": window(rows, train_key, 1, 10),
        "sampled_won_41_50": window(rows, train_key, 41, 50),
        "sampled_won_last10": window(rows, train_key, last - 9, last),
        "greedy_won": evals,
    }


def run(game: str, seed: int, out: Path) -> dict:
    run_dir = out / f"{game}_s{seed}"
    workflow, overrides = GAMES[game]
    t0 = time.perf_counter()
    cmd = [
        sys.executable,
        "-m",
        "areal_graph.cli.main",
        "run",
        workflow,
        *overrides,
        f"runtime.seed={seed}",
        "--run-dir",
        str(run_dir),
    ]
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return {**summarise(run_dir, MEASURE.get(game, "games won")), "wall_s": round(time.perf_counter() - t0, 1)}


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--games", nargs="+", choices=sorted(GAMES), default=["hanoi"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--out", type=Path, default=Path("/tmp/game_learning"), help="where the runs go")
    ap.add_argument("--read", type=Path, help="summarise DIR/<game>_s<seed>/ instead of running")
    args = ap.parse_args(argv)
    results = []
    for game in args.games:
        for seed in args.seeds:
            if args.read:
                res = summarise(args.read / f"{game}_s{seed}", MEASURE.get(game, "games won"))
            else:
                res = run(game, seed, args.out)
            workflow, overrides = GAMES[game]
            results.append({"game": game, "workflow": workflow, "overrides": overrides, "seed": seed, **res})
    table = Table(
        title="the share won (games, or Blackjack's hands): sampled in training and greedy at each evaluation"
    )
    for col in (
        "game",
        "measure",
        "RL seed",
        "steps",
        "sampled 1-10",
        "sampled 41-50",
        "sampled last 10",
        "greedy by step",
    ):
        table.add_column(col)
    for r in results:
        greedy = ", ".join(f"{s}: {pct(v)}" for s, v in sorted(r["greedy_won"].items(), key=lambda kv: int(kv[0])))
        table.add_row(
            r["game"],
            r["measure"],
            str(r["seed"]),
            str(r["steps"]),
            pct(r["sampled_won_first10"]),
            pct(r["sampled_won_41_50"]),
            pct(r["sampled_won_last10"]),
            greedy,
        )
    console.print(table)
    dest = ROOT / "results" / "game_learning.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(results, indent=2) + "\n")
    console.print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
