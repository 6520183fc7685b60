"""The SFT teacher of the builtin kit `tiny-tictactoe`: TicTacToe-v0 games, each seat's side laid out
exactly as the self-play rollout (workflows/rollout/textarena_selfplay.py) lays out a seat's
conversation, so the warm start knows the board's text and the move format from both seats.

As the other game teachers (data/game_teachers.py), it knows two moves in every position: a
*careful* one (perfect play: the best move by minimax, ties to the centre, then corners) and a
*hasty* one (a habit, `habit` of the recipe: the kit's is the last free cell in reading order,
the last move the game's "Available Moves" line lists). On a share `careful_rate` of its moves it plays carefully. Greedy play of the
warm start inherits the habit; sampled play is careful often enough to win where the habit loses,
which is the room self-play has.

Why the *last* free cell: it is the text just before the seat's turn, so a tiny model copies it
reliably. The first free cell (the habit of an earlier kit) sits mid-line, and a 4-layer model
learned a shortcut for it instead (its own previous move plus one, which the habit's own games
always agree with): a third of its greedy games ended on a second refused move.

A teacher game is the teacher against itself (both seats recorded) or against a uniformly random
player (the teacher's seat recorded), half each, so the warm start has seen both kinds of
opponent and positions off its own habit's path.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from typing import Any

from areal_graph.data.textarena_games import game_row, make_game, observation_text
from areal_graph.data.two_player_games import LINES, TICTACTOE, tictactoe_cells, tictactoe_legal, tictactoe_mark

_PREFERENCE = (4, 0, 2, 6, 8, 1, 3, 5, 7)  # ties: the centre, the corners, the sides


def _winner(cells: tuple[str, ...]) -> str:
    for a, b, c in LINES:
        if cells[a] and cells[a] == cells[b] == cells[c]:
            return cells[a]
    return ""


@functools.cache
def _value(cells: tuple[str, ...], mark: str) -> int:
    """The game's value for the side to move (`mark`) under perfect play: 1 win, 0 draw, -1 loss."""
    other = "X" if mark == "O" else "O"
    if _winner(cells):
        return -1  # the side that just moved won
    free = [i for i in range(9) if not cells[i]]
    if not free:
        return 0
    return max(-_value(cells[:i] + (mark,) + cells[i + 1 :], other) for i in free)


def careful(state: dict[str, Any], seat: int) -> int:
    """A move of perfect play (minimax), ties broken by _PREFERENCE."""
    cells, mark = tuple(tictactoe_cells(state)), tictactoe_mark(seat)
    other = tictactoe_mark(1 - seat)
    free = [i for i in _PREFERENCE if not cells[i]]
    return max(free, key=lambda i: -_value(cells[:i] + (mark,) + cells[i + 1 :], other))


def first_free(state: dict[str, Any], seat: int) -> int:
    """A habit: the first free cell in reading order."""
    return tictactoe_legal(state)[0]


def last_free(state: dict[str, Any], seat: int) -> int:
    """A habit: the last free cell in reading order (the kit's)."""
    return tictactoe_legal(state)[-1]


HABITS: dict[str, Callable[[dict[str, Any], int], int]] = {"first_free": first_free, "last_free": last_free}


def teacher_game(
    seed: int,
    careful_rate: float,
    rng: random.Random,
    against: str,
    habit: str = "last_free",
    random_rate: float = 0.0,
) -> list[dict[str, Any]]:
    """One game; `against` is "self" (the teacher plays both seats; both are returned) or "random"
    (the teacher plays seat seed % 2). Each returned seat is a row plus `messages` (its moves as
    assistant turns, what the game says after each as user turns), its `seat` and `reward`
    (1 won, 0 drawn, -1 lost)."""
    game = make_game(TICTACTOE)
    game.reset(num_players=2, seed=seed)
    teacher_seats = (0, 1) if against == "self" else (seed % 2,)
    sides: dict[int, dict[str, Any]] = {s: {"question": None, "messages": []} for s in teacher_seats}
    done = False
    while not done:
        pid, observation = game.get_observation()
        state = game.state.game_state
        if pid in sides:
            text = observation_text(observation, player=pid)
            side = sides[pid]
            if side["question"] is None:
                side["question"] = text
            else:
                side["messages"].append({"role": "user", "content": text})
            u = rng.random()
            if u < careful_rate:
                cell = careful(state, pid)
            elif u < careful_rate + random_rate:  # any free cell: the warm start learns every legal move
                cell = rng.choice(tictactoe_legal(state))
            else:
                cell = HABITS[habit](state, pid)
            side["messages"].append({"role": "assistant", "content": f"[{cell}]"})
        else:
            cell = rng.choice(tictactoe_legal(state))
        done, _ = game.step(f"[{cell}]")
    rewards, _ = game.close()
    row = game_row(TICTACTOE, seed, players=2)
    return [
        {**row, "question": side["question"], "messages": side["messages"], "seat": s, "reward": float(rewards[s])}
        for s, side in sides.items()
    ]


def teacher_games(
    seeds: Sequence[int], careful_rate: float, seed: int, habit: str, random_rate: float = 0.0
) -> list[dict[str, Any]]:
    """Games for every seed: even-numbered ones the teacher against itself, odd ones against random."""
    rng = random.Random(seed)
    against = ("self", "random")
    return [
        side
        for i, s in enumerate(seeds)
        for side in teacher_game(s, careful_rate, rng, against[i % 2], habit, random_rate)
    ]
