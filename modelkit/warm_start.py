"""Warm start: a short supervised fine-tune on (chat prompt, solution) pairs.

What the warm start must leave: a policy that is right *sometimes* (so group sampling finds
rewarded answers) and wrong often (so there is something to learn), and the same policy
whatever machine built it. The builtin kit gets there with a flawed teacher
(`data.arith.teacher_mixture`: most answers hasty, the rest worked out) rather than by
stopping a clean SFT early: an early-stopped model sits on a steep, noisy part of its learning
curve (dev accuracy swung 11-30% between checks 10 steps apart), and what is left to learn is
arithmetic that RL, with one bit of reward per answer, learns far more slowly than SFT does.
For the same reason the arithmetic is taught to convergence first, in a lesson of its own,
and the habit after it (modelkit/kit_tasks.py: `Lesson`).

Loss is on response tokens only (solution + eos), exactly the tokens RL later trains on.
Batches run through the RL trainer's lean stream forward (no padding, shared prefixes once,
the LM head only where a label is read) for the Qwen2/Llama family, about twice as fast as
the HF forward over padded rows; other models take the HF forward, right-padded or, for
long-tailed data, packed (`SFTConfig.packed`). Same loss up to float rounding either way.
Deterministic for a seed, whatever the thread count: data order and init derive from it, the
model has no dropout, and torch's deterministic kernels are on for the SFT.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from areal_graph.data.datasets import format_prompt

log = logging.getLogger(__name__)

IGNORE = -100


@dataclass(frozen=True)
class SFTConfig:
    steps: int = 260
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 20
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    decay: bool = True  # cosine decay to 10% over `steps`; False keeps the peak lr after warmup
    # False: a batch is right-padded to its longest row. True: the batch's sequences are packed
    # end to end into rows as long as its longest sequence (position ids restart per sequence,
    # so attention stays within each). Same batches, same loss; no padding compute. (Batches
    # of similar lengths, i.e. length bucketing, were tried first: homogeneous batches broke
    # the warm start, the model stopped copying operands from the question.)
    packed: bool = False
    # "auto": the lean stream forward where the model is of its family (`_batch_loss_fn`),
    # else the HF forward; "hf": always the HF forward (same loss up to float rounding).
    forward: str = "auto"

    def __post_init__(self) -> None:
        if self.forward not in ("auto", "hf"):
            raise ValueError(f"SFTConfig.forward must be 'auto' or 'hf', not {self.forward!r}")


Example = tuple[list[int], list[int]]  # (input_ids, labels)


def encode_pair(tokenizer, question: str, solution: str) -> tuple[list[int], list[int]]:
    """(input_ids, labels): chat prompt then solution + eos; labels are IGNORE on the prompt.

    The prompt is built by the same function that builds RL and eval prompts, so SFT teaches
    exactly the format the policy is later sampled in."""
    prompt = tokenizer(format_prompt(tokenizer, question), add_special_tokens=False).input_ids
    response = tokenizer(solution, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    return prompt + response, [IGNORE] * len(prompt) + response


def collate(examples: Sequence[tuple[list[int], list[int]]], pad_id: int):
    """Right-pad to the longest row: (input_ids, labels, attention_mask) tensors."""
    import torch

    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (x, y) in enumerate(examples):
        ids[i, : len(x)] = torch.tensor(x)
        labels[i, : len(y)] = torch.tensor(y)
        mask[i, : len(x)] = 1
    return ids, labels, mask


def pack(examples: Sequence[tuple[list[int], list[int]]], pad_id: int):
    """Pack sequences end to end into as few rows as first-fit-decreasing finds, each row as
    long as the longest sequence: (input_ids, labels, position_ids) tensors. Position ids
    restart at 0 with each sequence, which makes transformers attend within each sequence
    only (with use_cache=False, no attention mask); a sequence's first label is its prompt's
    (IGNORE), so no loss crosses a boundary. Row tails are padding with IGNORE labels."""
    import torch

    width = max(len(ids) for ids, _ in examples)
    rows: list[list[int]] = []  # example indices per row
    free: list[int] = []
    for i in sorted(range(len(examples)), key=lambda i: -len(examples[i][0])):
        n = len(examples[i][0])
        r = next((r for r, f in enumerate(free) if f >= n), None)
        if r is None:
            rows.append([])
            free.append(width)
            r = len(rows) - 1
        rows[r].append(i)
        free[r] -= n
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    for r, members in enumerate(rows):
        at = 0
        for i in members:
            x, y = examples[i]
            if y[0] != IGNORE:
                raise ValueError("pack: a sequence's first label must be IGNORE (its prompt's first token)")
            ids[r, at : at + len(x)] = torch.tensor(x)
            labels[r, at : at + len(y)] = torch.tensor(y)
            positions[r, at : at + len(x)] = torch.arange(len(x))
            at += len(x)
        positions[r, at:] = torch.arange(width - at)  # the tail: a padding "sequence" of its own
    return ids, labels, positions


def lr_at(step: int, cfg: SFTConfig) -> float:
    """Linear warmup, then cosine decay to 10% of the peak (or the peak, with decay off)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if not cfg.decay:
        return cfg.lr
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _batch_loss_fn(model, pad_id: int, cfg: SFTConfig) -> Callable[[Sequence[Example]], Any]:
    """The mean cross-entropy over a batch's labelled tokens, by the fastest exact path the
    model allows. The lean stream forward (engines/training/lean_train.py, the RL trainer's)
    runs every token position once with no padding, computes the chat template's common prefix
    once per batch and the LM head only where a label is read: about half the time of the HF
    forward on the kit's batches. Models outside its family take the HF forward over padded
    (or, with `cfg.packed`, packed) rows. Either way the loss is HF's: the mean over labelled
    tokens of the batch."""
    from areal_graph.engines.training.lean_train import LeanTrainForward, unsupported_reason

    # The lean forward has no dropout: it takes only models without any (eval mode then changes nothing).
    dropout_free = not float(getattr(model.config, "attention_dropout", 0.0) or 0.0)
    model.eval()
    lean = None
    if cfg.forward == "auto" and dropout_free and unsupported_reason(model) is None:
        lean = LeanTrainForward(model)
    if lean is not None:
        return lambda batch: _lean_loss(lean, batch)
    model.train()
    if cfg.packed:

        def packed_loss(batch: Sequence[Example]) -> Any:
            ids, labels, positions = pack(batch, pad_id)
            return model(input_ids=ids, position_ids=positions, labels=labels, use_cache=False).loss

        return packed_loss

    def padded_loss(batch: Sequence[Example]) -> Any:
        ids, labels, mask = collate(batch, pad_id)
        return model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss

    return padded_loss


