"""vf-arith-try-again: a two-turn verifiers environment over vf_arith's problems.

The model answers; a wrong answer is told so and asked again (one more turn). Reward 1 for the
right answer first time, 0.5 for the right answer on the second turn, 0 otherwise. Written as
verifiers' multi-turn environments are: an `Env` whose `run()` drives an interaction.
"""

from collections.abc import Iterator

import verifiers.v1 as vf
from vf_arith import ArithConfig, ArithData, ArithTaskset, boxed


class TryAgainTask(vf.Task[ArithData]):
    @vf.reward
    async def right_early(self, trace: vf.Trace) -> float:
        replies = [boxed(m.content or "") for m in trace.assistant_messages]
        if replies and replies[0] == self.data.answer:
            return 1.0
        return 0.5 if len(replies) > 1 and replies[1] == self.data.answer else 0.0

    @vf.metric
    async def solved_first(self, trace: vf.Trace) -> float:
        replies = trace.assistant_messages
        return float(bool(replies) and boxed(replies[0].content or "") == self.data.answer)


class TryAgainTaskset(vf.Taskset[TryAgainTask, ArithConfig]):
    INFINITE = True

    def load(self) -> Iterator[TryAgainTask]:
        for task in ArithTaskset(self.config).load():
            yield TryAgainTask(task.data, self.config.task)


class TryAgainEnv(vf.SingleAgentEnv):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as interaction:
            segment = await interaction.turn()
            if not segment.terminated and boxed(segment.last_reply) != task.data.answer:
                await interaction.turn(f"That is not right. Try again: {task.data.prompt}")


__all__ = ["TryAgainEnv", "TryAgainTaskset"]
