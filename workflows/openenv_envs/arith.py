"""ArithEnvironment: one-digit arithmetic chains as an OpenEnv environment, with one retry.

Why this environment: the builtin kit tiny-arith was warm-started on exactly these questions
("What is 3 + 4 - 2?", data/arith.py's "one-digit" level), so a tiny model already solves some of
them and RL has signal on a CPU. It is written as any OpenEnv environment is (pydantic Action,
Observation and State, an `Environment` subclass with reset/step/state), so it can be served by
OpenEnv's own `create_fastapi_app` (workflows/openenv_envs/arith_server.py) and played by anything
that speaks OpenEnv's protocol.

An episode: `reset(seed)` draws the problem from the seed (the same seed, the same problem: a
group's answers play one episode); `step(ArithAction(message=...))` checks the reply's final
answer (`\\boxed{N}`, "The answer is N") with the project's math verification. Right first time:
reward 1, done. Wrong: reward 0 and, once, "That is not right. Try again: <question>"; right on
the retry: reward 0.5, done. A step's reward is that step's alone, so their sum is the episode's.
"""

from __future__ import annotations

import random
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State

from areal_graph.data.arith import LEVELS, make_problem
from areal_graph.nodes.math_reward import math_reward

LEVEL = "one-digit"  # the builtin tiny-arith kit's task
REWARD_BY_TRY = (1.0, 0.5)  # a right answer's reward on the first and the second (last) try


class ArithAction(Action):
    """The player's reply, as written (the final answer is read from it)."""

    message: str


class ArithObservation(Observation):
    """What the player is shown: the question, or the retry request with the question again."""

    prompt: str


class ArithState(State):
    question: str = ""
    answer: str = ""
    tries: int = 0


class ArithEnvironment(Environment[ArithAction, ArithObservation, ArithState]):
    """See the module docstring. Sessions share nothing, so one server serves many at once."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = ArithState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> ArithObservation:
        problem = make_problem(random.Random(seed), LEVELS[LEVEL])
        self._state = ArithState(episode_id=episode_id, question=problem["question"], answer=problem["answer"])
        return ArithObservation(prompt=problem["question"], done=False, reward=None)

    def step(self, action: ArithAction, timeout_s: float | None = None, **kwargs: Any) -> ArithObservation:
        st = self._state
        if not st.question:
            raise RuntimeError("ArithEnvironment.step before reset")
        st.tries += 1
        st.step_count += 1
        right = math_reward(action.message, st.answer) == 1.0
        if right:
            return ArithObservation(prompt="", done=True, reward=REWARD_BY_TRY[st.tries - 1])
        if st.tries < len(REWARD_BY_TRY):
            return ArithObservation(prompt=f"That is not right. Try again: {st.question}", done=False, reward=0.0)
        return ArithObservation(prompt="", done=True, reward=0.0)

    @property
    def state(self) -> ArithState:
        return self._state


__all__ = ["ArithAction", "ArithEnvironment", "ArithObservation", "ArithState"]
