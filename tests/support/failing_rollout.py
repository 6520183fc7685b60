"""A rollout class whose episodes raise after generating (tests/cli/test_cmd_eval.py: what `eval`
prints for a rollout that fails)."""

from __future__ import annotations

from typing import Any

from areal_graph.api.rollout import Rollout, Trajectory
from areal_graph.api.sampling import SamplingParams


class FailingRollout(Rollout):
    async def run(self, prompt: Any, client: Any, group_size: int, sampling: SamplingParams) -> list[Trajectory]:
        await client.generate(list(prompt.input_ids), SamplingParams(max_new_tokens=2))
        raise KeyError("the rubric's answer key")
