"""Offline generation through a rollout class: multi-turn agents evaluated as they are trained.

A tool-using policy's answer is not one generation but an episode (calls, tool results, the
final answer), so evaluating it with a plain prompt -> completion request would score a
tool call as a wrong answer. `generate_with_rollout` runs any `Rollout` (api/rollout.py)
against an embedded engine in this process, exactly as the rollout worker runs it against
the inference servers during RL, and returns what the reward node would score: the text of
the policy's own tokens (loss_mask 1) of each trajectory, and each trajectory's `info`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from areal_graph.api.imports import import_object
from areal_graph.api.rollout import Rollout, Trajectory
from areal_graph.api.sampling import GenerationResult, SamplingParams

__all__ = ["LocalEngineClient", "generate_with_rollout", "make_rollout", "policy_text"]


class LocalEngineClient:
    """The generation-client interface a rollout class uses (`generate`, `abort_epoch`,
    `was_aborted_by_user`, `wait_weights_ready`), served by an in-process EmbeddedEngine.
    Its weights never change underneath a request, so nothing is ever interrupted."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, rid: str | None = None
    ) -> GenerationResult:
        return await self.engine.generate(list(input_ids), params, rid=rid)

    def abort_epoch(self) -> int:
        return 0

    def was_aborted_by_user(self, rid: str, epoch_at_submit: int | None = None) -> bool:
        return False

    async def wait_weights_ready(self, timeout: float | None = None) -> None:
        return None


def policy_text(tokenizer: Any, trajectory: Trajectory) -> str:
    """The policy's own tokens of a trajectory as text: what the reward node scores."""
    ids = [t for t, m in zip(trajectory.input_ids, trajectory.loss_mask) if m]
    return tokenizer.decode(ids, skip_special_tokens=True)


def generate_with_rollout(
    engine: Any,
    rollout: Rollout,
    prompts: Sequence[Any],
    requests: Sequence[tuple[int, SamplingParams]],
    on_progress: Callable[[int, int], None] | None = None,
) -> list[Trajectory]:
    """One trajectory per request (prompt index, sampling), run concurrently through `rollout`
    with a group of 1; `engine` must be started. Order follows `requests`."""
    client = LocalEngineClient(engine)
    done = 0

    async def one(i: int, params: SamplingParams) -> Trajectory:
        nonlocal done
        [trajectory] = await rollout.run(prompts[i], client, 1, params)
        done += 1
        if on_progress is not None:
            on_progress(done, len(requests))
        return trajectory

    async def run_all() -> list[Trajectory]:
        try:
            return list(await asyncio.gather(*(one(i, p) for i, p in requests)))
        finally:  # what the rollout started lives on this loop, which ends here
            await rollout.aclose()

    return asyncio.run(run_all())


def make_rollout(path: str, tokenizer_path: str, **kwargs: Any) -> Rollout:
    """An instance of the rollout class named by `path` ("package.module:Class"), given the
    policy's tokenizer when its constructor takes `tokenizer_path` (as the rollout worker
    does). ImportPathError / TypeError name what is wrong."""
    cls = import_object(path, what="rollout class")
    if not (isinstance(cls, type) and issubclass(cls, Rollout)):
        raise TypeError(f"rollout class {path!r} is not a subclass of areal_graph.api.rollout.Rollout")
    if "tokenizer_path" in inspect.signature(cls).parameters and "tokenizer_path" not in kwargs:
        kwargs["tokenizer_path"] = tokenizer_path
    return cls(**kwargs)
