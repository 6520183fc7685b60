"""TextArenaSelfPlay: a two-player TextArena game played to its end, one trajectory per trained seat.

Why its own rollout class: each seat sees its own conversation (its opening, then after each of
its moves what the game says and what the other seat did), so one game gives one trajectory per
seat, each with its own tokens and its own reward from that seat's view (win 1, draw 0, loss -1:
TextArena's; `reward: won` pays 1 for a win and 0 otherwise). The other seat's moves reach a seat
as text inside its user turns: context, never trained.

Opponents (`rollout_args.opponent`):
- `self` (default): the policy plays both seats and both are trained; a group of G trajectories
  is G/2 games (G must be even), trajectory j being seat j mod 2 of game j // 2.
- `random`, `heuristic`: a fixed program plays one seat (data/two_player_games.py); the policy
  plays the other, seat j mod 2 in game j, so a group trains both seats alike.
A row that names an opponent and a seat (evaluation rows, `&opponents=` in the spec: data/
textarena_games.py) plays that, whatever the rollout's own opponent: so the run's evaluation and
`areal-graph eval --workflow` play the fixed opponents from both seats and log `won`, `drawn`,
`lost`, `invalid_move` and the same per opponent and seat (`eval/env/won_vs_random`, ...).

Every trajectory's `info["seat"]` names its seat: the advantage node's `baseline: seat` gives each
seat of a prompt group its own baseline (role-conditioned advantages, as in SPIRAL). The behaviour
log-probs and versions are the engine's, per token, as in every rollout here; a seat's opening is
rendered with the tokenizer's chat template (data.prompt_template does not apply to games).
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from typing import Any

from areal_graph.api.rollout import PromptLike, Rollout, Trajectory
from areal_graph.api.sampling import SamplingParams
from areal_graph.data.datasets import format_prompt
from areal_graph.data.textarena_games import (
    TextArenaError,
    make_game,
    observation_text,
    parse_spec,
    seat_reward,
)
from areal_graph.data.two_player_games import OPPONENTS, TWO_PLAYER_GAMES, not_built, two_player_game
from areal_graph.engines.inference.interruptible import generate_interruptible
from areal_graph.workflows.rollout.chatml_turns import ChatMLTurns
from areal_graph.workflows.rollout.textarena_game import REWARDS, check_reward_and_library

LAGGED = "model:"  # a lagged copy of the policy as the opponent: not built yet


def check_opponent(opponent: Any) -> str | None:
    if isinstance(opponent, str) and opponent.startswith(LAGGED):
        return (
            f"rollout_args.opponent {opponent!r}: an opponent played by a lagged copy of the policy is not "
            f"built yet; the opponents built are {', '.join(OPPONENTS)}"
        )
    if opponent not in OPPONENTS:
        return f"rollout_args.opponent must be one of {', '.join(OPPONENTS)}, not {opponent!r}"
    return None


@dataclass
class _Seat:
    """One seat's side of a game: its trajectory once it has moved, its index in the group."""

    index: int  # the trajectory's place in the group (sampling seeds follow it)
    traj: Trajectory | None = None
    last_reply: list[int] = field(default_factory=list)
    turns: int = 0
    refused: int = 0  # its moves the game refused (TextArena lets a seat retry once per turn)
    cut: bool = False  # its conversation reached max_total_tokens


