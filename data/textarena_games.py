"""TextArena games as prompt data: `textarena:<env>?size=N&seed=S[&players=2[&opponents=random,heuristic]]`.

Why a dataset for a game: the engine's unit of work is a prompt group. Each row is one game,
named by its seed: its question is the game's opening message for that seed (what the model
is prompted with), its answer the JSON `{"textarena": env, "seed": k}` the rollout class
(workflows/rollout/textarena_game.py) resets the game with, so a group's answers all play the
same game and a resumed run plays the same games again. Rows are written once into the kit
cache, as reasoning_gym: datasets are (data/reasoning_gym.py).

`players=2` makes rows of a two-player game (data/two_player_games.py) for the self-play rollout
(workflows/rollout/textarena_selfplay.py): the question is seat 0's opening, the answer adds
`"players": 2`. `opponents=random,heuristic` makes evaluation rows: row i plays opponent
i mod len(opponents) from seat (i // len(opponents)) mod 2, named in its answer, whatever the
rollout's own opponent is; so an evaluation set covers every opponent from both seats.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_graph.data import chatml
from areal_graph.data.arith import write_jsonl

SCHEME = "textarena:"
PIP = "pip install 'textarena==0.7.4'"
MAX_SIZE = 100_000


class TextArenaError(ValueError):
    """A textarena: spec that cannot be served."""


def library() -> Any:
    try:
        import textarena
    except ImportError:
        raise TextArenaError(f"textarena: games need the textarena package: {PIP}") from None
    return textarena


@dataclass(frozen=True)
class GameSpec:
    env: str
    size: int
    seed: int
    players: int = 1
    opponents: tuple[str, ...] = ()


OPTIONS = ("size", "seed", "players", "opponents")


def parse_spec(spec: str) -> GameSpec:
    """`textarena:GuessTheNumber-v0?size=500&seed=1` -> GameSpec("GuessTheNumber-v0", 500, 1)."""
    from areal_graph.data.two_player_games import FIXED_OPPONENTS

    env, _, query = str(spec)[len(SCHEME) :].partition("?")
    opts: dict[str, str] = {}
    for part in query.split("&") if query else []:
        k, sep, v = part.partition("=")
        if not sep or k not in OPTIONS:
            raise TextArenaError(f"{spec!r}: options are {', '.join(OPTIONS)} (e.g. ?size=500&seed=1)")
        opts[k] = v
    if not env:
        raise TextArenaError(f"{spec!r}: give a game, e.g. {SCHEME}GuessTheNumber-v0?size=500&seed=1")
    try:
        size, seed, players = int(opts.get("size", 1000)), int(opts.get("seed", 0)), int(opts.get("players", 1))
    except ValueError:
        raise TextArenaError(f"{spec!r}: size, seed and players must be integers") from None
    if not 1 <= size <= MAX_SIZE:
        raise TextArenaError(f"{spec!r}: size must be in [1, {MAX_SIZE}]")
    if players not in (1, 2):
        raise TextArenaError(f"{spec!r}: players must be 1 or 2 (self-play plays two seats), not {players}")
    opponents = tuple(o.strip() for o in opts.get("opponents", "").split(",") if o.strip())
    wrong = [o for o in opponents if o not in FIXED_OPPONENTS]
    if wrong:
        raise TextArenaError(f"{spec!r}: opponents are {', '.join(FIXED_OPPONENTS)}, not {', '.join(wrong)}")
    if opponents and players != 2:
        raise TextArenaError(f"{spec!r}: opponents are for two-player games: add &players=2")
    return GameSpec(env, size, seed, players, opponents)


def make_game(env: str) -> Any:
    """A fresh game `env` without TextArena's observation wrappers: each observation is then the
    messages since the last one, which is what a conversation appends."""
    from textarena.envs.registration import ENV_REGISTRY

    return library().make(env + "-raw" if env + "-raw" in ENV_REGISTRY else env)


def check_env(env: str) -> str | None:
    """What is wrong with game id `env` (None: a single-player game that starts here). A game that
    does not start is named for why (multi-player, a package, NLTK data, an API key, a bug in
    textarena: data/textarena_start.py), and the games recommended are ones that start."""
    from areal_graph.data import textarena_start

    try:
        library()
    except TextArenaError as err:
        return str(err)
    from textarena.envs.registration import ENV_REGISTRY

    if env not in ENV_REGISTRY:
        near = difflib.get_close_matches(env, textarena_start.PLAYABLE_GAMES, n=3)
        return (
            f"textarena has no game {env!r}"
            + (f" (did you mean {', '.join(map(repr, near))}?)" if near else "")
            + f"; {textarena_start.playable_hint()}"
        )
    failure = textarena_start.try_start(lambda: started(env))
    return None if failure is None else textarena_start.describe(env, failure)


def started(env: str, players: int = 1) -> Any:
    """Game `env` reset for `players` seats with seed 0 (what check_env tries)."""
    game = make_game(env)
    game.reset(num_players=players, seed=0)
    return game


def check_two_player_env(env: str) -> str | None:
    """What is wrong with game id `env` for two-seat play (None: built here, and it starts)."""
    from areal_graph.data import textarena_start
    from areal_graph.data.two_player_games import check_two_player

    try:
        library()
    except TextArenaError as err:
        return str(err)
    problem = check_two_player(env, 2)
    if problem:
        return problem
    failure = textarena_start.try_start(lambda: started(env, players=2), players=2)
    return None if failure is None else textarena_start.describe(env, failure)


def check_spec(spec: str) -> str | None:
    """What is wrong with `spec` (None: its game can be played here)."""
    try:
        game = parse_spec(spec)
        return check_env(game.env) if game.players == 1 else check_two_player_env(game.env)
    except TextArenaError as err:
        return str(err)


# The ChatML turn layout (data/chatml.py), re-exported: a game turn is one user turn.
END, START, user_turn_text = chatml.END, chatml.START, chatml.user_turn_text


def opening(env: str, seed: int, players: int = 1) -> str:
    """The game's opening message for `seed` (the prompt of the row): seat 0's."""
    game = make_game(env)
    game.reset(num_players=players, seed=seed)
    _, observation = game.get_observation()
    return observation_text(observation, player=0)


def observation_text(observation: Any, player: int) -> str:
    """A raw observation (messages since the last one) as one user turn: the game's messages,
    not the player's own actions (those are already the policy's tokens)."""
    if isinstance(observation, str):
        return observation.strip()
    return "\n".join(str(msg).strip() for sender, msg, *_ in observation if sender != player).strip()


def seat_reward(rewards: Any, seat: int) -> float | None:
    """The reward `game.close()` gave `seat`, or None where it gave none that is a number.

    Some textarena 0.7.4 games pass their arguments to `set_invalid_move` in the wrong order, so
    a game an invalid move ended can "reward" the player with the reason's text (Cryptarithm-v0:
    {0: 'Bad action format. Use `[A 5]`.'}); the caller treats that game as ended by the move."""
    value = (rewards or {}).get(seat)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def cache_path(spec: str, root: Path) -> Path:
    """Where `spec`'s rows are written under `root` (named by the spec's hash and the library's version)."""
    game = parse_spec(spec)
    version = getattr(library(), "__version__", "")
    fields = [game.env, game.size, game.seed, version]
    if game.players != 1:  # single-player rows keep the names they had
        fields += [game.players, list(game.opponents)]
    key = hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:12]
    return root / "textarena" / f"{game.env}-{key}.jsonl"


