"""nodes/agent_reward.py: `reward: {fn: agent}` hands training the reward the agent stored in
its episode (`info["reward"]`), as a float, and refuses an episode that has none.

tests/runtime/hosts/test_reward_episode.py checks it through `resolve_reward_fn("agent")`
with one value; here the function is called directly on the edge values (0, integers, numeric
strings, an explicit None)."""

from __future__ import annotations

import inspect

import pytest

from areal_graph.api.episode import Episode, Turn
from areal_graph.nodes.agent_reward import agent_reward


@pytest.mark.parametrize("reward,expected", [(0.75, 0.75), (0, 0.0), (1, 1.0), (-2, -2.0), ("0.5", 0.5), (True, 1.0)])
def test_the_agents_own_reward_is_returned_as_a_float(reward, expected):
    got = agent_reward("text", "42", Episode("text", "42", info={"reward": reward}))
    assert got == expected and type(got) is float


def test_the_completion_answer_and_turns_do_not_matter():
    turns = (Turn("prompt", "q"), Turn("assistant", "wrong"), Turn("environment", "x"), Turn("assistant", "1"))
    assert agent_reward("wrong", "right", Episode("wrong", "right", turns, {"reward": 0.25, "tool_calls": 1})) == 0.25


@pytest.mark.parametrize("info", [{}, {"reward": None}, {"turn_rewards": [1.0]}])
def test_an_episode_without_a_reward_of_its_own_is_refused(info):
    with pytest.raises(ValueError, match=r"no reward of its own \(the agent returned None\)"):
        agent_reward("t", "a", Episode("t", "a", info=info))


def test_a_reward_that_is_not_a_number_is_an_error():
    with pytest.raises(ValueError):
        agent_reward("t", "a", Episode("t", "a", info={"reward": "great"}))


def test_it_takes_the_episode_parameter_the_reward_host_looks_for():
    assert list(inspect.signature(agent_reward).parameters) == ["completion", "answer", "episode"]
