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
- a list of those (`[self, random]`): each prompt group plays one of them, the entry at its game's
  seed modulo the list's length, so the batch mixes games against the policy itself with games
  against fixed programs (a lagged copy in a list is not built yet).
- `model:NAME`: a lagged copy of the policy (`models.NAME.lagged`) plays one seat, paired as the
  fixed opponents are, on servers of its own that load the actor's weights every
  `refresh_every` versions (runtime/orchestration/lagged_servers.py); the run hands their pool
  in as `served_models[NAME]`. That seat has a conversation of its own, built as a trained
  seat's, which is never returned: its moves reach the trained seat as the game's text, like
  any opponent's, so the trained seats' tokens, behaviour log-probs and versions are all the
  policy's and the staleness bound stays exact. Metrics per opponent as for the fixed ones
  (`won_vs_NAME`, ...), plus `opponent_version` and `opponent_lag` (the policy's newest version
  in the seat's tokens minus the opponent's newest in its moves).
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
import dataclasses
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from areal_graph.api.rollout import SERVED_MODEL, PromptLike, Rollout, Trajectory
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


def check_opponent(opponent: Any) -> str | None:
    if isinstance(opponent, list):  # a mix: each prompt group plays one of them, by its game's seed
        if not opponent:
            return "rollout_args.opponent is an empty list: name at least one of self, random, heuristic"
        for entry in opponent:
            if isinstance(entry, str) and entry.startswith(SERVED_MODEL):
                return (
                    f"rollout_args.opponent {opponent!r}: a lagged copy ({entry}) in a list of opponents is not "
                    "built yet; give it alone (opponent: model:NAME)"
                )
            if entry not in OPPONENTS:
                return f"rollout_args.opponent {opponent!r}: each entry must be one of {', '.join(OPPONENTS)}, not {entry!r}"
        return None
    if isinstance(opponent, str) and opponent.startswith(SERVED_MODEL):
        if not opponent[len(SERVED_MODEL) :].strip():
            return (
                f"rollout_args.opponent {opponent!r} names no model (model:NAME, NAME a lagged model of the workflow)"
            )
        return None  # whether the workflow serves it: graph/kinds/rollout.py
    if opponent not in OPPONENTS:
        return (
            f"rollout_args.opponent must be one of {', '.join(OPPONENTS)} or model:NAME (a lagged copy "
            f"of the policy), not {opponent!r}"
        )
    return None


def check_retries(retries: Any) -> str | None:
    if retries is None or (isinstance(retries, int) and not isinstance(retries, bool) and retries >= 0):
        return None
    return (
        f"rollout_args.retries must be a whole number >= 0 (refused moves a seat may retry per turn), not {retries!r}"
    )


def check_mask(mask: Any) -> str | None:
    return None if isinstance(mask, bool) else f"rollout_args.mask_illegal_moves must be true or false, not {mask!r}"


def legal_moves_grammar(moves: list[str]) -> str:
    """A Lark grammar (llguidance's dialect) whose only sentences are `moves`."""
    return "start: " + " | ".join(json.dumps(m) for m in moves)


def served_model(opponent: str | list[str]) -> str | None:
    """The model an opponent `model:NAME` names (None: self, a fixed program or a list of those)."""
    if isinstance(opponent, list):
        return None
    return opponent[len(SERVED_MODEL) :] if opponent.startswith(SERVED_MODEL) else None


@dataclass
class _Seat:
    """One seat's side of a game: its trajectory once it has moved, its index in the group."""

    index: int  # the trajectory's place in the group (sampling seeds follow it)
    traj: Trajectory | None = None
    last_reply: list[int] = field(default_factory=list)
    turns: int = 0
    refused: int = 0  # its moves the game refused (TextArena lets a seat retry once per turn)
    cut: bool = False  # its conversation reached max_total_tokens

    def newest_version(self) -> int | None:
        """The newest weight version among its generated tokens (None: it has not moved)."""
        traj = self.traj
        return max((v for v, m in zip(traj.versions, traj.loss_mask) if m), default=None) if traj else None


