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

from collections.abc import Sequence

import torch

from areal_graph.api.sampling import GenerationResult, SamplingParams

__all__ = ["GenerationResult", "SamplingParams", "generator_seed", "sample_tokens", "truncate_logits"]


_MASK64 = (1 << 64) - 1


def generator_seed(seed: int) -> int:
    """The seed to give a request's torch.Generator for the request seed `seed` (any integer).

    Why not `seed` itself: torch's CPU generator (mt19937) keeps only the low 32 bits of the seed
    it is given, and the run derives request seeds as run_seed * 2**40 + group * 2**16 + ...
    (runtime/orchestration/generation.py), so runs of different `runtime.seed` sampled exactly the
    same tokens. A splitmix64 finaliser spreads every bit of the seed over the low 32 bits."""
    z = (int(seed) + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def sample_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator] | None = None,
    *,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of `logits` [B, V]; return (tokens [B] int64, logprobs [B] float32).

    Greedy rows take the argmax. The others draw from softmax(logits / T) restricted to the
    top-k / top-p set by inverse-CDF sampling: the token is the first whose cumulative
    probability exceeds u * total, for one uniform u in [0, 1) per row. Why one uniform and
    not `torch.multinomial` per row: the draw for the whole batch is then a handful of
    vectorised ops, and a row's token still depends only on its own u, so a request's draws
    do not depend on which other requests share the batch. `uniforms` [B] comes from the
    caller (the engine pre-draws each request's from its own generator, in blocks), or else
    one is drawn here from generators[i] for each sampled row i. Log-probs: see the module
    docstring.
    """
    b = logits.shape[0]
    logits = logits.float()
    temps = [1.0 if p.is_greedy else float(p.temperature) for p in params]
    scaled = logits if all(t == 1.0 for t in temps) else logits / torch.tensor(temps, device=logits.device).unsqueeze(1)
    logprobs_all = torch.log_softmax(scaled, dim=-1)
    sample_rows = [i for i, p in enumerate(params) if not p.is_greedy]
    if not sample_rows:
        tokens = torch.argmax(logits, dim=-1)
    else:
        if uniforms is None:
            if generators is None:
                raise ValueError("sampled rows need `uniforms` or per-row `generators`")
            uniforms = torch.zeros(b, dtype=torch.float64)
            for i in sample_rows:
                uniforms[i] = float(torch.rand(1, dtype=torch.float64, generator=generators[i]))
        drawn = _inverse_cdf(scaled, logprobs_all, params, sample_rows, uniforms.to(logits.device))
        if len(sample_rows) == b:
            tokens = drawn
        else:
            tokens = torch.argmax(logits, dim=-1)
            rows = torch.tensor(sample_rows, dtype=torch.long, device=logits.device)
            tokens[rows] = drawn.index_select(0, rows)
    lp = logprobs_all.gather(1, tokens.view(b, 1)).squeeze(1)
    return tokens, lp


def _inverse_cdf(
    scaled: torch.Tensor,
    logprobs: torch.Tensor,
    params: Sequence[SamplingParams],
    sample_rows: Sequence[int],
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """A token for every row of `scaled` [B, V] (only `sample_rows` matter) from `uniforms` [B].

    Without truncation the probabilities are exp(logprobs) (no second softmax). The CDF is
    summed in float64 so that the tail of a large vocabulary keeps its mass. A token of
    zero probability is never returned: it adds nothing to the CDF, so the first index
    whose CDF exceeds u * total always carries mass.
    """
    ks = [params[i].top_k for i in sample_rows]
    ps = [params[i].top_p for i in sample_rows]
    if any(k > 0 for k in ks) or any(p < 1.0 for p in ps):
        rows = torch.tensor(sample_rows, dtype=torch.long, device=scaled.device)
        probs = torch.zeros_like(scaled)
        probs[rows] = torch.softmax(truncate_logits(scaled.index_select(0, rows), ks, ps), dim=-1)
    else:
        probs = logprobs.exp()
    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)
    target = uniforms.to(torch.float64).unsqueeze(1) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=scaled.shape[1] - 1)
    # u * total rounds up to total only in a float corner case: take the most likely token then
    bad = probs.gather(1, tokens.view(-1, 1)).squeeze(1) <= 0
    if bool(bad.any()):
        tokens = torch.where(bad, probs.argmax(dim=-1), tokens)
    return tokens


def truncate_logits(logits: torch.Tensor, top_k: Sequence[int], top_p: Sequence[float]) -> torch.Tensor:
    """Set logits outside each row's top-k and top-p (nucleus) set to -inf.

    Top-k is applied first, then top-p on the renormalised top-k distribution (SGLang's
    order). The most likely token always survives.
    """
    n, v = logits.shape
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    ranks = torch.arange(v, device=logits.device).unsqueeze(0)
    k = torch.tensor([kk if kk > 0 else v for kk in top_k], device=logits.device).unsqueeze(1)
    keep = ranks < k
    sorted_logits = sorted_logits.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly more likely tokens
    p = torch.tensor(list(top_p), dtype=probs.dtype, device=probs.device).unsqueeze(1)
    keep = keep & (before < p)
    keep[:, 0] = True
    out = torch.full_like(logits, float("-inf"))
    return out.scatter(1, order, sorted_logits.masked_fill(~keep, float("-inf")))
