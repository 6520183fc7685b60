"""The game kit's teachers (data/game_teachers.py): their careful moves solve each game by a
shortest route through the real TextArena game, their hasty moves are the habit the docs describe,
and the games they play are the same for the same seed."""

from __future__ import annotations

import itertools
import random

import pytest

pytest.importorskip("textarena")

from areal_graph.data import game_teachers as gt  # noqa: E402
from areal_graph.data.textarena_games import make_game  # noqa: E402


def _play(env: str, seed: int, policy, max_turns: int = 30) -> tuple[bool, int]:
    """(won, moves) of `policy(state) -> move` in the real game."""
    game = make_game(env)
    game.reset(num_players=1, seed=seed)
    game.get_observation()
    for turn in range(1, max_turns + 1):
        done, _ = game.step(policy(game.state.game_state))
        if done:
            rewards, _ = game.close()
            return rewards[0] >= 1.0, turn
        game.get_observation()
    return False, max_turns


def _all_positions(n: int = 3):
    """Every legal Tower of Hanoi position of n disks (3**n of them)."""
    for owners in itertools.product("ABC", repeat=n):
        towers = {t: [d for d in range(n, 0, -1) if owners[d - 1] == t] for t in "ABC"}
        yield towers


def _distance(towers) -> int:
    """Shortest solution length by brute-force search, independent of hanoi_careful."""
    start = gt._hanoi_key(towers)
    goal = ((), (), (3, 2, 1))
    seen, frontier, d = {start}, [start], 0
    while goal not in seen:
        frontier = [
            nxt for key in frontier for _, _, nxt in gt._hanoi_moves(key) if nxt not in seen and not seen.add(nxt)
        ]
        d += 1
    return d


def test_hanoi_careful_solves_in_seven_moves_and_hasty_never_does():
    assert _play(gt.HANOI, 0, lambda s: gt.hanoi_careful(s["towers"])) == (True, 7)
    assert _play(gt.HANOI, 0, lambda s: gt.hanoi_hasty(s["towers"]), max_turns=14) == (False, 14)


@pytest.mark.parametrize("towers", list(_all_positions()), ids=lambda t: "".join(map(str, t.values())))
def test_hanoi_careful_move_shortens_every_position_by_one(towers):
    if towers["C"] == [3, 2, 1]:
        return
    move = gt.hanoi_careful(towers)
    src, dst = move.strip("[]").split()
    after = {t: list(v) for t, v in towers.items()}
    after[dst].append(after[src].pop())
    assert all(after[t] == sorted(after[t], reverse=True) for t in "ABC"), move
    assert _distance(after) == _distance(towers) - 1


@pytest.mark.parametrize("seed", range(40))
def test_lake_careful_reaches_the_goal_by_a_shortest_safe_path(seed):
    game = make_game(gt.FROZEN_LAKE)
    game.reset(num_players=1, seed=seed)
    grid = game.state.game_state["grid"]
    # the shortest path length, by breadth-first search written here
    dist = {(0, 0): 0}
    queue = [(0, 0)]
    for r, c in queue:
        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            nxt = (r + dr, c + dc)
            if 0 <= nxt[0] < 4 and 0 <= nxt[1] < 4 and grid[nxt[0]][nxt[1]] != "H" and nxt not in dist:
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    assert _play(gt.FROZEN_LAKE, seed, gt.lake_careful) == (True, dist[(3, 3)])


def test_lake_hasty_wins_exactly_when_the_left_column_and_bottom_row_are_clear():
    for seed in range(60):
        game = make_game(gt.FROZEN_LAKE)
        game.reset(num_players=1, seed=seed)
        grid = game.state.game_state["grid"]
        clear = all(grid[r][0] != "H" for r in range(4)) and all(grid[3][c] != "H" for c in range(4))
        assert _play(gt.FROZEN_LAKE, seed, gt.lake_hasty)[0] == clear, seed


def test_teacher_games_are_the_same_for_the_same_seed_and_mix_careful_and_hasty():
    envs, rates = [gt.HANOI, gt.FROZEN_LAKE, gt.GUESS, gt.CRYPTARITHM], (0.4, 0.3, 0.3, 0.5)
    a = gt.teacher_games(envs, rates, range(100, 180), seed=3)
    assert a == gt.teacher_games(envs, rates, range(100, 180), seed=3)
    assert [g["id"].split("-v0")[0] for g in a[:4]] == ["TowerOfHanoi", "FrozenLake", "GuessTheNumber", "Cryptarithm"]
    for env in envs:
        games = [g for g in a if g["id"].startswith(env)]
        assert all(m["role"] == ("assistant", "user")[i % 2] for g in games for i, m in enumerate(g["messages"]))
        assert all(len(g["messages"]) <= 2 * gt.MAX_TURNS[env] for g in games)
        assert 0 < sum(g["reward"] for g in games) < len(games), env  # some won, some lost
    careful = gt.teacher_games([gt.HANOI], (1.0,), range(5), seed=0)
    assert all(g["reward"] == 1.0 and len(g["messages"]) == 13 for g in careful)  # 7 moves, 6 replies


