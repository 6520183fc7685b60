"""Which TextArena games start here, and why the others do not (issue 48): the table in
docs/agents.md (TextArena section).

Every game id of textarena's ENV_REGISTRY (not the -raw and -train variants) is reset with one
player, seed 0, in a process of its own (a game's import may download, hang or leave state
behind), through the same check `validate` and `run` use (data/textarena_games.py `check_env`,
classified by data/textarena_start.py), with a per-game time limit. Prints the single-player
games as a Markdown table (game, starts?, why not, seconds) and a summary of the multi-player
ones; writes everything to benchmarks/results/textarena_games.json.

    python benchmarks/bench_textarena_games.py              # every game, 2 at a time
    python benchmarks/bench_textarena_games.py --jobs 4 Hangman-v0 Wordle-v0

CPU only, no downloads (a game that tries one is reported as needing that data).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parent
console = Console(width=200)

# One game's check in a fresh interpreter: prints {"kind", "detail", "seconds"} as JSON.
CHILD = """
import json, sys, time
from areal_graph.data import textarena_games as tg, textarena_start as ts
env = sys.argv[1]
t0 = time.perf_counter()
failure = ts.try_start(lambda: tg.started(env), timeout_s=float(sys.argv[2]))
print(json.dumps({"kind": failure and failure.kind, "detail": failure and failure.detail, "short": failure and failure.short,
                  "seconds": round(time.perf_counter() - t0, 2)}))
"""


def game_ids() -> list[str]:
    from textarena.envs.registration import ENV_REGISTRY

    return sorted(n for n in ENV_REGISTRY if not n.endswith(("-raw", "-train")))


def check(env: str, timeout_s: float) -> dict:
    """One game's result, from a child process (killed if it outlives its own time limit)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, env, str(timeout_s)],
            capture_output=True,
            text=True,
            timeout=timeout_s + 60,
        )
        line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        if done.returncode == 0 and line.startswith("{"):
            return {"game": env, **json.loads(line)}
        return {"game": env, "kind": "error", "detail": (done.stderr or done.stdout).strip()[-300:], "seconds": None}
    except subprocess.TimeoutExpired:
        return {"game": env, "kind": "timeout", "detail": f"no answer within {timeout_s + 60:.0f} s", "seconds": None}


def markdown(results: list[dict]) -> str:
    """The docs table: every game that is not multi-player, whether it starts, why not, and whether
    the messages recommend it (PLAYABLE_GAMES). Variants of one game with the same outcome share a
    row (`2048-v0`, `-3x3`, ...)."""
    from areal_graph.data.textarena_start import PLAYABLE_GAMES

    rows: list[tuple[list[str], dict]] = []
    for r in results:
        if r["kind"] == "multi-player":
            continue
        base = r["game"].split("-v0")[0]
        last = rows[-1] if rows else None
        if (
            last
            and last[0][0].split("-v0")[0] == base
            and (last[1]["kind"], last[1].get("short")) == (r["kind"], r.get("short"))
        ):
            last[0].append(r["game"])
        else:
            rows.append(([r["game"]], r))
    lines = ["| game | starts | why not | recommended |", "|---|---|---|---|"]
    for games, r in rows:
        names = ", ".join([f"`{games[0]}`"] + [f"`{g.split('-v0', 1)[1] or g}`" for g in games[1:]])
        why = "" if r["kind"] is None else f"{r['kind']}: {r.get('short') or r['detail']}"
        recommended = ", ".join(f"`{g}`" for g in games if g in PLAYABLE_GAMES)
        lines.append(f"| {names} | {'yes' if r['kind'] is None else 'no'} | {why.replace('|', '/')} | {recommended} |")
    return "\n".join(lines)


def multi_player_line(results: list[dict]) -> str:
    """The multi-player games, by name (their variants counted)."""
    bases: dict[str, int] = {}
    for r in results:
        if r["kind"] == "multi-player":
            base = r["game"].split("-v0")[0] + "-v0"
            bases[base] = bases.get(base, 0) + 1
    return ", ".join(f"{b}" + (f" (+{n - 1})" if n > 1 else "") for b, n in bases.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("games", nargs="*", help="game ids (default: every one)")
    ap.add_argument("--jobs", type=int, default=2, help="games checked at once (default 2)")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds a game's first reset may take")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "textarena_games.json")
    ap.add_argument("--render", type=Path, help="print the tables of an earlier run's JSON instead of running")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.render:
        results = json.loads(args.render.read_text())
    else:
        games = args.games or game_ids()
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(lambda g: check(g, args.timeout), games))
    console.print(markdown(results), highlight=False, soft_wrap=True)
    multi = [r["game"] for r in results if r["kind"] == "multi-player"]
    starts = [r["game"] for r in results if r["kind"] is None]
    console.print(
        f"\n{len(results)} games"
        + ("" if args.render else f" in {time.perf_counter() - t0:.0f} s")
        + f": {len(starts)} start with one player, "
        f"{len(results) - len(starts) - len(multi)} single-player ones do not, {len(multi)} are multi-player:\n"
        + multi_player_line(results),
        highlight=False,
        soft_wrap=True,
    )
    if args.render:
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
