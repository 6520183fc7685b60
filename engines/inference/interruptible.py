"""Interruptible generation, seen from the rollout side and independent of the engine.

AReaL's interruptible rollout: when new weights arrive, in-flight generations stop, the
weights change, and decoding continues from the tokens so far; every token keeps the
version that produced it and its behaviour log-prob under that version.

Two server behaviours reach the same result through this one loop:
- the embedded engine (and vLLM, paused in keep mode and preempted) pauses, swaps weights,
  re-prefills and continues by itself: the request returns once, its `output_versions`
  already switching from v to v+1;
- SGLang (pause in abort mode) returns the request early with finish_reason `abort`: we
  wait for the update to finish, then resubmit prompt + tokens so far with max_new_tokens
  reduced by what was generated, and concatenate the chunks.

A request aborted on purpose (`client.abort(rid)` / `abort_all`) is not an interruption: it
comes back as finish_reason "abort" and is not resubmitted.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from areal_graph.engines.inference.sampling import SamplingParams

log = logging.getLogger(__name__)


@dataclass
class Chunk:
    """One server response: a contiguous run of generated tokens."""

    rid: str
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    finish_reason: str
    output_forced: list[bool] | None = None  # constrained decoding: the grammar's only choice


@dataclass
class ChunkedGeneration:
    """A full generation assembled from one or more chunks (one per interruption + 1)."""

    rid: str
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_versions: list[int] = field(default_factory=list)
    finish_reason: str = "abort"
    chunks: list[Chunk] = field(default_factory=list)
    output_forced: list[bool] = field(default_factory=list)  # per token; False where no grammar forced it

    @property
    def num_interruptions(self) -> int:
        """Times the server gave the request back early because the weights changed."""
        return sum(1 for c in self.chunks if c.finish_reason == "abort") - (self.finish_reason == "abort")

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def add(self, chunk: Chunk) -> None:
        if not (len(chunk.output_ids) == len(chunk.output_logprobs) == len(chunk.output_versions)):
            raise ValueError(
                f"chunk {chunk.rid}: {len(chunk.output_ids)} tokens but {len(chunk.output_logprobs)} log-probs "
                f"and {len(chunk.output_versions)} versions"
            )
        self.chunks.append(chunk)
        self.output_ids.extend(chunk.output_ids)
        self.output_logprobs.extend(chunk.output_logprobs)
        self.output_versions.extend(chunk.output_versions)
        self.output_forced.extend(chunk.output_forced or [False] * len(chunk.output_ids))
        self.finish_reason = chunk.finish_reason


class TooManyInterruptions(RuntimeError):
    """A request was interrupted more often than allowed (the server keeps aborting it)."""


async def generate_interruptible(
    client: Any,
    prompt_ids: Sequence[int],
    sampling: SamplingParams,
    rid: str | None = None,
    max_interruptions: int = 100,
) -> ChunkedGeneration:
    """Generate up to `sampling.max_new_tokens` tokens, surviving weight updates.

    `client` is an `InferenceClient` or a `ServerPool` (anything with `generate`,
    `was_aborted_by_user`, `abort_epoch`, `wait_weights_ready`). Every chunk is sent with
    the same rid (the previous chunk has finished when the next is sent), so
    `client.abort(rid)` stops the generation whichever chunk is running.
    """
    if sampling.max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {sampling.max_new_tokens}")
    rid = rid or uuid.uuid4().hex
    prompt = [int(t) for t in prompt_ids]
    gen = ChunkedGeneration(rid=rid, prompt_ids=prompt)
    interruptions = 0
    epoch = client.abort_epoch()
    while True:
        remaining = sampling.max_new_tokens - len(gen.output_ids)
        if remaining <= 0 and gen.chunks:
            gen.finish_reason = "length"
            return gen
        k = len(gen.chunks)
        params = dataclasses.replace(sampling, max_new_tokens=remaining)
        if sampling.seed is not None and k > 0:
            # a fresh stream for the continuation: replaying the first chunk's random draws
            # from the new position would correlate the two chunks
            params = dataclasses.replace(params, seed=sampling.seed + k)
        res = await client.generate(prompt + gen.output_ids, params, rid=rid)
        gen.add(
            Chunk(
                rid,
                list(res.output_ids),
                list(res.output_logprobs),
                list(res.output_versions),
                res.finish_reason,
                getattr(res, "output_forced", None),
            )
        )
        if res.finish_reason != "abort":
            return gen
        if client.was_aborted_by_user(rid, epoch):
            return gen
        interruptions += 1
        if sampling.is_constrained:
            raise TooManyInterruptions(
                f"request {rid} holds a schema or grammar and was interrupted by an abort-style weight update "
                "(SGLang's pause): resuming its grammar from the tokens so far is not built yet"
            )
        if interruptions > max_interruptions:
            raise TooManyInterruptions(
                f"request {rid} was interrupted {interruptions} times ({len(gen.output_ids)} tokens so far)"
            )
        log.debug("request %s interrupted after %d tokens; resubmitting", rid, len(gen.output_ids))
        await client.wait_weights_ready()
        if client.was_aborted_by_user(rid, epoch):  # aborted while it was between chunks
            gen.finish_reason = "abort"
            return gen