class TextArenaSelfPlay(Rollout):
    def __init__(
        self,
        tokenizer_path: str,
        opponent: str | list[str] = "self",
        max_turns: int = 18,
        max_total_tokens: int = 1024,
        invalid_move_reward: float | None = None,
        reward: str = "game",
        served_models: Mapping[str, Any] | None = None,
        retries: int | None = None,
        mask_illegal_moves: bool = False,
    ) -> None:
        """max_turns: the most moves one game lasts, both seats together, refused moves included
        (TicTacToe: 9 moves, and a seat may retry a refused move once per turn).
        max_total_tokens: the most tokens of one seat's conversation; a game that would pass it
        ends unfinished (reward 0 for both seats, `finished` false).
        invalid_move_reward: the reward of the seat whose invalid move ended the game (None:
        TextArena's, -1); reward: "game" (1 / 0 / -1) or "won" (1 for a win, 0 otherwise).
        served_models: the served models' pools by name (the rollout host gives them; a
        `model:NAME` opponent plays on served_models[NAME]).
        retries: refused moves a seat may retry per turn (TextArena's error allowance; None keeps
        the game's, 1). 0 ends the game at a seat's first invalid move, lost (SPIRAL's rule): in
        self-play a refused move that is retried costs nothing, so a policy pushed off its losing
        moves drifts onto taken cells unpunished; at 0 each one is a loss.
        mask_illegal_moves: each move is decoded under a grammar that allows only the game's legal
        moves (action masking, as game RL does; the embedded engine's constrained decoding). The
        policy then never plays a taken cell, in training or evaluation; the move's forced tokens
        ("[", "]") are context, its chosen cell is trained with the masked distribution's log-prob
        as behaviour log-prob, which the decoupled-PPO weight pi / mu corrects for."""
        for problem in (
            check_opponent(opponent),
            None if reward in REWARDS else f"reward must be one of {REWARDS}",
            check_retries(retries),
            check_mask(mask_illegal_moves),
        ):
            if problem:
                raise ValueError(f"TextArenaSelfPlay: {problem}")
        model = served_model(opponent)
        if model is not None and served_models is not None and model not in served_models:
            raise ValueError(
                f"TextArenaSelfPlay: opponent {opponent!r}: no servers of model '{model}' were given "
                f"(served models: {', '.join(served_models) or 'none'})"
            )
        self.served = dict(served_models or {})
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(tokenizer_path)
        self.turns = ChatMLTurns(self.tok, "TextArenaSelfPlay")
        self.opponents = list(opponent) if isinstance(opponent, list) else [opponent]
        self.reward = reward
        self.max_turns, self.max_total_tokens = max_turns, max_total_tokens
        self.invalid_move_reward = invalid_move_reward
        self.retries = retries
        self.mask_illegal_moves = mask_illegal_moves

    @classmethod
    def check_args(cls, rollout_args: dict[str, Any]) -> str | None:
        return (
            check_opponent(rollout_args.get("opponent", "self"))
            or check_retries(rollout_args.get("retries"))
            or check_mask(rollout_args.get("mask_illegal_moves", False))
            or check_reward_and_library(rollout_args)
        )

    @classmethod
    def check_backend(cls, rollout_args: dict[str, Any], backend: str) -> str | None:
        if rollout_args.get("mask_illegal_moves") is True and backend != "embedded":
            return (
                f"mask_illegal_moves holds each move to the legal ones by a grammar, which only the embedded "
                f"engine's constrained decoding takes; inference.backend '{backend}' does not: use "
                "backend: embedded, or set mask_illegal_moves: false"
            )
        return None

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

    def _served(self, model: str) -> Any:
        """The pool of model `model`'s servers (the run gives them; `areal-graph eval` does not,
        and its rows name fixed opponents)."""
        pool = self.served.get(model)
        if pool is None:
            raise ValueError(
                f"TextArenaSelfPlay: opponent model:{model} plays on that model's servers, and none were "
                f"given (a run starts them from models.{model}.lagged; evaluation rows play fixed opponents)"
            )
        return pool

    async def play(
        self,
        ref: dict[str, Any],
        client: Any,
        sampling: SamplingParams,
        trained: dict[int, int],
        opponent: str,
        rival_index: int = 0,
    ) -> list[Trajectory]:
        """One game; `trained` maps each seat the policy plays to its index in the group. Returns
        the trained seats' trajectories, in seat order. A `model:NAME` opponent plays the other
        seat as a seat of its own (sampling seeded by `rival_index`) on that model's servers."""
        env, seed = ref["textarena"], int(ref["seed"])
        rules = two_player_game(env)
        game = make_game(env)
        game.reset(num_players=2, seed=seed)
        if self.retries is not None:
            game.state.error_allowance = self.retries  # TwoPlayerState's, compared per turn
        rng = random.Random(seed * 2 + 1 + 7919 * min(trained.values()))
        seats = {s: _Seat(i) for s, i in trained.items()}
        model = served_model(opponent)
        rival = None if model is None else (1 - next(iter(trained)), _Seat(rival_index), self._served(model))
        done, moves = False, 0
        while not done and moves < self.max_turns:
            pid, observation = game.get_observation()
            seat = seats.get(pid)
            if seat is not None:
                action = await self._move(seat, client, observation, pid, self._sampling(sampling, rules, game))
            elif rival is not None and rival[0] == pid:  # the lagged copy's move: its own conversation
                action = await self._move(rival[1], rival[2], observation, pid, self._sampling(sampling, rules, game))
            else:  # the fixed opponent's move
                action = rules.opponent_move(opponent, game.state.game_state, pid, rng)
            if action is None:  # a conversation reached max_total_tokens, or a request was aborted
                break
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
        rival_version = None if rival is None else rival[1].newest_version()
        return [
            self._finish(seats[s], s, done, rewards, game_info or {}, opponent, rival_version) for s in sorted(seats)
        ]

    def _sampling(self, sampling: SamplingParams, rules: Any, game: Any) -> SamplingParams:
        """The move's sampling: under mask_illegal_moves, held to the legal moves of the board."""
        if not self.mask_illegal_moves:
            return sampling
        legal = [rules.move_text(c) for c in rules.legal(game.state.game_state)]
        return dataclasses.replace(sampling, grammar=legal_moves_grammar(legal)) if legal else sampling

    async def _move(self, seat: _Seat, client: Any, observation: Any, pid: int, sampling: SamplingParams) -> str | None:
        """`seat` (a trained one, or the lagged opponent's) is shown the game so far and answers
        on `client`; its move as text, or None when the game stops here (its conversation would
        pass max_total_tokens, or the request was aborted)."""
        text = observation_text(observation, player=pid)
        if seat.traj is None:
            ids = self._opening_ids(text)
            seat.traj = Trajectory(ids, [0] * len(ids), [0.0] * len(ids), [-1] * len(ids))
        else:
            more = self.turns.user_turn(text, self.turns.closed(seat.last_reply))
            if len(seat.traj.input_ids) + len(more) >= self.max_total_tokens:
                seat.cut = True
                return None
            seat.traj.append(more, generated=False)
        gen = await generate_interruptible(client, seat.traj.input_ids, sampling.for_answer(seat.index, seat.turns))
        seat.traj.append_output(gen.output_ids, gen.output_logprobs, gen.output_versions, gen.output_forced)
        seat.traj.finish_reason, seat.last_reply, seat.turns = gen.finish_reason, list(gen.output_ids), seat.turns + 1
        if gen.finish_reason == "abort":
            return None
        return str(self.tok.decode(gen.output_ids, skip_special_tokens=True)).strip()

    def _finish(
        self,
        seat: _Seat,
        pid: int,
        done: bool,
        rewards: Any,
        game_info: dict,
        opponent: str,
        rival_version: int | None = None,
    ) -> Trajectory:
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
            label = served_model(opponent) or opponent  # model:opponent -> won_vs_opponent
            metrics.update({f"{k}_vs_{label}": v for k, v in outcome.items()})
            metrics.update({f"{k}_vs_{label}_seat{pid}": v for k, v in outcome.items()})
        mine = seat.newest_version()
        if rival_version is not None:  # the lagged copy moved: which weights, how far behind the policy's
            metrics["opponent_version"] = rival_version
            if mine is not None:
                metrics["opponent_lag"] = mine - rival_version
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
        elif (opponent := self.opponents[int(ref["seed"]) % len(self.opponents)]) == "self":
            if group_size % 2:
                raise ValueError(
                    f"TextArenaSelfPlay: opponent self plays group_size/2 games of two seats; group_size {group_size} is odd"
                )
            games = [({0: j, 1: j + 1}, "self") for j in range(0, group_size, 2)]
        else:  # a fixed program or a lagged copy: the policy plays seat j % 2 of game j
            games = [({j % 2: j}, opponent) for j in range(group_size)]
        played = await asyncio.gather(
            *(
                self.play(ref, client, sampling, trained, opponent, rival_index=group_size + k)
                for k, (trained, opponent) in enumerate(games)
            )
        )
        out = [t for game in played for t in game]
        for j, t in enumerate(out):
            t.sample_id = j
            t.answer = prompt.answer
        return out
