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


class DataCheckedRollout(Rollout):
    """Refuses `level` above 1 for any dataset (tests/cli/test_preflight.py: Rollout.check_data)."""

    def __init__(self, tokenizer_path: str = "", level: int = 0) -> None:
        self.level = level

    @classmethod
    def check_data(cls, rollout_args: dict[str, Any], dataset: str) -> str | None:
        level = rollout_args.get("level", 0)
        return f"level {level} is too hard for {dataset}" if level > 1 else None

    async def run(self, prompt: Any, client: Any, group_size: int, sampling: SamplingParams) -> list[Trajectory]:
        raise NotImplementedError