def test_one_rate_per_game():
    with pytest.raises(ValueError, match="one careful rate per game"):
        gt.teacher_games([gt.HANOI, gt.GUESS], (0.5,), range(2), seed=0)


def test_guess_teacher_here_plays_as_the_tiny_guess_teacher():
    """The GuessTheNumber teacher is data/guess_teacher.py's: the same moves for the same draws."""
    from areal_graph.data import guess_teacher

    for seed in range(20):
        ours = gt.teacher_game(gt.GUESS, seed, 0.3, random.Random(seed), 10)
        theirs = guess_teacher.teacher_game(seed, 0.3, random.Random(seed))
        assert ours["messages"] == theirs["messages"] and ours["reward"] == theirs["reward"]


def test_cryptarithm_careful_solves_send_more_money_and_the_habit_never_does():
    """Careful moves are the one solution (a check by arithmetic, independent of the game); the
    habit's two wrong letters use digits the solution leaves free, so every hasty move is legal
    and the game ends with a wrong sum, never an invalid move."""
    s = gt.SEND_MORE_MONEY
    value = {w: int("".join(str(s[ch]) for ch in w)) for w in ("SEND", "MORE", "MONEY")}
    assert value["SEND"] + value["MORE"] == value["MONEY"] and len(set(s.values())) == 8
    assert not set(gt.CRYPTARITHM_HABIT.values()) & set(s.values())
    for seed in range(3):  # every seed is the same puzzle
        won = gt.teacher_game(gt.CRYPTARITHM, seed, 1.0, random.Random(seed), gt.MAX_TURNS[gt.CRYPTARITHM])
        lost = gt.teacher_game(gt.CRYPTARITHM, seed, 0.0, random.Random(seed), gt.MAX_TURNS[gt.CRYPTARITHM])
        assert won["reward"] == 1.0 and lost["reward"] == 0.0
        moves = [m["content"] for m in lost["messages"] if m["role"] == "assistant"]
        assert moves == ["[D 3]", "[E 5]", "[M 1]", "[N 6]", "[O 0]", "[R 4]", "[S 9]", "[Y 2]"]
        assert not any("invalid" in m["content"] for m in lost["messages"])
    # careful on 30% of moves: won exactly when both habit letters were played carefully (~9%)
    games = [gt.teacher_game(gt.CRYPTARITHM, i, 0.3, random.Random(i), 8) for i in range(300)]
    rate = sum(g["reward"] for g in games) / len(games)
    assert 0.04 < rate < 0.15, rate


@pytest.mark.parametrize(
    "hand, score",
    [
        (["A♠", "K♥"], 21),
        (["A♠", "A♥", "9♦"], 21),
        (["K♠", "Q♥", "5♦"], 25),
        (["10♣", "6♦"], 16),
        (["A♦", "5♣", "9♥"], 15),
    ],
)
def test_blackjack_score_counts_as_the_game_does(hand, score):
    assert gt.blackjack_score(hand) == score
    assert make_game(gt.BLACKJACK)._hand_score(hand) == score  # the game's own count agrees


def _hands_won(policy, seeds, careful_rate: float = 1.0) -> float:
    """Share of Blackjack hands won over games of `seeds`, `policy` on `careful_rate` of moves and
    hitting on the rest, read off the game's own tally."""
    rng, won, hands = random.Random(0), 0, 0
    for seed in seeds:
        game = make_game(gt.BLACKJACK)
        game.reset(num_players=1, seed=seed)
        game.get_observation()
        for _ in range(60):
            state = game.state.game_state
            done, _ = game.step(policy(state) if rng.random() < careful_rate else gt.blackjack_hasty(state))
            if done:
                break
            game.get_observation()
        assert done, "a game of five hands ends within 60 moves"
        tally = game.state.game_state["results_summary"]
        won, hands = won + tally["win"], hands + sum(tally.values())
    return won / hands


def test_blackjack_basic_strategy_wins_about_42_percent_and_the_habit_busts_every_hand():
    """Careful play is basic strategy (~42% of hands in this game's rules: infinite deck, dealer
    draws to 17, no doubling); the habit (hit) never stands, so it loses every hand; the teacher's
    mix (careful on 40% of moves) wins about 22%: the room RL has. A threshold rule written here
    (stand on 17 or more) sits between them, as it should."""
    seeds = range(600)
    careful = _hands_won(gt.blackjack_careful, seeds)
    assert 0.38 < careful < 0.47, careful
    assert _hands_won(gt.blackjack_careful, range(50), careful_rate=0.0) == 0.0
    mixed = _hands_won(gt.blackjack_careful, seeds, careful_rate=0.4)
    assert 0.17 < mixed < 0.28, mixed
    threshold = _hands_won(lambda s: "[Stand]" if gt.blackjack_score(s["player_hand"]) >= 17 else "[Hit]", seeds)
    assert mixed < threshold <= careful + 0.02, (threshold, careful)
    # a teacher game is the same for the same seed (the deck is seeded by the game's reset)
    a, b = (gt.teacher_game(gt.BLACKJACK, 3, 0.4, random.Random(1), 20) for _ in range(2))
    assert a["messages"] == b["messages"]
