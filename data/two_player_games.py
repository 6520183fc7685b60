"""Two-player TextArena games the self-play rollout plays (workflows/rollout/textarena_selfplay.py):
what a game's state allows, and the fixed opponents that play a seat as a program.

A two-player game is built here when we can read its legal moves from the game's own state, so
that a fixed opponent (and the tests) never guess from text. TicTacToe-v0 is the one built: its
whole game fits a tiny model's context (about 600 tokens a seat). Other games are refused by name
at validation, saying why (more than two seats, or not built yet).

Opponents:
- `random`: a legal move drawn uniformly, from a generator seeded by the game (reproducible).
- `heuristic`: the move a careful casual player makes: win now if it can, else block the other
  seat's win, else the centre, else a corner, else any side (ties drawn by the seeded generator).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TICTACTOE = "TicTacToe-v0"
FIXED_OPPONENTS = ("random", "heuristic")
# "self": every seat is the policy, every seat trained; the others play one seat by program
OPPONENTS = ("self", *FIXED_OPPONENTS)

# TicTacToe's eight lines of three cells (rows, columns, diagonals), cells numbered 0-8 row by row
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


def tictactoe_cells(state: dict[str, Any]) -> list[str]:
    """The board as 9 cells, row by row: 'O' (seat 0), 'X' (seat 1) or '' (free)."""
    return [cell for row in state["board"] for cell in row]


def tictactoe_mark(seat: int) -> str:
    return "X" if seat == 1 else "O"


def tictactoe_legal(state: dict[str, Any]) -> list[int]:
    return [i for i, cell in enumerate(tictactoe_cells(state)) if not cell]


def _completes(cells: list[str], mark: str) -> list[int]:
    """Free cells that would give `mark` three in a row."""
    out = []
    for line in LINES:
        marks = [cells[i] for i in line]
        if marks.count(mark) == 2 and marks.count("") == 1:
            out.append(line[marks.index("")])
    return sorted(set(out))


def tictactoe_heuristic(state: dict[str, Any], seat: int, rng: random.Random) -> int:
    """Win, else block, else the centre, else a corner, else a side."""
    cells = tictactoe_cells(state)
    mine, theirs = tictactoe_mark(seat), tictactoe_mark(1 - seat)
    for choice in (_completes(cells, mine), _completes(cells, theirs)):
        if choice:
            return rng.choice(choice)
    if not cells[4]:
        return 4
    for group in ((0, 2, 6, 8), (1, 3, 5, 7)):
        free = [i for i in group if not cells[i]]
        if free:
            return rng.choice(free)
    raise ValueError("tictactoe_heuristic: the board is full")


@dataclass(frozen=True)
class TwoPlayerGame:
    """What the self-play rollout needs of a game: its legal moves and its heuristic player, both
    read from the game's state (`game.state.game_state`), and how a move is written."""

    legal: Callable[[dict[str, Any]], list[int]]
    heuristic: Callable[[dict[str, Any], int, random.Random], int]
    move_text: Callable[[int], str]

    def opponent_move(self, opponent: str, state: dict[str, Any], seat: int, rng: random.Random) -> str:
        if opponent == "random":
            return self.move_text(rng.choice(self.legal(state)))
        if opponent == "heuristic":
            return self.move_text(self.heuristic(state, seat, rng))
        raise ValueError(f"{opponent!r} is not a fixed opponent (those are {', '.join(FIXED_OPPONENTS)})")


TWO_PLAYER_GAMES: dict[str, TwoPlayerGame] = {
    TICTACTOE: TwoPlayerGame(tictactoe_legal, tictactoe_heuristic, lambda cell: f"[{cell}]"),
}


def two_player_game(env: str) -> TwoPlayerGame:
    if env not in TWO_PLAYER_GAMES:
        raise ValueError(not_built(env))
    return TWO_PLAYER_GAMES[env]


def not_built(env: str) -> str:
    return (
        f"textarena game {env!r} is not built for two-seat play here; the games built are "
        f"{', '.join(TWO_PLAYER_GAMES)} (a game is built when its legal moves can be read from its "
        "state: data/two_player_games.py)"
    )


def check_two_player(env: str, players: int) -> str | None:
    """What is wrong with playing `env` with `players` seats here (None: nothing)."""
    if players != 2:
        return f"textarena game {env!r}: players={players}; self-play plays two seats (players=2)"
    if env not in TWO_PLAYER_GAMES:
        return not_built(env)
    return None
