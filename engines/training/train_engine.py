"""The training engine: a HF CausalLM trained on packed batches, with no padding.

Two forward paths give the same values up to float rounding. For the Qwen2 / Qwen3 / Llama
family (data parallelism off) the lean forward (engines/training/lean_train.py,
`lean_logprobs`) runs each micro-batch as one flat stream of token positions: no padding in
the linear layers, common prefixes of its sequences (a GRPO group's prompt) computed once,
attention per sequence. Everything else (other architectures, the critic, DDP/FSDP, whose
wrappers must see every forward) runs the HF forward over packed rows, as follows.

Sequences of a micro-batch are packed into rows, with `position_ids` restarting at every
sequence and `use_cache=False`; transformers then keeps attention inside each sequence
(tests/test_train_engine.py proves it against running each sequence alone). Short rows are
padded at their *end*, which causal attention never lets real tokens see.

Row layout (`row_forwards`): without a variable-length attention kernel (none on CPU) attention
over a row costs width^2 for every row, whatever it holds, and all rows of one forward are
padded to the widest. So a micro-batch runs as a few forwards: short sequences share rows
of at most `row_tokens` (128) tokens, longer ones get a row each, grouped by similar width,
with their padding filled by short sequences. On a long-tailed batch this trained ~1.8x
faster than one forward of 1024-token rows (benchmarks/bench_train.py measures packed vs
padded).

Only the positions that are trained on reach the LM head's log-softmax in `train_step`
(those where `loss_mask` is set): the loss reads nothing else, and on an RL batch about half
the tokens are prompt.

`train_step` sums the loss callback over the forwards of the planner's micro-batches: the
callback returns each part's share of the batch loss (normalised with batch-level totals), so the
update does not depend on how the batch was split.

Data parallelism (engines/training/data_parallel.py: DDP on CPU, FSDP2 with bf16 on CUDA) keeps that
design unchanged: **every rank is given the whole batch** and builds the same loss callback
from it, so the normalisers (token counts, sequence counts, Dr.GRPO's constant) are global
by construction and no extra collective is needed to compute them. The planner then hands
each rank a token-balanced share (`split_across_ranks` inside `plan_microbatches`) packed
into the same number of micro-batches on every rank; a rank runs only its share, the
reducer sums the shares' gradients, and one step gives the parameters a single process
would get. Copying the batch to every rank costs little: a batch is token ids and a few
floats per token, tiny next to the forward and backward it feeds. Every rank runs the same
number of forwards: where a rank has run out of sequences it runs a one-token forward (and
backward) whose loss is multiplied by 0, because the collectives inside DDP/FSDP must line
up across ranks.

The critic (engines/training/value_model.py `ValueEngine`) is this engine with a value model: it
reuses the planner, `row_layout` and every piece above, and overrides only what one forward
yields (`_train_forward`) and how checkpointed weights are read (`_read_weights`).
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.engines.training import data_parallel as dp
from areal_graph.engines.training.lean_train import LeanTrainForward, stream_layout, unsupported_reason
from areal_graph.engines.training.microbatch_planner import plan_microbatches
from areal_graph.engines.training.step_stats import add_stats

log = logging.getLogger(__name__)

# Attention over a packed row costs (width)^2 on every token of the row (no varlen kernel on
# CPU): short sequences share rows of at most this many tokens. Measured with the HF path at
# 1 thread: 128 was ~10% faster than 256 (and 512 ~25% slower) on the kit's RL batches
# (32 sequences of 30-90 tokens), and ~4% faster on the long-tailed default workload of
# benchmarks/bench_train.py; 64 was no better than 128.
ROW_TOKENS = 128

Unit = tuple[list[int], list[list[int]]]  # one forward: (sequence indices, rows of positions in them)

LossFn = Callable[[torch.Tensor, torch.Tensor, PackedBatch], "tuple[torch.Tensor, dict[str, float]]"]


def row_forwards(seqlens: Sequence[int], row_tokens: int, slack: float = 0.25) -> list[list[list[int]]]:
    """Forward passes for sequences of these lengths: ``forwards[f][row] -> sequence indices``.

    Why several forwards: attention over a packed row costs (row width)^2 whatever its
    sequences, and every row of one forward is padded to the widest. So: sequences longer
    than `row_tokens` get a row each, grouped into forwards of similar width (within a factor
    1 + `slack`, the widest first); the padding those rows leave is filled with short
    sequences (best fit, longest first: padding is computed anyway); the remaining short
    sequences are packed into rows of at most `row_tokens` in one last forward. Sequences of
    length 0 are left out (they have nothing to score). Deterministic.
    """
    order = sorted((i for i in range(len(seqlens)) if seqlens[i] > 0), key=lambda i: (-seqlens[i], i))
    forwards: list[list[list[int]]] = []
    width: list[int] = []
    rooms: list[tuple[int, int, int]] = []  # (free tokens, forward, row), sorted: best fit by bisect
    short = -1  # the forward of packed short rows, opened when first needed
    for i in order:
        n = int(seqlens[i])
        if n > row_tokens:
            if not forwards or n * (1 + slack) < width[-1]:
                forwards.append([])
                width.append(n)
            f = len(forwards) - 1
        else:
            pos = bisect.bisect_left(rooms, (n, -1, -1))
            if pos < len(rooms):
                room, f, r = rooms.pop(pos)
                forwards[f][r].append(i)
                bisect.insort(rooms, (room - n, f, r))
                continue
            if short < 0:
                forwards.append([])
                width.append(row_tokens)
                short = len(forwards) - 1
            f = short
        forwards[f].append([i])
        bisect.insort(rooms, (width[f] - n, f, len(forwards[f]) - 1))
    return forwards


@dataclass
class RowLayout:
    """One forward's packed input, and where its outputs go back in the batch.

    The output at (`pred_row[k]`, `pred_col[k]`) has seen exactly the tokens before packed
    token `dst[k]` of its sequence: it predicts that token (log-probs) or values the state
    it is chosen in (a critic). First tokens of sequences have no such position.
    """

    input_ids: torch.Tensor  # [rows, width]
    position_ids: torch.Tensor  # [rows, width], restarting at 0 for every sequence
    pred_row: torch.Tensor
    pred_col: torch.Tensor
    dst: torch.Tensor


def read_safetensors_dir(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor `save_pretrained` wrote into `path`: one model.safetensors, or the shards
    its model.safetensors.index.json lists (large models are saved in several files)."""
    import json

    from safetensors.torch import load_file

    path = Path(path)
    index = path / "model.safetensors.index.json"
    files = (sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists()
             else ["model.safetensors"])
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(str(path / name)))
    return state


