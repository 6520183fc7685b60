"""Cost of the pure RL math and of reward scoring, as ratios measured in one run.

- GAE over a packed batch: the vectorised blocked scan vs a plain Python loop over tokens.
- Decoupled PPO loss, forward + backward, tokens per second.
- Math reward: RewardPool (worker processes, per-item timeout) vs calling math_reward in
  this process, items per second.

    python benchmarks/bench_math.py            # 256 sequences up to 1024 tokens, 512 rewards
    python benchmarks/bench_math.py --quick    # smaller, < 60 s
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from areal_graph.nodes.advantages import gae
from areal_graph.nodes.math_reward import math_reward
from areal_graph.nodes.ppo_loss import aggregate, decoupled_ppo_loss, loss_normalizer
from areal_graph.tools.reward_pool import RewardPool

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def packed_batch(n_seq: int, max_len: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(max_len // 4, max_len, (n_seq,), generator=g)
    cu = torch.zeros(n_seq + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0)
    n = int(cu[-1])
    mask = (torch.rand(n, generator=g) < 0.8).float()
    return torch.randn(n, generator=g), torch.randn(n, generator=g), mask, cu


def loop_gae(rewards, values, mask, cu, gamma, lam):
    r, v, m, c = rewards.tolist(), values.tolist(), mask.tolist(), cu.tolist()
    adv = [0.0] * len(m)
    for i in range(len(c) - 1):
        next_v = next_a = 0.0
        for t in range(c[i + 1] - 1, c[i] - 1, -1):
            if m[t]:
                a = r[t] + gamma * next_v - v[t] + gamma * lam * next_a
                adv[t], next_v, next_a = a, v[t], a
    return torch.tensor(adv)


def timed(fn, repeat: int) -> float:
    """Median wall time of `repeat` calls after one warm-up (the median resists the noise of
    other jobs sharing the cores)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def bench_gae(n_seq: int, max_len: int) -> dict:
    rewards, values, mask, cu = packed_batch(n_seq, max_len)
    vec = timed(lambda: gae(rewards, values, mask, cu, 0.99, 0.95), 5)
    loop = timed(lambda: loop_gae(rewards, values, mask, cu, 0.99, 0.95), 1)
    err = float(
        (gae(rewards, values, mask, cu, 0.99, 0.95)[0] - loop_gae(rewards, values, mask, cu, 0.99, 0.95)).abs().max()
    )
    return {
        "tokens": int(cu[-1]),
        "vectorised_s": vec,
        "python_loop_s": loop,
        "speedup": loop / vec,
        "max_abs_diff": err,
    }


def bench_ppo(n_seq: int, max_len: int) -> dict:
    _, _, mask, cu = packed_batch(n_seq, max_len)
    n = mask.numel()
    lp = -torch.rand(n)
    prox, behav, adv = lp + 0.1 * torch.randn(n), lp + 0.2 * torch.randn(n), torch.randn(n)
    norm = loss_normalizer(mask, cu, "token-mean")

    def step():
        x = lp.clone().requires_grad_(True)
        per_tok, _ = decoupled_ppo_loss(x, prox, behav, adv, mask, dual_clip=3.0, behav_imp_cap=5.0)
        aggregate(per_tok, mask, cu, "token-mean", norm).backward()

    sec = timed(step, 7)
    return {"tokens": n, "fwd_bwd_s": sec, "tokens_per_s": n / sec}


def bench_reward(n_items: int, workers: int) -> dict:
    completions = [f"so the result is \\boxed{{\\frac{{{i}}}{{{i + 1}}}}}" for i in range(n_items)]
    answers = [f"{i}/{i + 1}" if i % 3 else "0.5" for i in range(n_items)]
    t0 = time.perf_counter()
    local = [math_reward(c, a) for c, a in zip(completions, answers)]
    local_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with RewardPool("math_verify", timeout_s=10, num_workers=workers) as pool:
        start_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        pooled = pool.score(completions, answers)
        pool_s = time.perf_counter() - t1
    assert [r.reward for r in pooled] == local, "pool and in-process scoring disagree"
    return {
        "items": n_items,
        "workers": workers,
        "in_process_items_per_s": n_items / local_s,
        "pool_items_per_s": n_items / pool_s,
        "pool_startup_s": start_s,
        "pool_vs_in_process": local_s / pool_s,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, < 60 s")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        choices=(1, 2),
        help="torch intra-op threads (default 1: on a loaded 2-core machine, 2 threads "
        "make small ops 10-50x slower through OpenMP contention)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    n_seq, max_len, n_items = (64, 512, 128) if args.quick else (256, 1024, 512)

    results = {
        "quick": args.quick,
        "threads": args.threads,
        "gae": bench_gae(n_seq, max_len),
        "ppo_loss": bench_ppo(n_seq, max_len),
        "reward": bench_reward(n_items, workers=2),
    }

    table = Table(title="RL math and reward cost (ratios from this one run)")
    table.add_column("what")
    table.add_column("measure", justify="right")
    g, p, r = results["gae"], results["ppo_loss"], results["reward"]
    table.add_row(f"GAE, {g['tokens']} tokens, vectorised", f"{g['vectorised_s'] * 1e3:.1f} ms")
    table.add_row("GAE, Python loop over tokens", f"{g['python_loop_s'] * 1e3:.1f} ms")
    table.add_row("GAE speed-up (max |diff|)", f"{g['speedup']:.0f}x ({g['max_abs_diff']:.1e})")
    table.add_row(f"decoupled PPO loss fwd+bwd, {p['tokens']} tokens", f"{p['tokens_per_s'] / 1e6:.1f} M tok/s")
    table.add_row(f"math_reward in process, {r['items']} items", f"{r['in_process_items_per_s']:.0f} items/s")
    table.add_row(f"RewardPool, {r['workers']} workers", f"{r['pool_items_per_s']:.0f} items/s")
    table.add_row("RewardPool start-up (warm-up)", f"{r['pool_startup_s']:.2f} s")
    Console().print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "math.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
