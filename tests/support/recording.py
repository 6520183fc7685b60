"""An engine client that records what the engine generated: the tests of multi-turn rollouts
compare a trajectory's trained tokens (and log-probs) with the engine's own outputs."""

from __future__ import annotations

from areal_graph.engines.inference.rollout_eval import LocalEngineClient


class RecordingClient(LocalEngineClient):
    """A LocalEngineClient that keeps every generation's output ids and log-probs, in order."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.outputs: list[list[int]] = []
        self.logprobs: list[list[float]] = []

    async def generate(self, input_ids, params, rid=None):
        result = await super().generate(input_ids, params, rid)
        self.outputs.append(list(result.output_ids))
        self.logprobs.append(list(result.output_logprobs))
        return result
