"""Scripted players of single-player TextArena games: the SFT teachers of the builtin kit `tiny-games`.

Each teacher knows two moves in every position, as the arithmetic kits' teacher knows two ways to
answer: a *careful* one (a solver: the first move of a shortest solution from where the game
stands) and a *hasty* one (a fixed habit that ignores what the game says). On a share
`careful_rate` of its moves it plays carefully, on the rest hastily. Greedy decoding of the warm
start inherits the habit (the more likely move in every position), while sampled games play
carefully often enough to win: the room RL has, and the habit it must unlearn from the games'
rewards alone (data/guess_teacher.py for GuessTheNumber, whose teacher this generalises).

- TowerOfHanoi-v0 (3 disks, 14 turns): careful = the first move of a shortest solution from the
  current towers (a breadth-first search over the 27 positions); hasty = move the smallest disk
  one tower on (A to B, B to C, C to A), which never solves the puzzle alone.
- FrozenLake-v0 (4x4, 3 holes, start top left, goal bottom right): careful = the first move of a
  shortest safe path; hasty = down to the bottom row, then right, holes ignored, which wins only
  on maps whose left column and bottom row are clear (about a quarter of them).
- Cryptarithm-v0 (SEND + MORE = MONEY, every seed): the teacher assigns the letters in
  alphabetical order, D E M N O R S Y, the order the game lists its mapping in, so the next letter
  follows the last one listed (in order of first appearance, the 0.9M-parameter warm start lost
  count and played S twice); careful = the letter's digit in the one solution; hasty = the same,
  except two letters it gets wrong by habit (D 3, R 4: digits the solution leaves free, so the
  game never sees an invalid move, only a wrong sum at the end).
- Blackjack-v0 (5 hands against a dealer who draws to 17, an infinite deck; the game's reward is
  the share of hands won): careful = basic strategy on the score the game shows and the dealer's
  card (stand on 17 or more, on 13-16 against a dealer's 2-6, on 12 against 4-6; else hit), which
  wins about 42% of hands; hasty = hit, whatever the score, which busts every hand it plays alone.
  Mixed (careful on 40% of moves) the teacher wins about 22% of hands: what RL has to raise.
- GuessTheNumber-v0: data/guess_teacher.py's teacher (bisect, or one more than the last guess).

The teachers read the game's own state (`game.state.game_state`) and play through the real
TextArena game, so their conversations are laid out exactly as the TextArenaGame rollout lays out
an episode (`guess_teacher.encode_game`).
"""

from __future__ import annotations

import random
import re
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from areal_graph.data.textarena_games import game_row, make_game, observation_text

Towers = dict[str, list[int]]

HANOI = "TowerOfHanoi-v0"
FROZEN_LAKE = "FrozenLake-v0"
GUESS = "GuessTheNumber-v0"
CRYPTARITHM = "Cryptarithm-v0"
BLACKJACK = "Blackjack-v0"


# ------------------------------------------------------------------------------ TowerOfHanoi
def _hanoi_key(towers: Towers) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(towers[t]) for t in "ABC")


def _hanoi_moves(key: tuple[tuple[int, ...], ...]) -> list[tuple[str, str, tuple[tuple[int, ...], ...]]]:
    """Every legal move from `key`, in a fixed order, with the position it leads to."""
    out = []
    for i, src in enumerate("ABC"):
        if not key[i]:
            continue
        disk = key[i][-1]
        for j, dst in enumerate("ABC"):
            if i != j and (not key[j] or key[j][-1] > disk):
                towers = [list(t) for t in key]
                towers[j].append(towers[i].pop())
                out.append((src, dst, tuple(tuple(t) for t in towers)))
    return out


def hanoi_careful(towers: Towers) -> str:
    """The first move of a shortest solution from `towers` (all disks onto C, largest at the bottom)."""
    start = _hanoi_key(towers)
    n = sum(len(t) for t in start)
    goal = ((), (), tuple(range(n, 0, -1)))
    first: dict[Any, str | None] = {start: None}
    queue = deque([start])
    while queue:
        key = queue.popleft()
        if key == goal:
            break
        for src, dst, nxt in _hanoi_moves(key):
            if nxt not in first:
                first[nxt] = first[key] or f"[{src} {dst}]"
                queue.append(nxt)
    return first.get(goal) or "[A C]"