def _checked(spec: str) -> GameSpec:
    problem = check_spec(spec)
    if problem:
        raise TextArenaError(problem)
    return parse_spec(spec)


def rows_of(game: GameSpec, first_seed: int | None = None) -> list[dict[str, Any]]:
    """The `game.size` rows of `game`, as `materialize` writes them (a kit's data: `first_seed`
    replaces the spec's seed * 1_000_003)."""
    return _rows(game, game.size, first_seed)


def _rows(game: GameSpec, n: int, first_seed: int | None = None) -> list[dict[str, Any]]:
    first = game.seed * 1_000_003 if first_seed is None else first_seed
    rows = []
    for i in range(n):
        row = game_row(game.env, first + i, game.players)
        if game.opponents:
            k = len(game.opponents)
            row = eval_row(row, game.opponents[i % k], (i // k) % 2)
        rows.append(row)
    return rows


def materialize(spec: str, root: Path) -> Path:
    game = _checked(spec)
    path = cache_path(spec, root)
    if path.is_file():
        return path
    return write_jsonl(_rows(game, game.size), path)


def sample_rows(spec: str, n: int) -> list[dict[str, Any]]:
    """The first `n` games' rows of `spec` (their openings), as `materialize` writes them, without
    writing the file (what `validate` renders to see whether the openings fit the model's context)."""
    game = _checked(spec)
    return _rows(game, min(n, game.size))


def game_row(env: str, seed: int, players: int = 1) -> dict[str, Any]:
    """The prompt row of game `env` with `seed`: its opening as the question, where to find it as the answer."""
    answer: dict[str, Any] = {"textarena": env, "seed": seed}
    if players != 1:
        answer["players"] = players
    return {
        "id": f"{env}-{seed}",
        "question": opening(env, seed, players),
        "answer": json.dumps(answer),
        "data_source": f"textarena/{env}",
    }


def eval_row(row: dict[str, Any], opponent: str, seat: int) -> dict[str, Any]:
    """A two-player row that plays `opponent` from `seat`, whatever the rollout's own opponent."""
    answer = {**json.loads(row["answer"]), "opponent": opponent, "seat": seat}
    return {**row, "id": f"{row['id']}-{opponent}-seat{seat}", "answer": json.dumps(answer)}
