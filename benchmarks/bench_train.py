"""Training throughput: packed micro-batches (the engine's way) vs padded ones.

Workload: RL-like batches whose sequence lengths are lognormal (long-tailed; prompt 16-64
tokens plus a response), the same random Qwen2 (hidden 256, 4 layers, vocab 1024, ~3.2M
parameters), fp32, the same thread count, one full optimizer step (forward, backward,
grad clipping, AdamW) per batch. Both sides give each micro-batch the same budget of *real*
tokens, and tokens/s counts real tokens only.

- packed: `TrainEngine.train_step`: the planner packs sequences into micro-batches of at
  most `--budget` tokens; each micro-batch runs as a few forwards (`plan_rows`): short
  sequences share rows of <= 256 tokens (position_ids reset per sequence), long ones get a
  row each, grouped by width, their padding filled with short sequences;
- padded: sequences in arrival order fill a micro-batch up to `--budget` real tokens; one
  sequence per row, right-padded to the longest in the micro-batch, with an attention mask
  (what a trainer without packing does);
- padded, sorted: the same after sorting the batch by length (length bucketing, the usual
  mitigation), for reference.

Steps of the three methods are interleaved (packed, padded, sorted, packed, ...) so that
drift on a shared machine hits them alike; the speed-up is the median over steps of the
step-time ratio on the same batch.

    python benchmarks/bench_train.py            # 64 sequences a step, 3 measured steps per method
    python benchmarks/bench_train.py --quick    # 32 sequences, 1 measured step

On a shared 2-core machine a full run takes minutes (the padded baseline is the slow part).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from areal_graph.data.packed import PackedBatch
from areal_graph.engines.training.microbatch_planner import plan_microbatches
from areal_graph.engines.training.train_engine import TrainEngine
from bench_generation import build_model  # the same random Qwen2 (vocab VOCAB) as the generation benchmark
from bench_planner import engine_positions

RESULTS = Path(__file__).resolve().parent / "results"
VOCAB = 1024


def make_batch(n: int, seed: int, median: int, sigma: float, max_len: int) -> PackedBatch:
    """Prompt of 16-64 tokens + lognormal response; loss on the response."""
    g = torch.Generator().manual_seed(seed)
    toks, mask = [], []
    for _ in range(n):
        plen = int(torch.randint(16, 65, (1,), generator=g))
        rlen = int(min(max_len - plen, max(4, round(median * math.exp(sigma * float(torch.randn(1, generator=g)))))))
        toks.append(torch.randint(3, VOCAB, (plen + rlen,), generator=g).tolist())
        mask.append([0] * plen + [1] * rlen)
    return PackedBatch.from_sequences({"input_ids": toks, "loss_mask": mask})


def mean_nll(batch: PackedBatch):
    """Token-mean negative log-likelihood of the response, normalised over the whole batch."""
    total = max(float(batch["loss_mask"].sum()), 1.0)

    def loss_fn(lp, _ent, mb):
        return -(lp * mb["loss_mask"].float()).sum() / total, {}

    return loss_fn


def packed_positions(batch: PackedBatch, budget: int, row_tokens: int) -> int:
    """Positions the engine computes for this batch (its planner's plan), row padding included."""
    lens = batch.seqlens().numpy()
    return engine_positions(plan_microbatches(lens.tolist(), budget)[0], lens, row_tokens)


def padded_microbatches(lens: list[int], budget: int, order: list[int]) -> list[list[int]]:
    """Fill micro-batches in `order` until the next sequence would exceed `budget` real tokens."""
    mbs, cur, load = [], [], 0
    for i in order:
        if cur and load + lens[i] > budget:
            mbs.append(cur)
            cur, load = [], 0
        cur.append(i)
        load += lens[i]
    if cur:
        mbs.append(cur)
    return mbs


class PaddedTrainer:
    """The baseline: one right-padded row per sequence, attention mask, same loss and optimizer."""

    def __init__(self, model: torch.nn.Module, lr: float, grad_clip: float) -> None:
        self.model = model
        self.grad_clip = grad_clip
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    def train_step(self, batch: PackedBatch, budget: int, sort: bool) -> dict[str, float]:
        lens = batch.seqlens().tolist()
        order = sorted(range(len(lens)), key=lambda i: lens[i]) if sort else list(range(len(lens)))
        mbs = padded_microbatches(lens, budget, order)
        total = max(float(batch["loss_mask"].sum()), 1.0)
        self.optimizer.zero_grad(set_to_none=True)
        computed = 0
        for idx in mbs:
            width = max(lens[i] for i in idx)
            ids = torch.zeros(len(idx), width, dtype=torch.long)
            attn = torch.zeros(len(idx), width, dtype=torch.long)
            lmask = torch.zeros(len(idx), width)
            for r, i in enumerate(idx):
                n = lens[i]
                ids[r, :n] = batch.sequence(i, "input_ids")
                attn[r, :n] = 1
                lmask[r, :n] = batch.sequence(i, "loss_mask").float()
            computed += len(idx) * width
            logits = self.model(input_ids=ids, attention_mask=attn, use_cache=False).logits.float()
            logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
            loss = -(logp * lmask[:, 1:]).sum() / total
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        return {"n_microbatches": len(mbs), "computed_tokens": computed}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="32 sequences, 1 measured step per method")
    ap.add_argument("--seqs", type=int, default=None, help="sequences per batch (one optimizer step; default 64)")
    ap.add_argument("--budget", type=int, default=4096, help="real tokens per micro-batch")
    ap.add_argument("--median", type=int, default=96, help="median response length")
    ap.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of response lengths")
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (same for all methods). Default 1: with 2 threads on a shared 2-core "
                         "machine, OpenMP barriers wait on descheduled threads and steps swing 2x")
    ap.add_argument("--steps", type=int, default=None, help="measured steps per method (default 3, quick 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    steps = args.steps or (1 if args.quick else 3)
    args.seqs = args.seqs or (32 if args.quick else 64)
    warmup = make_batch(16, 1000, args.median, args.sigma, args.max_len)  # allocator, kernels
    batches = [warmup] + [make_batch(args.seqs, seed, args.median, args.sigma, args.max_len) for seed in range(steps)]

    packed = TrainEngine(build_model(), lr=1e-4, grad_clip=1.0)
    padded = PaddedTrainer(build_model(), lr=1e-4, grad_clip=1.0)
    n_params = sum(p.numel() for p in packed.model.parameters())
    methods = {
        "packed (engine)": lambda b: packed.train_step(b, mean_nll(b), max_tokens_per_mb=args.budget),
        "padded": lambda b: padded.train_step(b, args.budget, sort=False),
        "padded, sorted": lambda b: padded.train_step(b, args.budget, sort=True),
    }
    times: dict[str, list[float]] = {m: [] for m in methods}
    cpu: dict[str, list[float]] = {m: [] for m in methods}
    info: dict[str, dict] = {}
    for step, batch in enumerate(batches):  # step 0 warms up
        for name, fn in methods.items():
            t0, c0 = time.perf_counter(), time.process_time()
            out = fn(batch)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if step:
                times[name].append(dt)
                cpu[name].append(dc)
                info.setdefault(name, {"n_microbatches": [], "computed_tokens": [], "real_tokens": []})
                info[name]["n_microbatches"].append(int(out["n_microbatches"]))
                # outside the timed region: re-planning is bookkeeping, not the packed step's cost
                computed = (packed_positions(batch, args.budget, packed.row_tokens) if name == "packed (engine)"
                            else out.get("computed_tokens", batch.num_tokens))
                info[name]["computed_tokens"].append(int(computed))
                info[name]["real_tokens"].append(batch.num_tokens)

    rows = []
    for name in methods:
        real = sum(info[name]["real_tokens"])
        computed = sum(info[name]["computed_tokens"])
        med = statistics.median(times[name])
        rows.append({"method": name, "tokens_per_s": real / sum(times[name]), "median_step_s": med,
                     "step_s": times[name], "tokens_per_cpu_s": real / sum(cpu[name]), "step_cpu_s": cpu[name],
                     "microbatches_per_step": statistics.mean(info[name]["n_microbatches"]),
                     "padding_frac": 1 - real / computed, "real_tokens_per_step": real / len(times[name])})
    # Speed-up per step (same batch, measured back to back), then the median over steps:
    # robust to a slow spell on a shared machine hitting one method's step.
    base = rows[0]
    for r in rows:
        r["packed_speedup"] = statistics.median(t / b for t, b in zip(r["step_s"], base["step_s"]))
        r["packed_speedup_cpu"] = statistics.median(t / b for t, b in zip(r["step_cpu_s"], base["step_cpu_s"]))

    lens = torch.cat([b.seqlens() for b in batches[1:]]).float()
    title = (f"training tokens/s, {args.seqs} seqs/step, lognormal lengths (median {int(lens.median())}, "
             f"p99 {int(lens.quantile(0.99))}, max {int(lens.max())}), budget {args.budget} real tokens/micro-batch, "
             f"{n_params / 1e6:.1f}M params, {args.threads} thread(s), {steps} step(s)")
    table = Table(title=title)
    for col in ("method", "real tokens/s", "per CPU s", "median step", "micro-batches", "padding",
                "packed speed-up", "(CPU time)"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["method"], f"{r['tokens_per_s']:.0f}", f"{r['tokens_per_cpu_s']:.0f}",
                      f"{r['median_step_s']:.2f} s", f"{r['microbatches_per_step']:.1f}", f"{r['padding_frac']:.1%}",
                      f"{r['packed_speedup']:.2f}x", f"{r['packed_speedup_cpu']:.2f}x")
    table.caption = ("padding: share of computed positions that are padding; speed-up: this row's step time over "
                     "packed's on the same batch (median over steps), from wall time and from CPU time")
    console = Console(width=max(Console().width, 130))
    console.print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "train.json"
    out.write_text(json.dumps({"args": vars(args), "params": n_params, "target_speedup_vs_padded": 1.5,
                               "results": rows}, indent=2))
    console.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
