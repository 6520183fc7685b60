"""The reward an agent gave its own episode (`reward: {fn: agent}`).

An agent run by `OpenAIAgentRollout` may return its episode's reward (it ran the tests, it
checked the final answer against the environment); the rollout stores it in
`Trajectory.info["reward"]` (the reward of the trajectory's last call; each call's, discounted
by `turn_discount`, is in `info["turn_rewards"]`). This function hands that value to training.
"""

from __future__ import annotations

from areal_graph.api.episode import Episode


def agent_reward(completion: str, answer: str, episode: Episode) -> float:
    reward = episode.info.get("reward")
    if reward is None:
        raise ValueError(
            "the episode has no reward of its own (the agent returned None): "
            "use a reward fn that scores the answer instead of `agent`"
        )
    return float(reward)