def row_layout(batch: PackedBatch, rows: list[list[int]], device: torch.device) -> RowLayout | None:
    """Pack the sequences of `rows` (sequence indices per row) into one forward's input; None
    when there is nothing to run. Shared by every per-token pass (log-probs, values) so that
    there is one packing path. Built with a handful of tensor ops, not per-sequence ones."""
    rows = [row for row in rows if row]
    if not rows:
        return None
    cu = batch.cu_seqlens.to(torch.int64)
    order = torch.tensor([i for row in rows for i in row], dtype=torch.int64)
    seq_row = torch.tensor([r for r, row in enumerate(rows) for _ in row], dtype=torch.int64)
    lens = (cu[1:] - cu[:-1])[order]
    ends = torch.cumsum(lens, 0)
    row_start = torch.zeros(len(rows), dtype=torch.int64).scatter_reduce_(0, seq_row, ends - lens, "amin",
                                                                           include_self=False)
    load = torch.zeros(len(rows), dtype=torch.int64).index_add_(0, seq_row, lens)
    width = int(load.max())
    n_tok = int(ends[-1])
    offset = torch.arange(n_tok) - torch.repeat_interleave(ends - lens, lens, output_size=n_tok)  # within its sequence
    row = torch.repeat_interleave(seq_row, lens, output_size=n_tok)
    col = torch.repeat_interleave(ends - lens - row_start[seq_row], lens, output_size=n_tok) + offset
    src = torch.repeat_interleave(cu[:-1][order], lens, output_size=n_tok) + offset  # its index in the batch
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    input_ids[row, col] = batch["input_ids"].to("cpu", torch.long)[src]
    # padding at the end of a row: its own "sequence" (positions from 0), never attended to
    position_ids = (torch.arange(width).unsqueeze(0) - load.unsqueeze(1)).clamp_min_(0)
    position_ids[row, col] = offset
    pred = offset > 0  # every token but a sequence's first is predicted by the position before it
    return RowLayout(input_ids.to(device), position_ids.to(device), row[pred].to(device), (col[pred] - 1).to(device),
                     src[pred].to(device))


