"""Frequency, presence and repetition penalties on a batch of logits, as vLLM and SGLang define them.

Applied to the raw logits before temperature, truncation and sampling (engine.py), so the
reported behaviour log-prob is that of the penalised distribution the token was actually drawn
from (like a constrained token's), and the decoupled-PPO weight pi_prox / pi_behav measures
how far the trained policy is from what really generated the answer:

- repetition (CTRL's, vLLM's `repetition_penalty`): every token that occurs in the prompt or
  the answer so far has its logit divided by the penalty when positive and multiplied by it
  when negative (so a penalty > 1 always makes it less likely);
- frequency: the logit minus `frequency_penalty` times the token's count in the answer so far;
- presence: the logit minus `presence_penalty` once if the token occurs in the answer so far.

Frequency and presence count the answer only, repetition the prompt too (vLLM's rule).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from areal_graph.api.sampling import SamplingParams


def apply_penalties(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
) -> torch.Tensor:
    """`logits` [B, V] with each row's penalties applied (rows without any are untouched)."""
    rows = [i for i, p in enumerate(params) if p.has_penalties]
    if not rows:
        return logits
    out = logits.float().clone()
    v = out.shape[1]
    for i in rows:  # per row: the counts differ in length and content; B is at most a few hundred
        p = params[i]
        row = out[i]
        answer = torch.tensor([t for t in outputs[i] if 0 <= t < v], dtype=torch.long, device=out.device)
        if p.repetition_penalty != 1:
            seen = torch.zeros(v, dtype=torch.bool, device=out.device)
            prompt = torch.tensor([t for t in prompts[i] if 0 <= t < v], dtype=torch.long, device=out.device)
            seen[prompt] = True
            seen[answer] = True
            rp = float(p.repetition_penalty)
            row[:] = torch.where(seen, torch.where(row > 0, row / rp, row * rp), row)
        if (p.frequency_penalty != 0 or p.presence_penalty != 0) and answer.numel():
            counts = torch.bincount(answer, minlength=v).to(out.dtype)
            row -= float(p.frequency_penalty) * counts + float(p.presence_penalty) * (counts > 0).to(out.dtype)
    return out