def hanoi_hasty(towers: Towers) -> str:
    """Move the smallest disk one tower on (A -> B -> C -> A): always legal, never a solution."""
    src = next(t for t in "ABC" if towers[t] and towers[t][-1] == 1)
    return f"[{src} {'ABC'[('ABC'.index(src) + 1) % 3]}]"


# ------------------------------------------------------------------------------ FrozenLake
STEPS = {"down": (1, 0), "right": (0, 1), "up": (-1, 0), "left": (0, -1)}


def lake_careful(state: dict[str, Any]) -> str:
    """The first move of a shortest path from the player to the goal that steps on no hole."""
    grid, start, goal = state["grid"], tuple(state["player_pos"]), tuple(state["goal_pos"])
    size = len(grid)
    first: dict[tuple[int, int], str | None] = {start: None}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if (r, c) == goal:
            break
        for name, (dr, dc) in STEPS.items():
            nr, nc = r + dr, c + dc
            if 0 <= nr < size and 0 <= nc < size and grid[nr][nc] != "H" and (nr, nc) not in first:
                first[(nr, nc)] = first[(r, c)] or f"[{name}]"
                queue.append((nr, nc))
    return first.get(goal) or "[down]"


def lake_hasty(state: dict[str, Any]) -> str:
    """Down to the bottom row, then right: the shape of a path, holes ignored."""
    return "[down]" if state["player_pos"][0] < len(state["grid"]) - 1 else "[right]"


# ------------------------------------------------------------------------------ Cryptarithm
# TextArena's Cryptarithm-v0 is SEND + MORE = MONEY for every seed; its one solution.
SEND_MORE_MONEY = {"S": 9, "E": 5, "N": 6, "D": 7, "M": 1, "O": 0, "R": 8, "Y": 2}
# The hasty habit: two letters given digits the solution leaves free (3 and 4), so that every
# move is legal and the mistake shows only when the last letter is mapped.
CRYPTARITHM_HABIT = {"D": 3, "R": 4}


class _Cryptarithm:
    """Assigns the letters in alphabetical order; remembers which it has assigned."""

    def __init__(self) -> None:
        self.done: list[str] = []

    def _next(self) -> str:
        return next(letter for letter in sorted(SEND_MORE_MONEY) if letter not in self.done)

    def careful(self, _state: dict[str, Any]) -> str:
        letter = self._next()
        return f"[{letter} {SEND_MORE_MONEY[letter]}]"

    def hasty(self, _state: dict[str, Any]) -> str:
        letter = self._next()
        return f"[{letter} {CRYPTARITHM_HABIT.get(letter, SEND_MORE_MONEY[letter])}]"

    def observe(self, move: str, hint: str) -> None:
        self.done.append(move.strip("[]").split()[0])


# ------------------------------------------------------------------------------ Blackjack
def blackjack_score(hand: Sequence[str]) -> int:
    """A hand's points as the game counts them (J/Q/K 10, an ace 11 unless that busts it)."""
    total, aces = 0, 0
    for card in hand:
        rank = card[:-1]
        if rank == "A":
            total, aces = total + 11, aces + 1
        else:
            total += 10 if rank in ("J", "Q", "K") else int(rank)
    while total > 21 and aces:
        total, aces = total - 10, aces - 1
    return total


def blackjack_careful(state: dict[str, Any]) -> str:
    """Basic strategy on the hand's score and the dealer's up card (no doubling or splitting here)."""
    score = blackjack_score(state["player_hand"])
    up = min(blackjack_score(state["dealer_hand"][:1]), 11)
    if score >= 17 or (13 <= score <= 16 and up <= 6) or (score == 12 and 4 <= up <= 6):
        return "[Stand]"
    return "[Hit]"


def blackjack_hasty(_state: dict[str, Any]) -> str:
    """Hit, whatever the score: the habit busts every hand it plays alone."""
    return "[Hit]"