def _lean_loss(lean: Any, batch: Sequence[Example]) -> Any:
    """HF's causal-LM loss of `batch` through the lean forward: label t of a sequence is
    predicted at position t - 1, so the scored tokens are exactly those with a label."""
    from areal_graph.data.packed import PackedBatch
    from areal_graph.engines.training.packed_scoring import lean_logprobs

    packed = PackedBatch.from_sequences(
        {"input_ids": [ids for ids, _ in batch], "scored": [[y != IGNORE for y in labels] for _, labels in batch]}
    )
    scored = packed["scored"]
    logprobs, _ = lean_logprobs(lean, packed, score=scored)
    return -logprobs[scored.to(logprobs.device)].sum() / scored.sum()


def _steps(
    model,
    opt,
    batch_loss: Callable[[Sequence[Example]], Any],
    examples: Sequence[Example],
    rng: random.Random,
    cfg: SFTConfig,
    on_step: Callable[[int, float], None] | None,
) -> list[float]:
    """`cfg.steps` optimizer steps on batches drawn without replacement from reshuffled epochs."""
    import torch

    order: list[int] = []
    losses: list[float] = []
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        if len(order) < cfg.batch_size:
            more = list(range(len(examples)))
            rng.shuffle(more)
            order.extend(more)
        batch = [examples[i] for i in order[: cfg.batch_size]]
        del order[: cfg.batch_size]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss = batch_loss(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
        if step % 50 == 0:
            log.info("sft step %d/%d loss %.4f (%.1fs)", step, cfg.steps, losses[-1], time.perf_counter() - t0)
    return losses


def sft(
    model,
    tokenizer,
    rows: Sequence[dict],
    cfg: SFTConfig = SFTConfig(),
    on_step: Callable[[int, float], None] | None = None,
    encode: Callable[[Any, dict], tuple[list[int], list[int]]] | None = None,
) -> list[float]:
    """Train `model` in place on rows {"question", "solution"}; returns the per-step losses.

    `on_step(step, loss)` runs after every optimizer step (the kit reports progress with it).
    `encode(tokenizer, row) -> (input_ids, labels)` replaces `encode_pair` for rows of another
    shape (multi-turn tool conversations: data/calc.py)."""
    import torch

    if not rows:
        raise ValueError("sft: no training rows")
    if encode is None:
        examples = [encode_pair(tokenizer, r["question"], r["solution"]) for r in rows]
    else:
        examples = [encode(tokenizer, r) for r in rows]
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    # fused: one kernel for all parameters; the foreach default spends more time than the
    # tiny model's forward does in some steps (deterministic either way: elementwise).
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.98),
        fused=all(p.is_floating_point() for p in model.parameters()),
    )
    # Deterministic kernels: the lean forward's gathers backpropagate through index_put with
    # accumulation, which on CPU sums in thread order; without this two builds of one recipe on
    # one machine differed from step 15 on, and builds with 1 and 2 threads differed (with it,
    # they are bit-identical: benchmarks/bench_kit_robustness.py shows the weights' hashes).
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        losses = _steps(model, opt, _batch_loss_fn(model, tokenizer.pad_token_id, cfg), examples, rng, cfg, on_step)
    finally:
        torch.use_deterministic_algorithms(deterministic)
    model.eval()
    return losses
