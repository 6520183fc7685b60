"""A request's state inside the embedded engine, and the checks a new request must pass."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from areal_graph.engines.inference.engine_errors import InvalidRequestError
from areal_graph.engines.inference.sampling import GenerationResult, SamplingParams

__all__ = ["Request", "validate_request"]

_UNIFORM_BLOCK = 64  # uniforms drawn per request at a time


@dataclass
class Request:
    """One request's state while it is queued or running (engine-internal)."""

    rid: str
    prompt: list[int]
    params: SamplingParams
    future: concurrent.futures.Future
    generator: torch.Generator
    stop_ids: frozenset[int]
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    uniforms: list[float] = field(default_factory=list)  # pre-drawn from `generator`, one per sampled token
    timeline: Any = None  # its phases so far, while traced (engine_spans.RequestTimeline)
    top_logprobs: int = 0  # how many most likely alternatives to report per token (0: none)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    on_token: Any = None  # called in the scheduler's thread after each new token and when done (streaming)
    constraint: Any = None  # its grammar state (constrained.TokenConstraint) when params.is_constrained
    forced: list[bool] = field(default_factory=list)  # constrained: per token, the grammar's only choice

    def all_tokens(self) -> list[int]:
        return self.prompt + self.output_ids

    def next_uniform(self) -> float:
        """The uniform for the token being sampled now: output token i always uses draw i.

        Drawn from the request's own generator in blocks (one torch call per block, not
        per step), so a request's tokens depend on its seed alone, never on its batch.
        """
        return self.uniform_at(len(self.output_ids))

    def uniform_at(self, i: int) -> float:
        """The uniform of output token i (a verifying step samples several positions ahead;
        each still uses its own draw, so speculation never changes which token a seed gives)."""
        while i >= len(self.uniforms):
            self.uniforms.extend(torch.rand(_UNIFORM_BLOCK, dtype=torch.float64, generator=self.generator).tolist())
        return self.uniforms[i]

    def result(self) -> GenerationResult:
        return GenerationResult(
            rid=self.rid,
            output_ids=list(self.output_ids),
            output_logprobs=list(self.logprobs),
            output_versions=list(self.versions),
            finish_reason=self.finish_reason or "abort",
            prompt_len=len(self.prompt),
            output_top_logprobs=list(self.top) if self.top_logprobs else None,
            output_forced=list(self.forced) if self.constraint is not None else None,
        )


def validate_request(
    input_ids: Sequence[int], params: SamplingParams, vocab_size: int, max_context: int, has_tokenizer: bool
) -> list[int]:
    """The prompt as a list of ints, or InvalidRequestError for a request that can never be served."""
    if not isinstance(params, SamplingParams):
        raise InvalidRequestError(f"params must be SamplingParams, got {type(params).__name__}")
    try:
        ids = [int(t) for t in input_ids]
    except (TypeError, ValueError) as err:
        raise InvalidRequestError(f"input_ids must be a list of integers: {err}") from None
    if not ids:
        raise InvalidRequestError("input_ids is empty: a request needs at least one prompt token")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(f"input_ids holds token id(s) outside the vocabulary [0, {vocab_size}): {bad[:5]}")
    problems = params.problems()
    if problems:
        raise InvalidRequestError("bad sampling params: " + "; ".join(problems))
    if len(ids) + params.max_new_tokens > max_context:
        raise InvalidRequestError(
            f"prompt ({len(ids)} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds "
            f"the context of {max_context} tokens"
        )
    if params.stop and not has_tokenizer:
        raise InvalidRequestError("stop strings need a tokenizer, and this engine has none; use stop_token_ids")
    return ids
