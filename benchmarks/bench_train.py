"""Training throughput: packed micro-batches (the engine's way) vs padded ones.

Workload: RL-like batches whose sequence lengths are lognormal (long-tailed; prompt 16-64
tokens plus a response), the same random Qwen2 (hidden 256, 4 layers, vocab 1024, ~3.2M
parameters), fp32, the same thread count, one full optimizer step (forward, backward,
grad clipping, AdamW) per batch. Both sides give each micro-batch the same budget of *real*
tokens, and tokens/s counts real tokens only.

- packed (engine): `TrainEngine.train_step`: the planner packs sequences into micro-batches
  of at most `--budget` tokens; each micro-batch runs as one pass of the lean forward
  (engines/training/lean_train.py: a flat token stream, no padding outside attention);
- packed (HF rows): the same engine with `lean=False`: each micro-batch runs as a few HF
  forwards (`row_forwards`): short sequences share rows of <= 128 tokens (position_ids reset
  per sequence), long ones get a row each, grouped by width, their padding filled with short
  sequences;
- padded: sequences in arrival order fill a micro-batch up to `--budget` real tokens; one
  sequence per row, right-padded to the longest in the micro-batch, with an attention mask
  (what a trainer without packing does);
- padded, sorted: the same after sorting the batch by length (length bucketing, the usual
  mitigation), for reference.

Steps of the methods are interleaved (packed, HF rows, padded, sorted, packed, ...) so that
drift on a shared machine hits them alike; the speed-up is the median over steps of the
step-time ratio on the same batch.

    python benchmarks/bench_train.py            # 64 sequences a step, 3 measured steps per method
    python benchmarks/bench_train.py --quick    # 32 sequences, 1 measured step

On a shared 2-core machine a full run takes minutes (the padded baseline is the slow part).

`--rl-step`: one RL training step on a real batch against TRL's GRPOTrainer step
---------------------------------------------------------------------------------
The batch: the builtin kit (`builtin:tiny-arith`, a 0.83M-parameter Qwen2, fp32), 4 training
prompts x 8 answers sampled once with HF `generate` (temperature 1, top-p 1, no top-k, at
most 64 new tokens, seeded), each answer cut after its first EOS; rewards from
`math_reward`, group-normalised advantages, behaviour log-probs from the initial weights.
`--batches` such batches (prompts 4b..4b+3) are built and the rounds cycle through them.

Methods (each has its own copy of the model and its own optimizer; lr 2e-5, grad clip 1.0):
- `TRL 1.16 (fused head)`: what `GRPOTrainer._compute_loss` runs for loss_type="dapo",
  beta=0, num_iterations=1 on CPU: left-padded prompts + right-padded completions (to the
  longest in the batch), one HF forward of the [32, P+C] batch with the attention mask,
  TRL's own fused LM head (`trl.trainer.utils.add_fused_lm_head`, log-probs and entropy of
  every position; without Triton it scores all positions), old log-probs = the detached
  current ones, the clipped surrogate averaged over all completion tokens, backward, grad
  clipping, `torch.optim.AdamW` (TRL's `optim="adamw_torch"`), zero_grad, and the step's
  metrics (entropy, clip ratios) read out as TRL logs them.
- `TRL-style (selective_log_softmax)`: the same, but the forward returns the logits of the
  last C+1 positions and `trl.trainer.utils.selective_log_softmax` / `entropy_from_logits`
  score them (TRL's path before the fused head).
- `ours`: `TrainEngine.train_step` with `build_loss_fn(TrainParams(loss="decoupled_ppo",
  behav_imp_cap=5.0), batch, fused_prox=True)` and max_tokens_per_mb=2048, as the train node
  calls it (the loss callback is built inside the timed step).
- with `--ablate`: `ours, no prefix sharing` (`share_prefixes=False`) and `ours, HF rows`
  (`lean=False`: the HF forward over packed rows, as before the lean forward).

Every round runs every method once per thread count on the same batch, in an order rotated
per round; the ratio is taken per round (method / TRL 1.16 on the same batch, same thread
count), and the table shows medians over rounds, of wall time and of CPU time
(`time.process_time`, this process only). Before timing, one step of TRL-style and of ours
from the same weights are compared (loss and update), to show that they compute the same
thing.

    python benchmarks/bench_train.py --rl-step                 # 20 rounds at 1 and 2 threads
    python benchmarks/bench_train.py --rl-step --ablate --rounds 30
    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_train.py --rl-step --ablate

On a shared 2-core machine another tenant busy on one core makes every 2-thread step wait at
OpenMP barriers for a descheduled thread (active spin-waiting: steps seen 20-50x slower,
for every method); OMP_WAIT_POLICY=PASSIVE avoids that. The JSON records the load average
and the policy.

It prints a table and writes benchmarks/results/train_rl_step.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from bench_generation import build_model  # the same random Qwen2 (vocab VOCAB) as the generation benchmark
from bench_planner import engine_positions
from rich.console import Console
from rich.table import Table

from areal_graph.data.packed import PackedBatch
from areal_graph.engines.training.microbatch_planner import plan_microbatches
from areal_graph.engines.training.train_engine import TrainEngine

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


def packed_positions(engine: TrainEngine, batch: PackedBatch, budget: int) -> int:
    """Positions the engine's linear layers compute for this batch (its planner's plan): the
    lean path's stream positions, or the HF path's rows with their padding."""
    from areal_graph.engines.training.lean_train import stream_layout

    lens = batch.seqlens().numpy()
    plan = plan_microbatches(lens.tolist(), budget)[0]
    if not engine._lean_on():
        return engine_positions(plan, lens, engine.row_tokens)
    return sum(
        stream_layout(mb["input_ids"], mb.cu_seqlens.tolist(), torch.device("cpu")).input_ids.numel()
        for mb in (batch.select(idx) for idx in plan if idx)
    )


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


# ----------------------------------------------------------------------------- --rl-step
PROMPTS_PER_STEP, ANSWERS, MAX_NEW = 4, 8, 64
LR, GRAD_CLIP, CLIP_EPS = 2e-5, 1.0, 0.2
TRL_FUSED, TRL_SELECTIVE, OURS = "TRL 1.16 (fused head)", "TRL-style (selective_log_softmax)", "ours"
OURS_NO_SHARING, OURS_HF = "ours, no prefix sharing", "ours, HF rows"


@dataclass
class RLBatch:
    """One step's batch in both layouts: packed (ours) and TRL's padded prompt + completion."""

    packed: PackedBatch  # input_ids, loss_mask, advantages, behav_logprobs
    prompt_ids: torch.Tensor  # [B, P] left-padded
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor  # [B, C] right-padded, up to and including EOS
    completion_mask: torch.Tensor
    advantages: torch.Tensor  # [B]


def load_kit() -> tuple[Any, Any, list[Any]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_graph.data.datasets import load_prompts
    from areal_graph.modelkit.builtin import resolve_dataset_path, resolve_model_path

    path = resolve_model_path("builtin:tiny-arith")
    tok = AutoTokenizer.from_pretrained(path)
    prompts, _ = load_prompts(resolve_dataset_path("builtin:arith/train"), tok)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), tok, prompts


def _left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    return ids, mask


def _right_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


def sample_rl_batch(model: Any, tok: Any, prompts: list[Any], seed: int) -> RLBatch:
    """4 prompts x 8 answers sampled with HF `generate` as TRL does, scored and packed."""
    from areal_graph.nodes.advantages import grpo_advantages
    from areal_graph.nodes.math_reward import math_reward

    reqs = [p for p in prompts for _ in range(ANSWERS)]
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    prompt_ids, prompt_mask = _left_pad([p.input_ids for p in reqs], pad)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=MAX_NEW,
            pad_token_id=pad,
        )
    eos = model.config.eos_token_id
    answers = []
    for row in out[:, prompt_ids.shape[1] :].tolist():
        cut = row.index(eos) + 1 if eos in row else len(row)
        answers.append(row[:cut])
    rewards = torch.tensor(
        [math_reward(tok.decode(a, skip_special_tokens=True), p.answer) for a, p in zip(answers, reqs)]
    )
    adv = grpo_advantages(rewards, torch.arange(len(reqs)) // ANSWERS).float()
    packed = PackedBatch.from_sequences(
        {
            "input_ids": [p.input_ids + a for p, a in zip(reqs, answers)],
            "loss_mask": [[0] * len(p.input_ids) + [1] * len(a) for p, a in zip(reqs, answers)],
            "advantages": [
                [0.0] * len(p.input_ids) + [float(adv[i])] * len(a) for i, (p, a) in enumerate(zip(reqs, answers))
            ],
        }
    )
    packed.tokens["behav_logprobs"] = TrainEngine(copy.deepcopy(model), trainable=False).compute_logprobs(packed)
    completion_ids, completion_mask = _right_pad(answers, pad)
    return RLBatch(packed, prompt_ids, prompt_mask, completion_ids, completion_mask, adv)


class TRLStep:
    """TRL GRPOTrainer's training step (loss_type="dapo", beta=0, num_iterations=1), written
    out with TRL's own helpers; see the module docstring for what each variant runs."""

    def __init__(self, model: torch.nn.Module, fused_head: bool) -> None:
        from trl.trainer.utils import add_fused_lm_head

        self.model = model
        self.fused_head = fused_head
        if fused_head:
            add_fused_lm_head(model, temperature=1.0, outputs=("log_probs", "entropy"))
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=LR)  # optim="adamw_torch"

    def logps_entropy(self, b: RLBatch) -> tuple[torch.Tensor, torch.Tensor]:
        from trl.trainer.utils import entropy_from_logits, selective_log_softmax

        input_ids = torch.cat([b.prompt_ids, b.completion_ids], 1)
        attention_mask = torch.cat([b.prompt_mask, b.completion_mask], 1)
        keep = b.completion_ids.shape[1]
        if self.fused_head:  # GRPOTrainer._get_per_token_logps_and_entropies
            labels = input_ids.masked_fill(attention_mask == 0, -100)
            labels[:, :-keep] = -100
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
            return out.log_probs[:, -keep:], out.entropy[:, -keep:]
        logits = self.model(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=keep + 1
        ).logits[:, :-1]
        return selective_log_softmax(logits, b.completion_ids), entropy_from_logits(logits)

    def loss(self, b: RLBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The dapo loss, the ratio (for the clip metrics) and the entropies."""
        logps, entropies = self.logps_entropy(b)
        mask = b.completion_mask.float()
        adv = b.advantages.unsqueeze(1)
        coef_1 = torch.exp(logps - logps.detach())
        coef_2 = torch.clamp(coef_1, 1 - CLIP_EPS, 1 + CLIP_EPS)
        per_token_loss = -torch.min(coef_1 * adv, coef_2 * adv)
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0), coef_1, entropies

    def __call__(self, b: RLBatch) -> dict[str, float]:
        loss, coef_1, entropies = self.loss(b)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():  # the metrics TRL reads out every step
            mask = b.completion_mask.float()
            adv = b.advantages.unsqueeze(1)
            n = mask.sum().clamp(min=1.0)
            low = ((coef_1 < 1 - CLIP_EPS) & (adv < 0)).float()
            high = ((coef_1 > 1 + CLIP_EPS) & (adv > 0)).float()
            stats = {
                "loss": loss.item(),
                "grad_norm": grad_norm.item(),
                "entropy": ((entropies * mask).sum() / n).item(),
                "clip_low": ((low * mask).sum() / n).item(),
                "clip_high": ((high * mask).sum() / n).item(),
            }
        return stats


def ours_step(engine: TrainEngine) -> Callable[[RLBatch], dict[str, float]]:
    from areal_graph.graph.kinds.losses import TrainParams
    from areal_graph.nodes.train_loss import build_loss_fn

    params = TrainParams(loss="decoupled_ppo", behav_imp_cap=5.0)

    def step(b: RLBatch) -> dict[str, float]:
        return engine.train_step(b.packed, build_loss_fn(params, b.packed, fused_prox=True), max_tokens_per_mb=2048)

    return step


def rl_methods(model: torch.nn.Module, ablate: bool) -> dict[str, Callable[[RLBatch], dict[str, float]]]:
    methods = {
        TRL_FUSED: TRLStep(copy.deepcopy(model), fused_head=True),
        TRL_SELECTIVE: TRLStep(copy.deepcopy(model), fused_head=False),
        OURS: ours_step(TrainEngine(copy.deepcopy(model), lr=LR, grad_clip=GRAD_CLIP)),
    }
    if ablate:
        methods[OURS_NO_SHARING] = ours_step(
            TrainEngine(copy.deepcopy(model), lr=LR, grad_clip=GRAD_CLIP, share_prefixes=False)
        )
        methods[OURS_HF] = ours_step(TrainEngine(copy.deepcopy(model), lr=LR, grad_clip=GRAD_CLIP, lean=False))
    return methods


def same_update_check(model: torch.nn.Module, b: RLBatch) -> dict[str, Any]:
    """The loss and gradient of TRL-style and of ours from the same weights (ours with lr 0 and
    no clipping, so its gradient stays readable). They agree when both see the same token
    positions: HF numbers positions from the left edge, so left-padded prompts shift TRL's
    positions, and the two agree exactly only when the prompts are equally long."""
    trl = TRLStep(copy.deepcopy(model), fused_head=False)
    loss_trl = trl.loss(b)[0]
    loss_trl.backward()
    engine = TrainEngine(copy.deepcopy(model), lr=0.0, grad_clip=0.0)
    stats = ours_step(engine)(b)
    g_trl = torch.cat([p.grad.flatten() for p in trl.model.parameters()]).double()
    g_ours = torch.cat([p.grad.flatten() for p in engine.model.parameters()]).double()
    return {
        "loss_trl": loss_trl.item(),
        "loss_ours": stats["loss"],
        "grad_rel_diff": float((g_trl - g_ours).norm() / g_trl.norm()),
        "equal_prompt_lengths": bool(b.prompt_mask.all()),
    }


def _time_round(methods: dict, b: RLBatch, r: int, record: dict | None) -> None:
    names = list(methods)
    for name in names[r % len(names) :] + names[: r % len(names)]:  # order rotated per round
        t0, c0 = time.perf_counter(), time.process_time()
        methods[name](b)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if record is not None:
            record[name]["step_s"].append(dt)
            record[name]["cpu_s"].append(dc)


def _batch_shape(b: RLBatch) -> dict[str, Any]:
    from areal_graph.engines.training.lean_train import stream_layout

    resp = b.completion_mask.sum(1)
    layout = stream_layout(b.packed["input_ids"], b.packed.cu_seqlens.tolist(), torch.device("cpu"))
    return {
        "tokens": b.packed.num_tokens,
        "prompt_len_max": int(b.prompt_ids.shape[1]),
        "response_min": int(resp.min()),
        "response_mean": float(resp.float().mean()),
        "response_max": int(resp.max()),
        "trl_positions": int(b.prompt_ids.numel() + b.completion_ids.numel()),
        "ours_stream_positions": int(layout.input_ids.numel()),
    }


def rl_summary(record: dict, threads: list[int]) -> list[dict[str, Any]]:
    rows = []
    for n in threads:
        base = record[n][TRL_FUSED]
        for name, rec in record[n].items():
            rows.append(
                {
                    "threads": n,
                    "method": name,
                    "median_step_s": statistics.median(rec["step_s"]),
                    "median_cpu_s": statistics.median(rec["cpu_s"]),
                    "ratio_vs_trl": statistics.median(t / b for t, b in zip(rec["step_s"], base["step_s"])),
                    "ratio_vs_trl_cpu": statistics.median(t / b for t, b in zip(rec["cpu_s"], base["cpu_s"])),
                    "ratio_vs_trl_selective": statistics.median(
                        t / b for t, b in zip(rec["step_s"], record[n][TRL_SELECTIVE]["step_s"])
                    ),
                    "step_s": rec["step_s"],
                    "cpu_s": rec["cpu_s"],
                }
            )
    return rows


def print_rl_table(rows: list[dict], shapes: list[dict], check: dict, args: argparse.Namespace) -> None:
    tok = statistics.mean(s["tokens"] for s in shapes)
    title = (
        f"one RL training step, builtin kit (a tiny Qwen2, fp32), {PROMPTS_PER_STEP}x{ANSWERS} sequences, "
        f"{args.rounds} rounds over {len(shapes)} batch(es): {tok:.0f} tokens/batch on average, responses "
        f"{min(s['response_min'] for s in shapes)}-{max(s['response_max'] for s in shapes)} "
        f"(mean {statistics.mean(s['response_mean'] for s in shapes):.1f})"
    )
    table = Table(title=title)
    for col in ("threads", "method", "median step", "median CPU", "vs TRL 1.16", "(CPU time)", "vs TRL-style"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["threads"]),
            r["method"],
            f"{r['median_step_s'] * 1e3:.1f} ms",
            f"{r['median_cpu_s'] * 1e3:.1f} ms",
            f"{r['ratio_vs_trl']:.2f}x",
            f"{r['ratio_vs_trl_cpu']:.2f}x",
            f"{r['ratio_vs_trl_selective']:.2f}x",
        )
    table.caption = (
        f"vs: this method's step time over the TRL step's in the same round (median over rounds; < 1 is "
        f"faster). Positions computed per batch: TRL {statistics.mean(s['trl_positions'] for s in shapes):.0f} "
        f"(padded), ours {statistics.mean(s['ours_stream_positions'] for s in shapes):.0f} (prefixes "
        f"shared; {tok:.0f} without). Same-weights check: loss TRL {check['loss_trl']:.6f} / ours "
        f"{check['loss_ours']:.6f}, gradient rel. diff {check['grad_rel_diff']:.1e}"
    )
    Console(width=max(Console().width, 140)).print(table)


def main_rl_step(args: argparse.Namespace) -> int:
    threads = [int(t) for t in args.thread_counts.split(",")]
    model, tok, prompts = load_kit()
    batches = [
        sample_rl_batch(model, tok, prompts[PROMPTS_PER_STEP * i : PROMPTS_PER_STEP * (i + 1)], seed=args.seed + i)
        for i in range(args.batches)
    ]
    shapes = [_batch_shape(b) for b in batches]
    check = same_update_check(model, batches[0])
    methods = rl_methods(model, args.ablate)
    record = {n: {m: {"step_s": [], "cpu_s": []} for m in methods} for n in threads}
    load_before = os.getloadavg()
    for r in range(args.warmup + args.rounds):
        for n in threads:
            torch.set_num_threads(n)
            _time_round(methods, batches[r % len(batches)], r, record[n] if r >= args.warmup else None)
    rows = rl_summary(record, threads)
    machine = {
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
    }
    print_rl_table(rows, shapes, check, args)
    Console().print(f"machine: {machine}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "train_rl_step.json"
    import transformers
    import trl

    out.write_text(
        json.dumps(
            {
                "args": vars(args),
                "versions": {
                    "torch": torch.__version__,
                    "trl": trl.__version__,
                    "transformers": transformers.__version__,
                },
                "machine": machine,
                "batches": shapes,
                "same_update_check": check,
                "results": rows,
            },
            indent=2,
        )
    )
    Console().print(f"wrote {out}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="32 sequences, 1 measured step per method")
    ap.add_argument("--seqs", type=int, default=None, help="sequences per batch (one optimizer step; default 64)")
    ap.add_argument("--budget", type=int, default=4096, help="real tokens per micro-batch")
    ap.add_argument("--median", type=int, default=96, help="median response length")
    ap.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of response lengths")
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (same for all methods). Default 1: with 2 threads on a shared 2-core "
        "machine, OpenMP barriers wait on descheduled threads and steps swing 2x",
    )
    ap.add_argument("--steps", type=int, default=None, help="measured steps per method (default 3, quick 1)")
    ap.add_argument("--rl-step", action="store_true", help="one RL step on a real kit batch vs TRL's (see above)")
    ap.add_argument("--rounds", type=int, default=20, help="--rl-step: timed rounds")
    ap.add_argument("--warmup", type=int, default=2, help="--rl-step: untimed rounds first")
    ap.add_argument("--batches", type=int, default=4, help="--rl-step: distinct batches the rounds cycle through")
    ap.add_argument("--seed", type=int, default=0, help="--rl-step: sampling seed of the first batch")
    ap.add_argument("--thread-counts", default="1,2", help="--rl-step: torch thread counts")
    ap.add_argument("--ablate", action="store_true", help="--rl-step: also ours without prefix sharing, with HF rows")
    args = ap.parse_args()
    return main_rl_step(args) if args.rl_step else main_packed(args)


def main_packed(args: argparse.Namespace) -> int:
    """The packed-vs-padded benchmark (the module docstring's first part)."""
    torch.set_num_threads(args.threads)
    steps = args.steps or (1 if args.quick else 3)
    args.seqs = args.seqs or (32 if args.quick else 64)
    warmup = make_batch(16, 1000, args.median, args.sigma, args.max_len)  # allocator, kernels
    batches = [warmup] + [make_batch(args.seqs, seed, args.median, args.sigma, args.max_len) for seed in range(steps)]

    packed = TrainEngine(build_model(), lr=1e-4, grad_clip=1.0)
    rows_engine = TrainEngine(build_model(), lr=1e-4, grad_clip=1.0, lean=False)
    engines = {"packed (engine)": packed, "packed (HF rows)": rows_engine}
    padded = PaddedTrainer(build_model(), lr=1e-4, grad_clip=1.0)
    n_params = sum(p.numel() for p in packed.model.parameters())
    methods = {
        "packed (engine)": lambda b: packed.train_step(b, mean_nll(b), max_tokens_per_mb=args.budget),
        "packed (HF rows)": lambda b: rows_engine.train_step(b, mean_nll(b), max_tokens_per_mb=args.budget),
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
                computed = (
                    packed_positions(engines[name], batch, args.budget)
                    if name in engines
                    else out.get("computed_tokens", batch.num_tokens)
                )
                info[name]["computed_tokens"].append(int(computed))
                info[name]["real_tokens"].append(batch.num_tokens)

    rows = []
    for name in methods:
        real = sum(info[name]["real_tokens"])
        computed = sum(info[name]["computed_tokens"])
        med = statistics.median(times[name])
        rows.append(
            {
                "method": name,
                "tokens_per_s": real / sum(times[name]),
                "median_step_s": med,
                "step_s": times[name],
                "tokens_per_cpu_s": real / sum(cpu[name]),
                "step_cpu_s": cpu[name],
                "microbatches_per_step": statistics.mean(info[name]["n_microbatches"]),
                "padding_frac": 1 - real / computed,
                "real_tokens_per_step": real / len(times[name]),
            }
        )
    # Speed-up per step (same batch, measured back to back), then the median over steps:
    # robust to a slow spell on a shared machine hitting one method's step.
    base = rows[0]
    for r in rows:
        r["packed_speedup"] = statistics.median(t / b for t, b in zip(r["step_s"], base["step_s"]))
        r["packed_speedup_cpu"] = statistics.median(t / b for t, b in zip(r["step_cpu_s"], base["step_cpu_s"]))

    lens = torch.cat([b.seqlens() for b in batches[1:]]).float()
    title = (
        f"training tokens/s, {args.seqs} seqs/step, lognormal lengths (median {int(lens.median())}, "
        f"p99 {int(lens.quantile(0.99))}, max {int(lens.max())}), budget {args.budget} real tokens/micro-batch, "
        f"{n_params / 1e6:.1f}M params, {args.threads} thread(s), {steps} step(s)"
    )
    table = Table(title=title)
    for col in (
        "method",
        "real tokens/s",
        "per CPU s",
        "median step",
        "micro-batches",
        "padding",
        "packed speed-up",
        "(CPU time)",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["method"],
            f"{r['tokens_per_s']:.0f}",
            f"{r['tokens_per_cpu_s']:.0f}",
            f"{r['median_step_s']:.2f} s",
            f"{r['microbatches_per_step']:.1f}",
            f"{r['padding_frac']:.1%}",
            f"{r['packed_speedup']:.2f}x",
            f"{r['packed_speedup_cpu']:.2f}x",
        )
    table.caption = (
        "padding: share of computed positions that are padding; speed-up: this row's step time over "
        "packed's on the same batch (median over steps), from wall time and from CPU time"
    )
    console = Console(width=max(Console().width, 130))
    console.print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "train.json"
    out.write_text(
        json.dumps({"args": vars(args), "params": n_params, "target_speedup_vs_padded": 1.5, "results": rows}, indent=2)
    )
    console.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