class TextArenaSelfPlay(Rollout):
    def __init__(
        self,
        tokenizer_path: str,
        opponent: str = "self",
        max_turns: int = 18,
        max_total_tokens: int = 1024,
        invalid_move_reward: float | None = None,
        reward: str = "game",
    ) -> None:
        """max_turns: the most moves one game lasts, both seats together, refused moves included
        (TicTacToe: 9 moves, and a seat may retry a refused move once per turn).
        max_total_tokens: the most tokens of one seat's conversation; a game that would pass it
        ends unfinished (reward 0 for both seats, `finished` false).
        invalid_move_reward: the reward of the seat whose invalid move ended the game (None:
        TextArena's, -1); reward: "game" (1 / 0 / -1) or "won" (1 for a win, 0 otherwise)."""
        for problem in (check_opponent(opponent), None if reward in REWARDS else f"reward must be one of {REWARDS}"):
            if problem:
                raise ValueError(f"TextArenaSelfPlay: {problem}")
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(tokenizer_path)
        self.turns = ChatMLTurns(self.tok, "TextArenaSelfPlay")
        self.opponent, self.reward = opponent, reward
        self.max_turns, self.max_total_tokens = max_turns, max_total_tokens
        self.invalid_move_reward = invalid_move_reward

    @classmethod
    def check_args(cls, rollout_args: dict[str, Any]) -> str | None:
        return check_opponent(rollout_args.get("opponent", "self")) or check_reward_and_library(rollout_args)

    @classmethod
    def check_data(cls, rollout_args: dict[str, Any], dataset: str) -> str | None:
        if not str(dataset).startswith("textarena:"):
            return f"TextArenaSelfPlay plays textarena: games with players=2, not {dataset!r}"
        try:
            game = parse_spec(dataset)
        except TextArenaError as err:
            return str(err)
        if game.players != 2:
            return f"{dataset!r}: TextArenaSelfPlay plays two seats: add &players=2"
        return None if game.env in TWO_PLAYER_GAMES else not_built(game.env)

    def _opening_ids(self, text: str) -> list[int]:
        return list(self.tok(format_prompt(self.tok, text), add_special_tokens=False).input_ids)

    async def play(
        self, ref: dict[str, Any], client: Any, sampling: SamplingParams, trained: dict[int, int], opponent: str
    ) -> list[Trajectory]:
        """One game; `trained` maps each seat the policy plays to its index in the group. Returns
        the trained seats' trajectories, in seat order."""
        env, seed = ref["textarena"], int(ref["seed"])
        rules = two_player_game(env)
        game = make_game(env)
        game.reset(num_players=2, seed=seed)
        rng = random.Random(seed * 2 + 1 + 7919 * min(trained.values()))
        seats = {s: _Seat(i) for s, i in trained.items()}
        done, moves = False, 0
        while not done and moves < self.max_turns:
            pid, observation = game.get_observation()
            seat = seats.get(pid)
            if seat is None:  # the fixed opponent's move
                action = rules.opponent_move(opponent, game.state.game_state, pid, rng)
            else:
                text = observation_text(observation, player=pid)
                if seat.traj is None:
                    ids = self._opening_ids(text)
                    seat.traj = Trajectory(ids, [0] * len(ids), [0.0] * len(ids), [-1] * len(ids))
                else:
                    more = self.turns.user_turn(text, self.turns.closed(seat.last_reply))
                    if len(seat.traj.input_ids) + len(more) >= self.max_total_tokens:
                        seat.cut = True
                        break
                    seat.traj.append(more, generated=False)
                gen = await generate_interruptible(
                    client, seat.traj.input_ids, sampling.for_answer(seat.index, seat.turns)
                )
                seat.traj.append(
                    gen.output_ids, generated=True, logprobs=gen.output_logprobs, versions=gen.output_versions
                )
                seat.traj.finish_reason, seat.last_reply, seat.turns = (
                    gen.finish_reason,
                    list(gen.output_ids),
                    seat.turns + 1,
                )
                if gen.finish_reason == "abort":
                    break
                action = self.tok.decode(gen.output_ids, skip_special_tokens=True).strip()
            done, _ = game.step(action)
            moves += 1
            if seat is not None and not done and game.state.current_player_id == pid:
                seat.refused += 1  # the same seat moves again: the game refused the move
        for pid, seat in seats.items():
            if seat.traj is None:  # the game ended before this seat moved (its opponent's refused moves):
                # its trajectory is what it would have been shown, with nothing to train
                text = observation_text(game.state.observations.get(pid, []), player=pid)
                ids = self._opening_ids(text)
                seat.traj = Trajectory(ids, [0] * len(ids), [0.0] * len(ids), [-1] * len(ids))
        rewards, game_info = game.close()
        return [self._finish(seats[s], s, done, rewards, game_info or {}, opponent) for s in sorted(seats)]

    def _finish(self, seat: _Seat, pid: int, done: bool, rewards: Any, game_info: dict, opponent: str) -> Trajectory:
        traj = seat.traj
        assert traj is not None
        info = dict(game_info.get(pid, {}))
        paid = seat_reward(rewards, pid) if done else None
        if done and paid is None and rewards:
            info["invalid_move"] = True
        paid = paid or 0.0
        won, lost = done and paid > 0, done and paid < 0
        drawn = done and not won and not lost
        reward = paid
        if info.get("invalid_move") and self.invalid_move_reward is not None:
            reward = float(self.invalid_move_reward)
        if self.reward == "won":
            reward = 1.0 if won else 0.0
        outcome = {"won": won, "drawn": drawn, "lost": lost}
        metrics: dict[str, Any] = {
            **outcome,
            "finished": done,
            "invalid_move": bool(info.get("invalid_move", False)),  # the game ended by this seat's move
            "refused_moves": seat.refused,
            "turns": seat.turns,
            **{f"{k}_seat{pid}": v for k, v in outcome.items()},
        }
        if opponent != "self":
            metrics.update({f"{k}_vs_{opponent}": v for k, v in outcome.items()})
            metrics.update({f"{k}_vs_{opponent}_seat{pid}": v for k, v in outcome.items()})
        traj.info.update(reward=reward, seat=pid, opponent=opponent, metrics=metrics)
        return traj

    async def run(self, prompt: PromptLike, client: Any, group_size: int, sampling: SamplingParams) -> list[Trajectory]:
        ref = json.loads(prompt.answer)
        if int(ref.get("players", 1)) != 2:
            raise ValueError(
                f"TextArenaSelfPlay: row {prompt.id!r} is not a two-player game (its spec needs &players=2)"
            )
        if "opponent" in ref:  # an evaluation row: this opponent, from this seat
            games = [({int(ref["seat"]): j}, str(ref["opponent"])) for j in range(group_size)]
        elif self.opponent == "self":
            if group_size % 2:
                raise ValueError(
                    f"TextArenaSelfPlay: opponent self plays group_size/2 games of two seats; group_size {group_size} is odd"
                )
            games = [({0: j, 1: j + 1}, "self") for j in range(0, group_size, 2)]
        else:
            games = [({j % 2: j}, self.opponent) for j in range(group_size)]
        played = await asyncio.gather(
            *(self.play(ref, client, sampling, trained, opponent) for trained, opponent in games)
        )
        out = [t for game in played for t in game]
        for j, t in enumerate(out):
            t.sample_id = j
            t.answer = prompt.answer
        return out
