"""Dynamic-batching planner vs fixed-size micro-batching vs the lower bound.

Lengths are lognormal (long-tailed, like RL responses), clipped to half the token budget.
For each batch size it compares:

- planner: `plan_microbatches` (token budget per micro-batch, balanced);
- fixed (safe): n = budget // longest sequence per micro-batch, so a micro-batch padded to
  its longest sequence always fits the budget (what a padded trainer must do);
- fixed (mean): n = budget // mean length: about as few micro-batches as the planner, but
  some overflow the budget (memory spikes);
- lower bound: ceil(total tokens / budget).

Reported: micro-batch count, padding (planner: the row padding the training engine really
computes when it runs the plan, `row_forwards` with 256-token rows; fixed: each micro-batch
padded to its longest sequence, as a padded trainer runs it), share of micro-batches over the budget, token balance (max / mean tokens per
micro-batch), planning time (wall, and CPU time of this process, steadier
on a shared machine). Ratios are measured in one run on a shared machine.

    python benchmarks/bench_planner.py            # 10k and 100k sequences, best of 3
    python benchmarks/bench_planner.py --quick    # best of 1 (< 60 s)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from areal_graph.engines.training.microbatch_planner import plan_microbatches
from areal_graph.engines.training.packed_scoring import ROW_TOKENS, row_forwards

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def lognormal_lengths(n: int, budget: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(math.log(600), 1.0, n).astype(np.int64), 8, budget // 2)


def describe(mbs: list[list[int]], lens: np.ndarray, budget: int) -> dict:
    tokens = np.array([int(lens[mb].sum()) for mb in mbs if mb], dtype=np.int64)
    padded = np.array([len(mb) * int(lens[mb].max()) for mb in mbs if mb], dtype=np.int64)
    return {
        "microbatches": len(mbs),
        "padding_frac": float(1 - tokens.sum() / padded.sum()),
        "over_budget_frac": float((tokens > budget).mean()),
        "max_mb_tokens": int(tokens.max()),
        "balance_max_over_mean": float(tokens.max() / tokens.mean()),
    }


def engine_positions(mbs: list[list[int]], lens: np.ndarray, row_tokens: int = ROW_TOKENS) -> int:
    """Positions the engine computes for a plan (rows x width per forward): real tokens + row padding."""
    computed = 0
    for mb in mbs:
        sub = lens[mb].tolist() if mb else []
        for rows in row_forwards(sub, row_tokens):
            computed += len(rows) * max(sum(sub[j] for j in row) for row in rows)
    return computed


def engine_padding(mbs: list[list[int]], lens: np.ndarray, row_tokens: int = ROW_TOKENS) -> float:
    """Share of the positions the engine computes that are padding."""
    real = sum(int(lens[mb].sum()) for mb in mbs if mb)
    return 1 - real / max(engine_positions(mbs, lens, row_tokens), 1)


def fixed(n_total: int, per_mb: int) -> list[list[int]]:
    return [list(range(s, min(s + per_mb, n_total))) for s in range(0, n_total, per_mb)]


def bench(n: int, budget: int, repeats: int, dp: int) -> list[dict]:
    lens = lognormal_lengths(n, budget)
    total = int(lens.sum())
    rows = []
    best = best_cpu = math.inf
    plan = None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        plan = plan_microbatches(lens, budget, dp)
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    assert plan is not None
    flat = [mb for rank in plan for mb in rank]
    rank_tokens = [int(sum(lens[mb].sum() for mb in rank if mb)) for rank in plan]
    rows.append(
        {
            "n": n,
            "dp": dp,
            "method": "planner",
            **describe(flat, lens, budget),
            "padding_frac": engine_padding(flat, lens),
            "plan_s": best,
            "plan_cpu_s": best_cpu,
            "rank_imbalance": max(rank_tokens) / (sum(rank_tokens) / dp),
        }
    )
    if dp == 1:
        for label, per in (
            ("fixed (safe)", max(1, budget // int(lens.max()))),
            ("fixed (mean)", max(1, int(budget // lens.mean()))),
        ):
            rows.append(
                {
                    "n": n,
                    "dp": dp,
                    "method": f"{label} n={per}",
                    **describe(fixed(n, per), lens, budget),
                    "plan_s": 0.0,
                    "plan_cpu_s": 0.0,
                    "rank_imbalance": 1.0,
                }
            )
    rows.append(
        {
            "n": n,
            "dp": dp,
            "method": "lower bound",
            "microbatches": dp * max(math.ceil(total / dp / budget), 1),
            "padding_frac": None,
            "over_budget_frac": 0.0,
            "max_mb_tokens": None,
            "balance_max_over_mean": None,
            "plan_s": None,
            "plan_cpu_s": None,
            "rank_imbalance": None,
        }
    )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one repeat per configuration")
    ap.add_argument("--budget", type=int, default=16384, help="max tokens per micro-batch")
    args = ap.parse_args()
    repeats = 1 if args.quick else 3
    rows = []
    for n in (10_000, 100_000):
        for dp in (1, 8):
            rows += bench(n, args.budget, repeats, dp)

    def f(v, fmt):
        return "-" if v is None else fmt.format(v)

    table = Table(
        title=f"micro-batching, lognormal lengths, budget {args.budget} tokens (micro-batches summed over ranks)"
    )
    for col in (
        "n",
        "dp",
        "method",
        "micro-batches",
        "padding",
        "over budget",
        "max/mean tokens",
        "rank imb.",
        "plan wall",
        "plan cpu",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["n"]),
            str(r["dp"]),
            r["method"],
            str(r["microbatches"]),
            f(r["padding_frac"], "{:.1%}"),
            f(r["over_budget_frac"], "{:.1%}"),
            f(r["balance_max_over_mean"], "{:.3f}"),
            f(r["rank_imbalance"], "{:.4f}"),
            f(r["plan_s"], "{:.3f} s"),
            f(r["plan_cpu_s"], "{:.3f} s"),
        )
    table.caption = (
        f"padding: planner, of the rows the engine computes ({ROW_TOKENS}-token rows, long sequences "
        "alone, grouped by width); fixed, each micro-batch padded to its longest sequence"
    )
    console = Console(width=max(Console().width, 130))
    console.print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "planner.json"
    out.write_text(json.dumps({"budget": args.budget, "repeats": repeats, "results": rows}, indent=2))
    console.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
