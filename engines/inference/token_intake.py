"""From a forward's logits to the tokens each request keeps: sampling, penalties, grammar masks,
top log-probs, and the checks that end an answer.

Why apart from the scheduler (`engine.py`): a plain decode step and a verifying step
(speculative decoding) must turn logits into tokens by exactly the same rule, or speculation
would change what a seed gives. Both go through `emit` here, and a verifying step samples
each fed position with the same sampler and the same per-request uniform as the plain step
that would have produced that token. Everything here runs in the scheduler's thread, holding
the step lock; resolving finished requests (and counting tokens) is the engine's.
"""

from __future__ import annotations

from typing import Any

import torch

from areal_graph.engines.inference.constrained import apply_masks
from areal_graph.engines.inference.penalties import apply_penalties
from areal_graph.engines.inference.requests import Request
from areal_graph.engines.inference.sampling import sample_tokens

__all__ = ["emit", "take_tokens", "take_verified", "top_logprobs"]


def take_tokens(
    reqs: list[Request], logits: torch.Tensor, version: int, tokenizer: Any
) -> tuple[set[int], list[Request]]:
    """Sample a token per request from `logits` [B, V] and append it. Returns the indices that
    finished and those requests (for the engine to resolve)."""
    params = [r.params for r in reqs]
    # penalties first: the reported log-prob is that of the distribution the token is drawn from
    if any(p.has_penalties for p in params):
        logits = apply_penalties(logits, params, [r.prompt for r in reqs], [r.output_ids for r in reqs])
    logits, forced = apply_masks(logits, [r.constraint for r in reqs])
    uniforms = torch.tensor(
        [0.0 if p.is_greedy else r.next_uniform() for r, p in zip(reqs, params)], dtype=torch.float64
    )
    # sampled where the logits are: on a GPU only B tokens and B log-probs cross to the host,
    # not B x vocab floats (155 MB a step for 256 rows of a 152k vocabulary)
    tokens, logprobs = sample_tokens(logits, params, uniforms=uniforms)
    tokens, logprobs = tokens.tolist(), logprobs.tolist()
    for j, r in enumerate(reqs):
        if r.top_logprobs:
            r.top.append(top_logprobs(r, logits[j]))
    done: set[int] = set()
    finished: list[Request] = []
    for j, r in enumerate(reqs):
        if emit(r, tokens[j], logprobs[j], version, forced[j], tokenizer):
            done.add(j)
            finished.append(r)
        elif r.on_token is not None:
            r.on_token()
    return done, finished


def take_verified(
    reqs: list[Request], fed: list[list[int]], logits: torch.Tensor, version: int, tokenizer: Any
) -> tuple[list[int], set[int], list[Request]]:
    """A verifying step's tokens: `fed[i]` is what request i was fed (its last token, then its
    proposal) and `logits` [sum(len(fed[i])), V] the logits after each fed token, packed in
    request order (ModelRunner.verify).

    Position j of request i is sampled exactly as a plain decode step would sample that output
    token (penalties over the answer as it would be there, the request's own uniform for that
    output index); the token is emitted, and the next position is read only while the token
    equals what was fed next (the proposal's token). For a sampled request that is the exact
    rule for a deterministic proposal x: the inverse-CDF sample equals x with probability p(x)
    and is otherwise a draw from p with x removed, renormalised; for a greedy one, x is kept
    exactly when it is the argmax. Returns per request the tokens emitted (= the fed columns its
    KV cache keeps), the indices that finished, and those requests.
    """
    owners = [(i, j) for i, f in enumerate(fed) for j in range(len(f))]
    if logits.shape[0] != len(owners):
        raise ValueError(f"verify logits hold {logits.shape[0]} positions for {len(owners)} fed tokens")
    params = [reqs[i].params for i, _ in owners]
    if any(p.has_penalties for p in params):
        outputs = [reqs[i].output_ids + fed[i][1 : j + 1] for i, j in owners]
        logits = apply_penalties(logits, params, [reqs[i].prompt for i, _ in owners], outputs)
    # constrained requests never propose (speculator.py): their one position is a plain decode row
    logits, forced = apply_masks(logits, [reqs[i].constraint if j == 0 else None for i, j in owners])
    uniforms = torch.tensor(
        [0.0 if p.is_greedy else reqs[i].uniform_at(len(reqs[i].output_ids) + j) for (i, j), p in zip(owners, params)],
        dtype=torch.float64,
    )
    tokens, logprobs = sample_tokens(logits, params, uniforms=uniforms)
    tokens, logprobs = tokens.tolist(), logprobs.tolist()
    kept, done, finished = [0] * len(reqs), set(), []
    f = 0
    for i, r in enumerate(reqs):
        base, f = f, f + len(fed[i])
        for j in range(len(fed[i])):
            t = tokens[base + j]
            if r.top_logprobs:
                r.top.append(top_logprobs(r, logits[base + j]))
            kept[i] += 1
            if emit(r, t, logprobs[base + j], version, forced[base + j], tokenizer):
                done.add(i)
                finished.append(r)
                break
            if j + 1 >= len(fed[i]) or t != fed[i][j + 1]:
                break
        if i not in done and r.on_token is not None:
            r.on_token()
    return kept, done, finished


def emit(r: Request, t: int, logprob: float, version: int, forced: Any, tokenizer: Any) -> bool:
    """Append token `t` to request `r` (its log-prob, version, grammar state); True when it
    finished the request (EOS or a stop token, a stop string, a complete grammar, max tokens)."""
    if r.constraint is not None and t not in r.stop_ids:
        r.constraint.advance(t)
    r.output_ids.append(t)
    if forced is not None:
        r.forced.append(bool(forced))
    r.logprobs.append(logprob)
    r.versions.append(version)
    if t in r.stop_ids or (r.params.stop and hits_stop_string(r, tokenizer)):
        r.finish_reason = "stop"
    elif r.constraint is not None and r.constraint.finished:
        r.finish_reason = "stop"  # the grammar is complete and nothing but EOS may follow
    elif len(r.output_ids) >= r.params.max_new_tokens:
        r.finish_reason = "length"
    return r.finish_reason is not None


def hits_stop_string(r: Request, tokenizer: Any) -> bool:
    """Did the newest token complete one of the stop strings? (decoded-text check on a tail window)."""
    longest = max(len(s) for s in r.params.stop)
    tail = r.output_ids[-(longest + 8) :]
    text = tokenizer.decode(tail, skip_special_tokens=False)
    before = tokenizer.decode(tail[:-1], skip_special_tokens=False) if len(tail) > 1 else ""
    return any(s in text and s not in before for s in r.params.stop)


def top_logprobs(r: Request, logits: torch.Tensor) -> list[tuple[int, float]]:
    """Request `r`'s `top_logprobs` most likely tokens under `logits` [V], in the temperature-scaled
    distribution the sampled token's log-prob comes from (see sampling.py)."""
    temp = 1.0 if r.params.is_greedy else float(r.params.temperature)
    logp = torch.log_softmax(logits.float().cpu() / temp, dim=-1)
    values, ids = torch.topk(logp, min(r.top_logprobs, logp.shape[-1]))
    return list(zip(ids.tolist(), values.tolist()))