# ------------------------------------------------------------------------------ GuessTheNumber
class _Bisect:
    """GuessTheNumber's teacher state: the range the hints allow and the last guess."""

    def __init__(self) -> None:
        self.lo, self.hi, self.last = 1, 20, 0

    def careful(self, _state: dict[str, Any]) -> str:
        return f"[{(self.lo + self.hi) // 2}]"

    def hasty(self, _state: dict[str, Any]) -> str:
        return f"[{self.last % 20 + 1}]"

    def observe(self, move: str, hint: str) -> None:
        guess = int(move.strip("[]"))
        self.last = guess
        if re.search(r"\bhigher\b", hint):
            self.lo = max(self.lo, guess + 1)
        elif re.search(r"\blower\b", hint):
            self.hi = min(self.hi, guess - 1)


class _Stateless:
    """A teacher whose two moves are functions of the game's state alone."""

    def __init__(self, careful: Callable[[Any], str], hasty: Callable[[Any], str], view: Callable[[Any], Any]):
        self._careful, self._hasty, self._view = careful, hasty, view

    def careful(self, state: dict[str, Any]) -> str:
        return self._careful(self._view(state))

    def hasty(self, state: dict[str, Any]) -> str:
        return self._hasty(self._view(state))

    def observe(self, move: str, hint: str) -> None:
        pass


TEACHERS: dict[str, Callable[[], Any]] = {
    HANOI: lambda: _Stateless(hanoi_careful, hanoi_hasty, lambda s: s["towers"]),
    FROZEN_LAKE: lambda: _Stateless(lake_careful, lake_hasty, lambda s: s),
    GUESS: _Bisect,
    CRYPTARITHM: _Cryptarithm,
    BLACKJACK: lambda: _Stateless(blackjack_careful, blackjack_hasty, lambda s: s),
}


def teacher_game(env: str, seed: int, careful_rate: float, rng: random.Random, max_turns: int) -> dict[str, Any]:
    """One game of `env` played by its teacher: its row plus `messages` (assistant moves, user
    turns) and the game's `reward`."""
    teacher = TEACHERS[env]()
    game = make_game(env)
    game.reset(num_players=1, seed=seed)
    game.get_observation()
    messages: list[dict[str, str]] = []
    for _ in range(max_turns):
        state = game.state.game_state
        move = teacher.careful(state) if rng.random() < careful_rate else teacher.hasty(state)
        messages.append({"role": "assistant", "content": move})
        done, _ = game.step(move)
        if done:
            break
        _, observation = game.get_observation()
        text = observation_text(observation, player=0)
        teacher.observe(move, text)
        messages.append({"role": "user", "content": text})
    rewards, _ = game.close()
    won = bool(done) and float((rewards or {}).get(0, 0.0)) >= 1.0
    return {**game_row(env, seed), "messages": messages, "reward": 1.0 if won else 0.0}


# The most moves a teacher game lasts (the optimal games take 7, 6, up to 5 and 8): long enough
# for hasty games to lose by the rules, short enough for a whole game to fit the kit's context.
# (Cryptarithm ends when its eighth letter is mapped; Blackjack's five hands take about 12 moves
# as the teacher plays them, and a hand of hits alone lasts at most 8.)
MAX_TURNS = {HANOI: 10, FROZEN_LAKE: 8, GUESS: 10, CRYPTARITHM: 8, BLACKJACK: 20}


def teacher_games(
    envs: Sequence[str], careful_rates: Sequence[float], seeds: Sequence[int], seed: int
) -> list[dict[str, Any]]:
    """Games for every seed, the envs interleaved (game i plays envs[i % len(envs)], its teacher
    careful on careful_rates[i % len(envs)] of its moves)."""
    if len(careful_rates) != len(envs):
        raise ValueError(f"one careful rate per game: {len(careful_rates)} rates for {len(envs)} games")
    rng = random.Random(seed)
    n = len(envs)
    return [
        teacher_game(envs[i % n], s, careful_rates[i % n], rng, MAX_TURNS[envs[i % n]]) for i, s in enumerate(seeds)
    ]
