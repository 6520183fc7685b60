"""Sampling parameters, generation results, and the batched token sampler.

Which log-prob is reported (the *behaviour* log-prob RL needs):
the log-probability of the sampled token under the **temperature-scaled** distribution,
``log_softmax(logits / temperature)[token]``, taken *before* top-k / top-p truncation.
This is what SGLang reports by default (its sampler computes logprobs after temperature
scaling unless ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is set) and what AReaL's trainer
reproduces (it divides the logits by the rollout temperature before its log-softmax), so
the decoupled-PPO importance weight pi_prox / pi_behav compares like with like. For greedy
requests (``greedy=True`` or ``temperature == 0``) the temperature is taken as 1: the
reported log-prob is that of the raw model distribution. Truncation (top-k / top-p) is *not*
folded into the log-prob, again as in SGLang; a trainer that wants the exact truncated
sampling density must apply the same truncation itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch


@dataclass
class SamplingParams:
    """Per-request decoding settings (SGLang's `sampling_params`, the RL subset)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    greedy: bool = False  # temperature == 0 also means greedy
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    seed: int | None = None  # per-request seed: same seed + same weights -> same tokens
    ignore_eos: bool = False

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0

    def problems(self) -> list[str]:
        """What is wrong with these values (empty when they are fine)."""
        out = []
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool) or self.max_new_tokens < 0:
            out.append(f"max_new_tokens must be an integer >= 0, got {self.max_new_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0 or self.temperature == float("inf"):
            out.append(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            out.append(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k != -1):
            out.append(f"top_k must be -1 (off) or an integer >= 1, got {self.top_k!r}")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            out.append(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            out.append(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            out.append(f"seed must be an integer or None, got {self.seed!r}")
        return out


@dataclass
class GenerationResult:
    """One finished request. Per-token lists are aligned with `output_ids`."""

    rid: str
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    finish_reason: str  # "stop" | "length" | "abort"
    prompt_len: int


def sample_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of `logits` [B, V]; return (tokens [B] int64, logprobs [B] float32).

    Greedy rows take the argmax; the others draw from softmax(logits / T) restricted to the
    top-k / top-p set, each from its own generator (so a request's draws do not depend on
    which other requests share the batch). Log-probs: see the module docstring.
    """
    b = logits.shape[0]
    logits = logits.float()
    temps = torch.tensor([1.0 if p.is_greedy else float(p.temperature) for p in params], dtype=torch.float32)
    scaled = logits / temps.unsqueeze(1)
    logprobs_all = torch.log_softmax(scaled, dim=-1)
    tokens = torch.argmax(logits, dim=-1)
    sample_rows = [i for i, p in enumerate(params) if not p.is_greedy]
    if sample_rows:
        rows = torch.tensor(sample_rows, dtype=torch.long)
        sub = scaled.index_select(0, rows)
        ks = [params[i].top_k for i in sample_rows]
        ps = [params[i].top_p for i in sample_rows]
        if any(k > 0 for k in ks) or any(p < 1.0 for p in ps):
            sub = truncate_logits(sub, ks, ps)
        probs = torch.softmax(sub, dim=-1)
        for j, i in enumerate(sample_rows):
            tokens[i] = torch.multinomial(probs[j], 1, generator=generators[i])[0]
    lp = logprobs_all.gather(1, tokens.view(b, 1)).squeeze(1)
    return tokens, lp


def truncate_logits(logits: torch.Tensor, top_k: Sequence[int], top_p: Sequence[float]) -> torch.Tensor:
    """Set logits outside each row's top-k and top-p (nucleus) set to -inf.

    Top-k is applied first, then top-p on the renormalised top-k distribution (SGLang's
    order). The most likely token always survives.
    """
    n, v = logits.shape
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    ranks = torch.arange(v).unsqueeze(0)
    k = torch.tensor([kk if kk > 0 else v for kk in top_k]).unsqueeze(1)
    keep = ranks < k
    sorted_logits = sorted_logits.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly more likely tokens
    p = torch.tensor(list(top_p), dtype=probs.dtype).unsqueeze(1)
    keep = keep & (before < p)
    keep[:, 0] = True
    out = torch.full_like(logits, float("-inf"))
    return out.scatter(1, order, sorted_logits.masked_fill(~keep, float("-inf")))
