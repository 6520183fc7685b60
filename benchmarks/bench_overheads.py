"""Per-call overheads of always-on machinery: tracing spans and GAE on a large packed batch.

Tracing wraps every node call and every generation, so a span must cost microseconds, not
milliseconds; GAE runs once per step over every generated token: it is written as tensor ops so it stays
on the device with the batch (no per-token host loop, no GPU->CPU sync); on a CPU the plain
loop is about as fast, and either costs well under a second per step.
Both are compared against a baseline measured in the same run (an empty loop; the plain
per-token Python loop GAE replaces, on a slice sized to finish quickly, scaled per token).

    python benchmarks/bench_overheads.py
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from areal_graph.nodes.advantages import gae
from areal_graph.runtime.tracing import Tracer

RESULTS = Path(__file__).resolve().parent / "results"


def span_cost(n: int = 20_000) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tr = Tracer(Path(tmp) / "t.json", flush_every=10**9)
        t0 = time.perf_counter()
        for i in range(n):
            with tr.span("step", cat="c", step=i):
                pass
        traced = (time.perf_counter() - t0) / n
        tr.close()
    t0 = time.perf_counter()
    for i in range(n):
        pass
    empty = (time.perf_counter() - t0) / n
    return {"per_span_us": traced * 1e6, "empty_loop_us": empty * 1e6}


def packed_batch(n_seq: int, max_len: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, max_len, (n_seq,), generator=g)
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
    return adv


def gae_cost(n_seq: int = 512, max_len: int = 2048) -> dict:
    rewards, values, mask, cu = packed_batch(n_seq, max_len)
    t0 = time.perf_counter()
    gae(rewards, values, mask, cu, 0.99, 0.95)
    vec = time.perf_counter() - t0
    n_small = 32
    small = packed_batch(n_small, max_len, seed=1)
    t0 = time.perf_counter()
    loop_gae(*small, 0.99, 0.95)
    loop_per_token = (time.perf_counter() - t0) / int(small[3][-1])
    tokens = int(cu[-1])
    return {"tokens": tokens, "vectorised_s": vec, "loop_s_estimated": loop_per_token * tokens,
            "speedup": loop_per_token * tokens / vec}


def main() -> int:
    spans, g = span_cost(), gae_cost()
    table = Table(title="Always-on overheads (one run, shared machine)")
    table.add_column("what")
    table.add_column("measured", justify="right")
    table.add_column("baseline", justify="right")
    table.add_column("ratio", justify="right")
    table.add_row("tracing span (us/call)", f"{spans['per_span_us']:.1f}", f"{spans['empty_loop_us']:.2f} empty loop",
                  f"{spans['per_span_us'] / max(spans['empty_loop_us'], 1e-9):.0f}x")
    table.add_row(f"GAE, {g['tokens']:,} tokens (s)", f"{g['vectorised_s']:.3f}",
                  f"{g['loop_s_estimated']:.3f} python loop", f"{g['speedup']:.2f}x loop/vec")
    console = Console()
    console.print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "overheads.json"
    out.write_text(json.dumps({"tracing": spans, "gae": g}, indent=2))
    console.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
