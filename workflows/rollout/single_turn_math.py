"""SingleTurnMath: G independent answers to one question, generated concurrently.

The simplest rollout of the paper's math experiments: the prompt is the question
(already tokenised with the chat template), each answer is one interruptible generation,
and the reward node later checks the answer text against `prompt.answer`.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from areal_graph.api.rollout import PromptLike, Rollout, Trajectory
from areal_graph.api.sampling import SamplingParams
from areal_graph.engines.inference.interruptible import generate_interruptible


class SingleTurnMath(Rollout):
    """Generate `group_size` answers per prompt; one Trajectory each."""

    def __init__(self, max_interruptions: int = 100) -> None:
        self.max_interruptions = max_interruptions

    async def run(self, prompt: PromptLike, client: Any, group_size: int, sampling: SamplingParams) -> list[Trajectory]:
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        ids = [int(t) for t in prompt.input_ids]
        if not ids:
            raise ValueError(f"prompt {getattr(prompt, 'id', '?')!r} has no input_ids")
        base = f"{getattr(prompt, 'id', 'p')}-{uuid.uuid4().hex[:8]}"

        gens = await asyncio.gather(
            *(
                generate_interruptible(
                    client, ids, sampling.for_answer(j), rid=f"{base}-{j}", max_interruptions=self.max_interruptions
                )
                for j in range(group_size)
            )
        )
        answer = str(getattr(prompt, "answer", ""))
        return [
            Trajectory.from_generation(
                ids,
                g.output_ids,
                g.output_logprobs,
                g.output_versions,
                g.finish_reason,
                answer=answer,
                sample_id=j,
                info={"prompt_id": getattr(prompt, "id", ""), "interruptions": g.num_interruptions, "rid": g.rid},
            )
            for j, g in enumerate(gens)
        ]
