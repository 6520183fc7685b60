"""vf-arith: one-digit arithmetic chains, single turn, scored by the last \\boxed{} answer.

A plain verifiers taskset (procedural, seeded): the questions follow the builtin tiny-arith
kit's format ("What is 3 + 4 - 2?", 3-4 steps, every value in [0, 9]) so that the tiny kit can
learn on it here.
"""

import random
import re
from collections.abc import Iterator
from itertools import count

import verifiers.v1 as vf

BOXED = re.compile(r"\\boxed\{(-?\d+)\}")


def problem(rng: random.Random) -> tuple[str, int]:
    """A 3-4 step chain of + and - over 0..9 whose every partial result stays in 0..9."""
    value = rng.randint(0, 9)
    text = str(value)
    for _ in range(rng.randint(3, 4)):
        moves = [(op, k) for op in "+-" for k in range(10) if 0 <= (value + k if op == "+" else value - k) <= 9]
        op, k = rng.choice(moves)
        value = value + k if op == "+" else value - k
        text += f" {op} {k}"
    return f"What is {text}?", value


def boxed(reply: str) -> int | None:
    found = BOXED.findall(reply or "")
    return int(found[-1]) if found else None


class ArithData(vf.TaskData):
    answer: int


class ArithTask(vf.Task[ArithData]):
    @vf.stop
    async def one_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        return float(boxed(trace.last_reply) == self.data.answer)

    @vf.metric
    async def boxed_answer(self, trace: vf.Trace) -> float:
        return float(boxed(trace.last_reply) is not None)


class ArithConfig(vf.TasksetConfig):
    seed: int = 0


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    INFINITE = True

    def load(self) -> Iterator[ArithTask]:
        rng = random.Random(self.config.seed)
        for i in count():
            question, answer = problem(rng)
            yield ArithTask(ArithData(idx=i, prompt=question, answer=answer), self.config.task)


__all__ = ["ArithTaskset"]
