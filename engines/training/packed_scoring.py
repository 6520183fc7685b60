"""Scoring packed sequences: per-token log-probs (and entropy) of a packed batch, without padding.

Two paths give the same values up to float rounding: the lean forward's flat stream
(`lean_logprobs`, engines/training/lean_train.py) and the HF forward over packed rows
(`rows_logprobs`), whose layout is planned here.

Row layout (`row_forwards`): without a variable-length attention kernel (none on CPU) attention
over a row costs width^2 for every row, whatever it holds, and all rows of one forward are
padded to the widest. So a micro-batch runs as a few forwards: short sequences share rows
of at most `row_tokens` (128) tokens, longer ones get a row each, grouped by similar width,
with their padding filled by short sequences. On a long-tailed batch this trained ~1.8x
faster than one forward of 1024-token rows (benchmarks/bench_train.py measures packed vs
padded).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from areal_graph.data.packed import PackedBatch
from areal_graph.engines.training.lean_train import LeanTrainForward, stream_layout

# Attention over a packed row costs (width)^2 on every token of the row (no varlen kernel on
# CPU): short sequences share rows of at most this many tokens. Measured with the HF path at
# 1 thread: 128 was ~10% faster than 256 (and 512 ~25% slower) on the kit's RL batches
# (32 sequences of 30-90 tokens), and ~4% faster on the long-tailed default workload of
# benchmarks/bench_train.py; 64 was no better than 128.
ROW_TOKENS = 128


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


def row_layout(batch: PackedBatch, rows: list[list[int]], device: torch.device) -> RowLayout | None:
    """Pack the sequences of `rows` (sequence indices per row) into one forward's input; None
    when there is nothing to run. Shared by every per-token pass (log-probs, values) so that
    there is one packing path. Built with a handful of tensor ops, not per-sequence ones."""
    rows = [row for row in rows if row]
    if not rows:
        return None
    cu = batch.cu_seqlens.to("cpu", torch.int64)  # the layout is built on the host, then moved (a CUDA batch too)
    order = torch.tensor([i for row in rows for i in row], dtype=torch.int64)
    seq_row = torch.tensor([r for r, row in enumerate(rows) for _ in row], dtype=torch.int64)
    lens = (cu[1:] - cu[:-1])[order]
    ends = torch.cumsum(lens, 0)
    row_start = torch.zeros(len(rows), dtype=torch.int64).scatter_reduce_(
        0, seq_row, ends - lens, "amin", include_self=False
    )
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
    return RowLayout(
        input_ids.to(device),
        position_ids.to(device),
        row[pred].to(device),
        (col[pred] - 1).to(device),
        src[pred].to(device),
    )


def score_logits(
    logits: torch.Tensor,
    targets: torch.Tensor,
    with_entropy: bool = False,
    temperature: float = 1.0,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
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


def rows_logprobs(
    model: torch.nn.Module,
    batch: PackedBatch,
    rows: list[list[int]],
    with_entropy: bool = False,
    temperature: float = 1.0,
    score: torch.Tensor | None = None,
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
    if out_ent is not None:
        out_ent = out_ent.index_put((dst,), ent)
    return out_lp, out_ent


def lean_logprobs(
    lean: LeanTrainForward,
    batch: PackedBatch,
    with_entropy: bool = False,
    temperature: float = 1.0,
    score: torch.Tensor | None = None,
    share_prefixes: bool = True,
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
    if out_ent is not None:
        out_ent = out_ent.index_put((dst,), ent)
    return out_lp, out_ent