def score_logits(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool = False, temperature: float = 1.0,
                 rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of `targets` [M] under the distributions `logits` [K, V] (at `temperature`) and
    their entropy, [M] each: prediction m reads row `rows[m]` (None: row m, K == M), so a
    position that predicts several targets (a shared prefix) is normalised once.

    The log-prob is the logit minus the logsumexp, with or without entropy: no [K, V]
    log-softmax is materialised, and a log-prob pass (`compute_logprobs`) computes the very
    same expression as the training forward, so fused proximal log-probs equal separately
    computed ones bit for bit wherever the hidden states do. Entropy: lse - sum(p * logit)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    rows = torch.arange(targets.numel(), device=targets.device) if rows is None else rows
    lse = torch.logsumexp(logits, -1)
    logp = logits[rows, targets] - lse[rows]
    if not with_entropy:
        return logp, None
    entropy = lse - (torch.softmax(logits, -1) * logits).sum(-1)
    return logp, entropy[rows]


def _scored(batch: PackedBatch, layout: RowLayout, score: torch.Tensor | None) -> torch.Tensor | None:
    """Which predictions of `layout` to compute: those of tokens where `score` is set (None: all)."""
    if score is None:
        return None
    return score.to(layout.dst.device)[layout.dst].nonzero().squeeze(1)


def rows_logprobs(model: torch.nn.Module, batch: PackedBatch, rows: list[list[int]], with_entropy: bool = False,
                  temperature: float = 1.0, score: torch.Tensor | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropy) of `batch["input_ids"]` from ONE HF forward over `rows`
    (sequence indices per row, every sequence of the batch at most once), aligned per
    data/packed.py: position t holds log p(token t | tokens < t); the first token of every
    sequence, any sequence not in `rows`, and tokens where `score` (bool per token, None:
    all) is False hold 0. Only scored positions go through the LM head's log-softmax.
    """
    device = next(model.parameters()).device
    out_lp = torch.zeros(batch.num_tokens, device=device, dtype=torch.float32)
    out_ent = torch.zeros(batch.num_tokens, device=device, dtype=torch.float32) if with_entropy else None
    layout = row_layout(batch, rows, device)
    if layout is None:
        return out_lp, out_ent
    logits = model(input_ids=layout.input_ids, position_ids=layout.position_ids, use_cache=False).logits
    pred_row, pred_col, dst = layout.pred_row, layout.pred_col, layout.dst
    pick = _scored(batch, layout, score)
    if pick is not None:
        pred_row, pred_col, dst = pred_row[pick], pred_col[pick], dst[pick]
    targets = layout.input_ids[pred_row, pred_col + 1]  # the token each prediction scores
    lp, ent = score_logits(logits[pred_row, pred_col], targets, with_entropy, temperature)
    out_lp = out_lp.index_put((dst,), lp)
    if with_entropy:
        out_ent = out_ent.index_put((dst,), ent)
    return out_lp, out_ent


def lean_logprobs(lean: LeanTrainForward, batch: PackedBatch, with_entropy: bool = False, temperature: float = 1.0,
                  score: torch.Tensor | None = None, share_prefixes: bool = True,
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`rows_logprobs` of every sequence of `batch` through the lean forward
    (engines/training/lean_train.py): the same values, with no padding in the linear layers,
    common prefixes computed once, and the last layer's MLP and the LM head only where a
    scored token is predicted (each distinct position once)."""
    device = lean.device
    out_lp = torch.zeros(batch.num_tokens, device=device, dtype=torch.float32)
    out_ent = torch.zeros(batch.num_tokens, device=device, dtype=torch.float32) if with_entropy else None
    cu = batch.cu_seqlens.tolist()
    starts = torch.zeros(batch.num_tokens, dtype=torch.bool)
    starts[batch.cu_seqlens[:-1].long()] = True  # sequence starts are predicted by nothing
    wanted = ~starts if score is None else score.to("cpu", torch.bool) & ~starts
    dst = wanted.nonzero().squeeze(1)
    if dst.numel() == 0:
        return out_lp, out_ent
    layout = stream_layout(batch["input_ids"], cu, device, share_prefixes=share_prefixes)
    keep, inverse = torch.unique(layout.token_index[dst.to(device) - 1], return_inverse=True)
    dst = dst.to(device)
    logits = lean.logits(lean.hidden(layout, keep))
    lp, ent = score_logits(logits, batch["input_ids"].to(device)[dst], with_entropy, temperature, rows=inverse)
    out_lp = out_lp.index_put((dst,), lp)
    if with_entropy:
        out_ent = out_ent.index_put((dst,), ent)
    return out_lp, out_ent


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """Multiplier of the base lr at optimizer step `step` (0-based)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(max(step - warmup_steps, 0) / max(total_steps - warmup_steps, 1), 1.0)
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_schedule {schedule!r} (constant, linear, cosine)")


class TrainEngine:
    """A HF CausalLM, its AdamW optimizer and lr schedule, trained on packed batches.

    `parallel` ("auto", "none", "ddp", "fsdp") chooses data parallelism when a
    torch.distributed process group with more than one rank exists ("auto": FSDP2 on CUDA,
    DDP otherwise; see engines/training/data_parallel.py). Under data parallelism every rank must call
    `train_step`, `compute_logprobs` and the weight/checkpoint methods together, with the
    same whole batch. `mixed_precision` (default: bf16 under FSDP on CUDA, else off) is the
    compute dtype FSDP casts parameters to; master weights and gradient reduction stay fp32.

    `lean` (default on) runs forwards of a supported architecture (Qwen2/Qwen3/Llama, see
    engines/training/lean_train.py) without HF's module stack and without padding, each
    micro-batch as one pass, common prefixes of its sequences computed once; other models,
    and data parallelism (whose wrappers must see every forward), use the HF forward over
    packed rows. Both give the same values up to float rounding. `share_prefixes=False` makes
    the lean path compute every sequence's prefix itself (for measurements).
    """

    def __init__(self, model: str | Path | torch.nn.Module, *, lr: float = 2e-5, weight_decay: float = 0.0,
                 grad_clip: float = 1.0, betas: tuple[float, float] = (0.9, 0.999), warmup_steps: int = 0,
                 lr_schedule: str = "constant", total_steps: int = 1, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, row_tokens: int = ROW_TOKENS, trainable: bool = True,
                 parallel: str = "auto", mixed_precision: torch.dtype | None | str = "auto",
                 lean: bool = True, share_prefixes: bool = True) -> None:
        self.parallel = dp.resolve_mode(parallel, torch.device(device))
        self.rank, self.world_size = dp.world() if self.parallel != "none" else (0, 1)
        self.device = dp.local_device(device, self.parallel)
        if isinstance(model, (str, Path)):
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype)
        self.model = model.to(self.device)
        self.row_tokens = row_tokens
        self.grad_clip = grad_clip
        self.base_lr = lr
        self.warmup_steps = warmup_steps
        self.lr_schedule = lr_schedule
        self.total_steps = total_steps
        self.version = 0
        self.optimizer = None
        # dropout stays off: log-probs of the same weights must be reproducible (prox == behav)
        self.model.eval()
        if not trainable:
            self.model.requires_grad_(False)
        # `_forward` is what micro-batches run through (the DDP wrapper, or the model itself)
        self._forward: torch.nn.Module = self.model
        if mixed_precision == "auto":
            mixed_precision = torch.bfloat16 if self.parallel == "fsdp" and self.device.type == "cuda" else None
        if mixed_precision is not None and self.parallel != "fsdp":
            raise ValueError("mixed_precision is supported with parallel='fsdp' only")
        if self.parallel == "fsdp":
            dp.shard_fsdp(self.model, mixed_precision)
        elif self.parallel == "ddp" and trainable:
            self._forward = dp.wrap_ddp(self.model, self.device)
        elif self.parallel == "ddp":  # frozen: no gradients to reduce, but replicas must agree
            dp.broadcast_from_rank0(self.model)
        if trainable:
            self.optimizer = _adamw(self.model, lr, tuple(betas), weight_decay, fused=self.parallel != "fsdp")
        self._lean = self._make_lean() if lean and self.parallel == "none" else None
        self.share_prefixes = share_prefixes
        if self.parallel != "none":
            log.info("rank %d/%d: %s data parallelism on %s%s", self.rank, self.world_size, self.parallel,
                     self.device, f", compute in {mixed_precision}" if mixed_precision else "")

    def _make_lean(self) -> LeanTrainForward | None:
        reason = unsupported_reason(self.model)
        if reason is not None:
            log.debug("lean training forward off: %s", reason)
            return None
        return LeanTrainForward(self.model)

    def _lean_on(self) -> bool:
        """Whether forwards run through the lean path now (the model may have been put in
        training mode since: dropout needs the HF modules)."""
        return self._lean is not None and not self.model.training

    def _units(self, batch: PackedBatch, max_tokens_per_mb: int) -> tuple[list[Unit], int, int]:
        """This rank's forward passes, how many every rank must run, and its micro-batch count.

        A unit is one forward: the sequences it covers (ascending batch indices) and its rows
        (positions in that list). Every rank holds the whole batch and the plan is
        deterministic, so each rank can count the other ranks' forwards itself: FSDP gathers
        parameters in every forward, so all ranks must run the same number (idle ones pad).
        """
        lens = batch.seqlens().tolist()
        plan = plan_microbatches(lens, max_tokens_per_mb, dp_size=self.world_size)
        lean = self._lean_on()
        counts = []
        mine: list[Unit] = []
        for rank, rank_plan in enumerate(plan):
            units: list[Unit] = []
            for idx in rank_plan:
                if lean and idx:  # one pass per micro-batch; "rows": every sequence alone
                    units.append((sorted(idx), [[k] for k in range(len(idx))]))
                    continue
                for rows in row_forwards([lens[i] for i in idx], self.row_tokens):
                    seqs = sorted(idx[j] for row in rows for j in row)
                    local = {s: k for k, s in enumerate(seqs)}
                    units.append((seqs, [[local[idx[j]] for j in row] for row in rows]))
            counts.append(len(units))
            if rank == self.rank:
                mine = units
                n_mb = sum(1 for idx in rank_plan if idx)
        return mine, max(counts), n_mb

    def _idle_pass(self, backward: bool) -> None:
        """A one-token forward (and a zero backward) for a micro-batch this rank has no data
        for: FSDP gathers parameters in every forward and both reducers reduce in the last
        backward, so each rank must make the same calls."""
        ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        logits = self._forward(input_ids=ids, position_ids=torch.zeros_like(ids), use_cache=False).logits
        if backward:
            (logits.float().sum() * 0.0).backward()

    # ------------------------------------------------------------------ inference-side passes
    @torch.no_grad()
    def compute_logprobs(self, batch: PackedBatch, max_tokens_per_mb: int = 8192, temperature: float = 1.0) -> torch.Tensor:
        """Per-token log-probs of the batch. Under data parallelism each rank computes its share
        and a sum over ranks assembles the whole (every token comes from exactly one rank)."""
        if self._lean_on():
            return self._per_token(batch, max_tokens_per_mb,
                                   lambda mb, rows: lean_logprobs(self._lean, mb, temperature=temperature,
                                                                  share_prefixes=self.share_prefixes)[0])
        return self._per_token(batch, max_tokens_per_mb,
                               lambda mb, rows: rows_logprobs(self.model, mb, rows, temperature=temperature)[0])

    def _per_token(self, batch: PackedBatch, max_tokens_per_mb: int,
                   score: Callable[[PackedBatch, list[list[int]]], torch.Tensor]) -> torch.Tensor:
        """A per-token quantity of the whole batch, `score(sub_batch, rows)` run over this rank's
        forwards (the planner's micro-batches and rows) and assembled in batch order."""
        out = torch.zeros(batch.num_tokens, dtype=torch.float32)
        units, n_units, _ = self._units(batch, max_tokens_per_mb)
        for u in range(n_units):
            if u >= len(units):
                if self.parallel == "fsdp":
                    self._idle_pass(backward=False)
                continue
            seqs, rows = units[u]
            out[_token_index(batch, seqs)] = score(batch.select(seqs), rows).float().cpu()
        if self.world_size > 1:
            out = dp.all_reduce_sum_(out.to(self.device)).cpu()
        return out

    def _train_forward(self, mb: PackedBatch, rows: list[list[int]],
                       temperature: float) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What the loss callback receives for one forward: per-token log-probs and entropy of
        the live policy (a critic engine returns its values instead, and no entropy), computed
        only where `loss_mask` is set when the batch has one (0 elsewhere: nothing trains there)."""
        score = mb["loss_mask"] != 0 if "loss_mask" in mb else None
        if self._lean_on():
            return lean_logprobs(self._lean, mb, with_entropy=True, temperature=temperature, score=score,
                                 share_prefixes=self.share_prefixes)
        return rows_logprobs(self._forward, mb, rows, with_entropy=True, temperature=temperature, score=score)

    # ------------------------------------------------------------------ training
    def train_step(self, batch: PackedBatch, loss_fn: LossFn, max_tokens_per_mb: int = 8192,
                   temperature: float = 1.0) -> dict[str, float]:
        """One optimizer step. `temperature` must be the rollout's: the inference engine reports
        log-probs of the temperature-scaled distribution it sampled from (as SGLang does).

        `loss_fn` is called once per forward (a part of a micro-batch made of whole sequences)
        and must return that part's share of the batch loss, so it must be built from the
        whole batch (see the module docstring). Returned stats are summed over those calls
        and, with data parallelism, over ranks; `loss` is the batch loss, `n_microbatches`
        and `n_forwards` count the non-empty micro-batches and forwards of all ranks.
        """
        if self.optimizer is None:
            raise RuntimeError("this engine was built with trainable=False")
        t0 = time.perf_counter()
        lr = self.base_lr * lr_factor(self.version, self.warmup_steps, self.total_steps, self.lr_schedule)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        units, n_units, n_mb = self._units(batch, max_tokens_per_mb)
        totals: dict[str, float] = {}
        loss_sum = 0.0
        for u in range(n_units):
            with dp.grad_sync(self._forward, self.parallel, sync=u == n_units - 1):
                if u >= len(units):
                    self._idle_pass(backward=True)
                    continue
                seqs, rows = units[u]
                mb = batch.select(seqs).to(self.device)
                lp, ent = self._train_forward(mb, rows, temperature)
                loss, stats = loss_fn(lp, ent, mb)
                # reducers average over ranks; scaling makes them sum the ranks' shares. A loss
                # without a graph: the lean path skipped a micro-batch with nothing to score
                # (the HF path, the only one under data parallelism, always keeps the graph).
                if loss.requires_grad:
                    (loss * self.world_size if self.world_size > 1 else loss).backward()
            loss_sum += float(loss.detach())
            add_stats(totals, stats)
        params = [p for p in self.model.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip if self.grad_clip else float("inf"))
        grad_norm = dp.as_local_scalar(grad_norm)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        else:
            log.warning("non-finite grad norm %s at version %d: step skipped", grad_norm, self.version)
        self.version += 1
        if self.world_size > 1:
            totals = dp.sum_dicts(dp.all_gather_json(
                {**totals, "loss": loss_sum, "n_microbatches": n_mb, "n_forwards": len(units)}, self.device))
            loss_sum, n_mb, n_fwd = totals.pop("loss"), totals.pop("n_microbatches"), totals.pop("n_forwards")
        else:
            n_fwd = len(units)
        elapsed = time.perf_counter() - t0
        totals.update({"loss": loss_sum, "grad_norm": float(grad_norm), "lr": lr, "tokens": float(batch.num_tokens),
                       "tokens_per_s": batch.num_tokens / max(elapsed, 1e-9), "n_microbatches": float(n_mb),
                       "n_forwards": float(n_fwd), "time_s": elapsed})
        return totals

    # ------------------------------------------------------------------ weights and checkpoints
    def state_dict_for_sync(self, copy: bool = True) -> dict[str, torch.Tensor]:
        """The full weights (a CPU copy, or with `copy=False` the live tensors, for a caller that
        copies them out at once). Under FSDP a collective that leaves them on rank 0 only (the
        rank that pushes weights to inference); other ranks get {}."""
        if self.parallel == "fsdp":
            return dp.fsdp_full_model_state(self.model)
        if not copy:
            return {k: v.detach() for k, v in self.model.state_dict().items()}
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def export_hf(self, path: str | Path) -> Path:
        """save_pretrained (safetensors) into `path` atomically: readers never see a half-written dir.

        Under data parallelism rank 0 writes and every rank returns once the directory exists."""
        path = Path(path)
        state = dp.fsdp_full_model_state(self.model) if self.parallel == "fsdp" else None
        if self.rank == 0:
            tmp = path.with_name(path.name + f".tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            self.model.save_pretrained(tmp, safe_serialization=True, state_dict=state)
            if path.exists():
                shutil.rmtree(path)
            tmp.rename(path)
        self._barrier()
        return path

    def save_checkpoint(self, path: str | Path) -> Path:
        """Weights (HF safetensors) and optimizer state; under data parallelism rank 0 writes.

        The optimizer state keeps torch's own form (parameters numbered) whatever the mode, so
        a checkpoint resumes with or without DDP/FSDP and with another world size."""
        path = Path(path)
        if self.rank == 0:
            path.mkdir(parents=True, exist_ok=True)
        self._barrier()
        self.export_hf(path / "model")
        state: dict = {"version": self.version}
        if self.optimizer is not None:
            if self.parallel == "fsdp":
                full = dp.fsdp_full_optim_state(self.model, self.optimizer)
                if self.rank == 0:
                    state["optimizer"] = dp.optim_state_names_to_ids(full, self._param_names())
            else:
                state["optimizer"] = self.optimizer.state_dict()
        if self.rank == 0:
            torch.save(state, path / "trainer_state.pt")
        self._barrier()
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        """Every rank reads the checkpoint (it must be on a filesystem they all see)."""
        path = Path(path)
        weights = self._read_weights(path / "model")
        if self.parallel == "fsdp":
            unknown = set(weights) - set(self.model.state_dict())
            if unknown:
                raise ValueError(f"checkpoint {path} does not match the model: unexpected {sorted(unknown)}")
            dp.fsdp_load_model_state(self.model, weights)
        else:
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
            if unexpected or any(not k.endswith("lm_head.weight") for k in missing):
                raise ValueError(f"checkpoint {path} does not match the model: missing {missing}, unexpected {unexpected}")
            self.model.tie_weights()
        state = torch.load(path / "trainer_state.pt", weights_only=True)
        self.version = int(state["version"])
        if self.optimizer is not None and "optimizer" in state:
            if self.parallel == "fsdp":
                named = dp.optim_state_ids_to_names(state["optimizer"], self._param_names())
                dp.fsdp_load_optim_state(self.model, self.optimizer, named)
            else:
                self.optimizer.load_state_dict(state["optimizer"])

    def _read_weights(self, model_dir: Path) -> dict[str, torch.Tensor]:
        """The full state dict `export_hf` wrote into `model_dir` (keys as in `self.model`)."""
        return read_safetensors_dir(model_dir)

    def _param_names(self) -> list[str]:
        """Parameter names in `model.parameters()` order (the optimizer's numbering)."""
        return [name for name, _ in self.model.named_parameters()]

    def _barrier(self) -> None:
        if self.world_size > 1:
            torch.distributed.barrier()


def _token_index(batch: PackedBatch, idx: list[int]) -> torch.Tensor:
    """Batch positions of the tokens of sequences `idx`, in that order."""
    cu = batch.cu_seqlens.to(torch.int64)
    seqs = torch.tensor(idx, dtype=torch.int64)
    lens = cu[seqs + 1] - cu[seqs]
    n = int(lens.sum())
    ends = torch.cumsum(lens, 0)
    return torch.arange(n) + torch.repeat_interleave(cu[seqs] - (ends - lens), lens, output_size=n)


def _adamw(model: torch.nn.Module, lr: float, betas: tuple[float, float], weight_decay: float,
           fused: bool) -> torch.optim.Optimizer:
    """AdamW, fused where torch has the kernel (CPU and CUDA): one pass over all parameters
    instead of a dozen small ops per tensor (~4x faster on the 1.7M-parameter kit model, same
    values to ~3e-8). FSDP's sharded parameters keep the default implementation."""
    params = list(model.parameters())
    if fused:
        try:
            return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=True)
        except (RuntimeError, ValueError) as err:  # a device or dtype without the fused kernel
            log.debug("fused AdamW unavailable (%s): default implementation", err)
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)
