"""A scripted GuessTheNumber player: the SFT teacher of the builtin game kit `tiny-guess`.

Why a kit for a game: the arithmetic kits read 256 tokens and know no English, and TextArena's
GuessTheNumber opening alone is 490 of their tokens. `tiny-guess` has a BPE trained on the game's
own text (the opening becomes ~120 tokens, a context of 512 holds a whole game) and a warm start
on games this teacher played, through the real TextArena game (textarena_games.make_game).

The teacher's moves, as the arithmetic kit's teacher answers: on a share `careful_rate` of its
moves it guesses the middle of the numbers the hints still allow (binary search wins within 5
guesses); on the others it guesses hastily: one more than its last guess, hints ignored (from 1
up, a scan that finds only targets up to 10 within the 10 guesses; a repeat is an invalid move,
which ends the game as TextArena defines). The hasty move is one number, not a spread (a spread
would leave the careful move the most likely one and greedy play careful): greedy decoding
inherits the habit, while sampled games play carefully often enough to win: the room RL has.

A conversation is laid out exactly as the TextArenaGame rollout lays out an episode: the opening
as the prompt (the chat template's user turn), each move `[k]` + <|im_end|> trained, each game
message + the next assistant header (`user_turn_text`) context.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

from areal_graph.data.datasets import format_prompt
from areal_graph.data.textarena_games import game_row, make_game, observation_text, user_turn_text

GAME = "GuessTheNumber-v0"
LOW, HIGH = 1, 20  # the game's range (TextArena's GuessTheNumber-v0)
IGNORE = -100


def row(seed: int) -> dict[str, Any]:
    """The prompt row of game `seed`, as `textarena:` datasets write it."""
    return game_row(GAME, seed)


def teacher_game(seed: int, careful_rate: float, rng: random.Random, max_turns: int = 10) -> dict[str, Any]:
    """One game played by the teacher: its row plus `messages` (assistant moves, user hints)."""
    game = make_game(GAME)
    game.reset(num_players=1, seed=seed)
    game.get_observation()
    lo, hi, last = LOW, HIGH, LOW - 1
    messages: list[dict[str, str]] = []
    for _ in range(max_turns):
        guess = (lo + hi) // 2 if rng.random() < careful_rate else last % HIGH + 1
        last = guess
        messages.append({"role": "assistant", "content": f"[{guess}]"})
        done, _ = game.step(f"[{guess}]")
        if done:
            break
        _, observation = game.get_observation()
        hint = observation_text(observation, player=0)
        messages.append({"role": "user", "content": hint})
        if re.search(r"\bhigher\b", hint):
            lo = max(lo, guess + 1)
        elif re.search(r"\blower\b", hint):
            hi = min(hi, guess - 1)
    rewards, _ = game.close()
    return {**row(seed), "messages": messages, "reward": float((rewards or {}).get(0, 0.0))}


def teacher_games(seeds: Sequence[int], careful_rate: float, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [teacher_game(s, careful_rate, rng) for s in seeds]


def encode_game(tokenizer: Any, game: dict[str, Any]) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of a teacher game, laid out as TextArenaGame lays out an episode."""
    ids = tokenizer(format_prompt(tokenizer, game["question"]), add_special_tokens=False).input_ids
    labels = [IGNORE] * len(ids)
    for message in game["messages"]:
        if message["role"] == "assistant":
            move = tokenizer(message["content"], add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
            ids, labels = ids + move, labels + move
        else:
            hint = tokenizer(user_turn_text(message["content"], closed=True), add_special_tokens=False).input_ids
            ids, labels = ids + hint, labels + [IGNORE] * len(hint)
    return ids, labels


def corpus(games: Sequence[dict[str, Any]]) -> list[str]:
    """Texts for the kit's BPE: every opening and every message, so the game's text gets merges."""
    return [text for g in games for text in [g["question"], *(m["content"] for m in g["messages"])]]
