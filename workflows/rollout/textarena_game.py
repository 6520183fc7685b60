"""TextArenaGame: a single-player TextArena game (GuessTheNumber, Hangman, FrozenLake, ...) as a
multi-turn episode.

The game's opening message is the prompt (a `textarena:<env>?size=&seed=` row, data/
textarena_games.py, names the game's seed); each reply of the model is the player's action;
the game's answer (a hint, the board, "invalid move" as the library words it) becomes the next
user turn; the game's own reward at the end (TextArena's, invalid moves included as it defines
them) is the episode's reward, in `info["reward"]` for the reward node's `fn: agent`. What is
trained are the tokens the policy sampled: the user turns are appended as tokens after them,
never by re-rendering the conversation. ChatML chat templates (Qwen, the builtin kits).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from areal_graph.api.rollout import PromptLike, Rollout, Trajectory
from areal_graph.api.sampling import SamplingParams
from areal_graph.data.textarena_games import (
    TextArenaError,
    library,
    make_game,
    observation_text,
    parse_spec,
    seat_reward,
)
from areal_graph.engines.inference.interruptible import generate_interruptible
from areal_graph.workflows.rollout.chatml_turns import ChatMLTurns

REWARDS = ("game", "won")  # the episode's reward: the game's own, or 1 for a won game and 0 otherwise


def check_reward_and_library(rollout_args: dict[str, Any]) -> str | None:
    """What a TextArena rollout's `validate` says before any game starts: the reward it was given,
    and whether textarena is installed."""
    if rollout_args.get("reward", "game") not in REWARDS:
        return f"rollout_args.reward must be one of {', '.join(REWARDS)}, not {rollout_args['reward']!r}"
    try:
        library()
    except TextArenaError as err:
        return str(err)
    return None


class TextArenaGame(Rollout):
    def __init__(
        self,
        tokenizer_path: str,
        max_turns: int = 20,
        max_total_tokens: int = 1024,
        invalid_move_reward: float | None = None,
        reward: str = "game",
    ) -> None:
        """invalid_move_reward: the reward of a game an invalid move ended (None: the library's own).
        TextArena pays an invalid move its share of the game completed (GuessTheNumber: up to ~0.9,
        more than a lost game's 0), which a policy learns to collect instead of winning.
        reward: "game", the library's reward at the end; "won", 1 for a won game and 0 for any
        other. Some games pay a lost game its share completed too (FrozenLake: a fall into a hole
        next to the goal earns ~0.8), which leaves winning worth little more than losing late."""
        if reward not in REWARDS:
            raise ValueError(f"TextArenaGame: reward must be one of {', '.join(REWARDS)}, not {reward!r}")
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(tokenizer_path)
        self.turns = ChatMLTurns(self.tok, "TextArenaGame")
        self.max_turns, self.max_total_tokens = max_turns, max_total_tokens
        self.invalid_move_reward = invalid_move_reward
        self.reward = reward

    @classmethod
    def check_args(cls, rollout_args: dict[str, Any]) -> str | None:
        return check_reward_and_library(rollout_args)

    @classmethod
    def check_data(cls, rollout_args: dict[str, Any], dataset: str) -> str | None:
        if str(dataset).startswith("textarena:"):
            try:
                players = parse_spec(dataset).players
            except TextArenaError as err:
                return str(err)
            if players != 1:
                return (
                    f"{dataset!r} has rows for {players} seats; TextArenaGame plays one: use rollout_class "
                    "areal_graph.workflows.rollout.textarena_selfplay:TextArenaSelfPlay"
                )
        return None

    async def episode(self, prompt: PromptLike, client: Any, sampling: SamplingParams, j: int) -> Trajectory:
        game_ref = json.loads(prompt.answer)
        game = make_game(game_ref["textarena"])
        game.reset(num_players=1, seed=int(game_ref["seed"]))
        game.get_observation()  # the opening: already the prompt
        ids = list(prompt.input_ids)
        traj = Trajectory(ids, [0] * len(ids), [0.0] * len(ids), [-1] * len(ids), answer=prompt.answer, sample_id=j)
        done, turns = False, 0
        for turn in range(self.max_turns):
            gen = await generate_interruptible(client, traj.input_ids, sampling.for_answer(j, turn))
            traj.append(gen.output_ids, generated=True, logprobs=gen.output_logprobs, versions=gen.output_versions)
            traj.finish_reason = gen.finish_reason
            turns += 1
            action = self.tok.decode(gen.output_ids, skip_special_tokens=True).strip()
            done, _ = game.step(action)
            if done or gen.finish_reason == "abort":  # a reply cut at the length limit is still a move
                break
            _, observation = game.get_observation()
            more = self.turns.user_turn(observation_text(observation, player=0), self.turns.closed(gen.output_ids))
            if len(traj.input_ids) + len(more) >= self.max_total_tokens:
                break
            traj.append(more, generated=False)
        rewards, game_info = game.close()
        info0 = dict((game_info or {}).get(0, {}))
        paid = seat_reward(rewards, 0)
        if done and paid is None:  # a reason in place of a reward: an invalid move ended the game
            info0["invalid_move"] = True
        reward = (paid or 0.0) if done else 0.0
        won = done and reward >= 1.0 and not info0.get("invalid_move")
        if info0.get("invalid_move") and self.invalid_move_reward is not None:
            reward = float(self.invalid_move_reward)
        if self.reward == "won":
            reward = 1.0 if won else 0.0
        traj.info.update(
            reward=reward,
            metrics={
                "turns": turns,
                "finished": done,
                "won": won,
                "invalid_move": bool(info0.get("invalid_move", False)),
            },
        )
        return traj

    async def run(self, prompt: PromptLike, client: Any, group_size: int, sampling: SamplingParams) -> list[Trajectory]:
        return list(await asyncio.gather(*(self.episode(prompt, client, sampling, j) for j in range(group_size))))
