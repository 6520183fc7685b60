"""PythonToolAgent: a multi-turn rollout where the policy may run Python before answering.

Each turn the policy generates until it closes a `<python>...</python>` block or ends its
answer. A closed block is executed in the sandbox (`tools/sandbox.py`) and the result is
appended as `<output>...</output>` tokens that the policy did not generate: they get
loss_mask 0, behaviour log-prob 0 and version -1, so training, GAE and the decoupled
objective skip them without breaking the sequence. Subclass and override `observe` for
another tool or environment.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import uuid
from typing import Any

from areal_graph.api.rollout import PromptLike, Rollout, Trajectory
from areal_graph.api.sampling import SamplingParams
from areal_graph.engines.inference.interruptible import generate_interruptible
from areal_graph.tools.sandbox import SandboxLimits, run_python

CODE_OPEN, CODE_CLOSE = "<python>", "</python>"
_CODE_RE = re.compile(re.escape(CODE_OPEN) + r"(.*?)" + re.escape(CODE_CLOSE), re.S)


class PythonToolAgent(Rollout):
    # Strings that end a policy turn besides EOS (the turn is then handed to `observe`).
    turn_stop: tuple[str, ...] = (CODE_CLOSE,)

    def __init__(
        self,
        tokenizer_path: str,
        max_turns: int = 4,
        max_total_tokens: int = 1024,
        sandbox_wall_s: float = 5.0,
        max_interruptions: int = 100,
    ) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.max_turns = max_turns
        self.max_total_tokens = max_total_tokens
        self.limits = SandboxLimits(wall_s=sandbox_wall_s, cpu_s=max(1, int(sandbox_wall_s)))
        self.max_interruptions = max_interruptions

    async def observe(self, generated_text: str) -> str | None:
        """The environment's reply to one turn, or None when the episode is over."""
        match = _CODE_RE.search(generated_text)
        if match is None:
            return None
        result = await run_python(match.group(1), self.limits)
        return f"\n<output>\n{result.as_observation()}\n</output>\n"

    def count_calls(self, generated_text: str) -> int:
        """Tool calls in a turn that `observe` answered (recorded in `info["tool_calls"]`)."""
        return 1

    async def _one_episode(
        self, client: Any, prompt: PromptLike, sampling: SamplingParams, rid: str, answer: int = 0
    ) -> Trajectory:
        ids = [int(t) for t in prompt.input_ids]
        traj = Trajectory(
            ids, [0] * len(ids), [0.0] * len(ids), [-1] * len(ids), answer=str(prompt.answer), info={"tool_calls": 0}
        )
        turn_params = dataclasses.replace(sampling, stop=list(sampling.stop) + list(self.turn_stop))
        finish = "length"
        for turn in range(self.max_turns):
            budget = min(turn_params.max_new_tokens, self.max_total_tokens - len(traj.input_ids))
            if budget <= 0:
                finish = "length"
                break
            gen = await generate_interruptible(
                client=client,
                prompt_ids=traj.input_ids,
                sampling=dataclasses.replace(turn_params.for_answer(answer, turn), max_new_tokens=budget),
                rid=f"{rid}-t{turn}",
                max_interruptions=self.max_interruptions,
            )
            traj.append(gen.output_ids, generated=True, logprobs=gen.output_logprobs, versions=gen.output_versions)
            finish = gen.finish_reason
            if finish != "stop":
                break
            text = self.tokenizer.decode(gen.output_ids, skip_special_tokens=True)
            observation = await self.observe(text)
            if observation is None:
                break
            traj.append(self.tokenizer.encode(observation, add_special_tokens=False), generated=False)
            traj.info["tool_calls"] += self.count_calls(text)
        traj.finish_reason = finish
        return traj

    async def run(self, prompt: PromptLike, client: Any, group_size: int, sampling: SamplingParams) -> list[Trajectory]:
        base = f"{getattr(prompt, 'id', 'p')}-{uuid.uuid4().hex[:8]}"
        trajs = await asyncio.gather(
            *(self._one_episode(client, prompt, sampling, f"{base}-{j}", j) for j in range(group_size))
        )
        for j, t in enumerate(trajs):
            t.sample_id = j
        return list(trajs)
