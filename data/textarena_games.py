"""TextArena single-player games as prompt data: `textarena:<env>?size=N&seed=S`.

Why a dataset for a game: the engine's unit of work is a prompt group. Each row is one game,
named by its seed: its question is the game's opening message for that seed (what the model
is prompted with), its answer the JSON `{"textarena": env, "seed": k}` the rollout class
(workflows/rollout/textarena_game.py) resets the game with, so a group's answers all play the
same game and a resumed run plays the same games again. Rows are written once into the kit
cache, as reasoning_gym: datasets are (data/reasoning_gym.py).
"""

from __future__ import annotations

import difflib
import hashlib
import json
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


def parse_spec(spec: str) -> tuple[str, int, int]:
    """`textarena:GuessTheNumber-v0?size=500&seed=1` -> (env id, size, seed)."""
    env, _, query = str(spec)[len(SCHEME) :].partition("?")
    opts: dict[str, str] = {}
    for part in query.split("&") if query else []:
        k, sep, v = part.partition("=")
        if not sep or k not in ("size", "seed"):
            raise TextArenaError(f"{spec!r}: options are size and seed (e.g. ?size=500&seed=1)")
        opts[k] = v
    if not env:
        raise TextArenaError(f"{spec!r}: give a game, e.g. {SCHEME}GuessTheNumber-v0?size=500&seed=1")
    try:
        size, seed = int(opts.get("size", 1000)), int(opts.get("seed", 0))
    except ValueError:
        raise TextArenaError(f"{spec!r}: size and seed must be integers") from None
    if not 1 <= size <= MAX_SIZE:
        raise TextArenaError(f"{spec!r}: size must be in [1, {MAX_SIZE}]")
    return env, size, seed


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


def started(env: str) -> Any:
    """Game `env` reset for one player with seed 0 (what check_env tries)."""
    game = make_game(env)
    game.reset(num_players=1, seed=0)
    return game


def check_spec(spec: str) -> str | None:
    """What is wrong with `spec` (None: its game can be played here)."""
    try:
        return check_env(parse_spec(spec)[0])
    except TextArenaError as err:
        return str(err)


# The ChatML turn layout (data/chatml.py), re-exported: a game turn is one user turn.
END, START, user_turn_text = chatml.END, chatml.START, chatml.user_turn_text


def opening(env: str, seed: int) -> str:
    """The game's opening message for `seed` (the prompt of the row)."""
    game = make_game(env)
    game.reset(num_players=1, seed=seed)
    _, observation = game.get_observation()
    return observation_text(observation, player=0)


def observation_text(observation: Any, player: int) -> str:
    """A raw observation (messages since the last one) as one user turn: the game's messages,
    not the player's own actions (those are already the policy's tokens)."""
    if isinstance(observation, str):
        return observation.strip()
    return "\n".join(str(msg).strip() for sender, msg, *_ in observation if sender != player).strip()


def cache_path(spec: str, root: Path) -> Path:
    """Where `spec`'s rows are written under `root` (named by the spec's hash and the library's version)."""
    env, size, seed = parse_spec(spec)
    version = getattr(library(), "__version__", "")
    key = hashlib.sha256(json.dumps([env, size, seed, version]).encode()).hexdigest()[:12]
    return root / "textarena" / f"{env}-{key}.jsonl"


def materialize(spec: str, root: Path) -> Path:
    env, size, seed = parse_spec(spec)
    problem = check_env(env)
    if problem:
        raise TextArenaError(problem)
    path = cache_path(spec, root)
    if path.is_file():
        return path
    return write_jsonl((game_row(env, seed * 1_000_003 + i) for i in range(size)), path)


def sample_rows(spec: str, n: int) -> list[dict[str, Any]]:
    """The first `n` games' rows of `spec` (their openings), as `materialize` writes them, without
    writing the file (what `validate` renders to see whether the openings fit the model's context)."""
    env, size, seed = parse_spec(spec)
    problem = check_env(env)
    if problem:
        raise TextArenaError(problem)
    return [game_row(env, seed * 1_000_003 + i) for i in range(min(n, size))]


def game_row(env: str, seed: int) -> dict[str, Any]:
    """The prompt row of game `env` with `seed`: its opening as the question, where to find it as the answer."""
    return {
        "id": f"{env}-{seed}",
        "question": opening(env, seed),
        "answer": json.dumps({"textarena": env, "seed": seed}),
        "data_source": f"textarena/{env}",
    }
