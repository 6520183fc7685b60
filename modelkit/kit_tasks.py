"""What differs between builtin kits of different tasks: data, tokenizer text, SFT encoding, eval.

`modelkit/recipes.py` builds every kit the same way (data, tokenizer, tiny model, SFT warm
start, warm-start accuracy, kit.json) and asks the kit's task, named by `KitConfig.task`, for
the four parts that depend on it. The warm start is a list of `Lesson`s, SFT phases run in
order on one model, each with its own rows and schedule:

- "arith": multi-step arithmetic with a hasty teacher (data/arith.py), one prompt, one answer;
  with `KitConfig.habit_sft` two lessons: the method (worked solutions only), then the habit
  (the hasty mixture);
- "calc": products a tiny model cannot compute in its head, with a calculator tool and a
  teacher that uses it only some of the time (data/calc.py); its answers are episodes, so its
  SFT rows are multi-turn conversations and its warm start is evaluated through the
  calculator rollout (workflows/rollout/calculator_agent.py), as RL will run it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_graph.data import arith, calc, game_teachers, guess_teacher, tictactoe_teacher
from areal_graph.data.reasoning_gym_teacher import worked_rows
from areal_graph.engines.inference.offline_eval import evaluate_model
from areal_graph.modelkit.warm_start import SFTConfig

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class Lesson:
    """One SFT phase of a warm start: what the teacher shows (`rows`) and how (`sft`)."""

    name: str
    rows: Rows
    sft: SFTConfig


@dataclass(frozen=True)
class KitTask:
    """The task-specific steps of a kit build (each takes the KitConfig `cfg`)."""

    # cfg -> (train rows, test rows, SFT lessons in order); train/test rows are the kit's data
    rows: Callable[[Any], tuple[Rows, Rows, list[Lesson]]]
    # (train rows, every lesson's rows) -> texts the BPE is trained on
    tokenizer_texts: Callable[[Rows, Rows], Iterable[str]]
    tools: bool  # the tokenizer gets the tool-call chat template and tokens
    # (tokenizer, SFT row) -> (input_ids, labels); None: warm_start.encode_pair on question/solution
    encode: Callable[[Any, dict], tuple[list[int], list[int]]] | None
    # (model dir, test JSONL, cfg) -> evaluate_model's result dict
    evaluate: Callable[[Path, Path, Any], dict[str, Any]]
    describe: Callable[[Any], str]  # the progress line announcing the data


# ------------------------------------------------------------------------------ arith
def _arith_rows(cfg: Any) -> tuple[Rows, Rows, list[Lesson]]:
    """Without `habit_sft`, one lesson: the hasty mixture. With it, the method first (every
    solution worked out, until the model copies and computes reliably), then the habit (the
    mixture, briefly). Why two: the arithmetic is what SFT learns slowly, and hasty rows
    teach it nothing, so a single mixed lesson ended at a different point of the arithmetic's
    learning curve on every machine (worked-out accuracy 37-58% from one recipe); the habit is
    one decision at the first token and is learned in a few dozen steps."""
    train, test = arith.split(cfg.seed, cfg.n_train + cfg.n_dev, cfg.n_test, cfg.difficulty)
    train = train[cfg.n_dev :]
    return train, test, _hasty_teacher_lessons(train, cfg)


def _hasty_teacher_lessons(train: Rows, cfg: Any) -> list[Lesson]:
    """The lessons of worked rows (question, solution): the method, then the habit (the hasty
    mixture); without `habit_sft`, the mixture alone."""
    if cfg.worked_rates:  # the ladder: the method only as far as the teacher works it out
        mixture = arith.ladder_teacher(train, cfg.worked_rates, cfg.seed)
        method = [row for row, taught in zip(train, mixture) if taught["solution"] == row["solution"]]
    else:
        mixture, method = arith.teacher_mixture(train, cfg.hasty_rate, cfg.seed), train
    if cfg.habit_sft is None:
        return [Lesson("mixture", mixture, cfg.sft)]
    return [Lesson("method", method, cfg.sft), Lesson("habit", mixture, cfg.habit_sft)]


def _plain_eval(model_dir: Path, test: Path, cfg: Any) -> dict[str, Any]:
    return evaluate_model(model_dir, test, limit=cfg.eval_prompts, max_new_tokens=cfg.eval_max_new_tokens)


def _worked_texts(train: Rows, sft_rows: Rows) -> Iterable[str]:
    return (r["question"] + "\n" + r["solution"] for r in train)


ARITH = KitTask(
    rows=_arith_rows,
    tokenizer_texts=_worked_texts,
    tools=False,
    encode=None,
    evaluate=_plain_eval,
    describe=lambda cfg: (
        f"data: {cfg.n_train} train / {cfg.n_test} test problems ({cfg.difficulty}); "
        + (
            f"the SFT teacher works out {cfg.worked_rates[0]:.0%} of 1-step problems down to "
            f"{cfg.worked_rates[-1]:.1%} of {len(cfg.worked_rates)}-step ones, the rest hastily"
            if cfg.worked_rates
            else f"the SFT teacher answers {cfg.hasty_rate:.0%} of them hastily, without working"
        )
    ),
)


# ------------------------------------------------------------------------------ rg_arith
def _rg_arith_rows(cfg: Any) -> tuple[Rows, Rows, list[Lesson]]:
    """reasoning-gym's own problems (`difficulty` is the dataset query), seeds apart from the
    workflow's (1 and 2), worked out by data/reasoning_gym_teacher.py; the lessons of tiny-arith."""
    rows = worked_rows(cfg.difficulty, cfg.n_dev + cfg.n_train + cfg.n_test, 1000 + cfg.seed)
    train, test = rows[cfg.n_dev : len(rows) - cfg.n_test], rows[len(rows) - cfg.n_test :]
    return train, test, _hasty_teacher_lessons(train, cfg)


RG_ARITH = KitTask(
    rows=_rg_arith_rows,
    tokenizer_texts=_worked_texts,
    tools=False,
    encode=None,
    evaluate=_plain_eval,
    describe=lambda cfg: (
        f"data: reasoning-gym {cfg.difficulty.partition('?')[0]}, {cfg.n_train} train / "
        f"{cfg.n_test} test problems; the SFT teacher answers {cfg.hasty_rate:.0%} of them hastily"
    ),
)


# ------------------------------------------------------------------------------ calc
def _calc_rows(cfg: Any) -> tuple[Rows, Rows, list[Lesson]]:
    if cfg.habit_sft is not None:
        raise ValueError("the calc task has one lesson: habit_sft is not built for it")
    train, test = calc.split(cfg.seed, cfg.n_train + cfg.n_dev, cfg.n_test, cfg.difficulty)
    train = train[cfg.n_dev :]
    return (
        train,
        test,
        [
            Lesson(
                "conversations", calc.teacher_conversations(train, cfg.direct_rates, cfg.seed, cfg.difficulty), cfg.sft
            )
        ],
    )


def _agent_eval(model_dir: Path, test: Path, cfg: Any) -> dict[str, Any]:
    """Greedy episodes of the calculator rollout, the tool available (as RL's evaluation)."""
    from areal_graph.workflows.rollout.calculator_agent import CalculatorAgent

    agent = CalculatorAgent(str(model_dir), max_total_tokens=cfg.model.max_position_embeddings)
    return evaluate_model(
        model_dir, test, limit=cfg.eval_prompts, max_new_tokens=cfg.eval_max_new_tokens, rollout=agent
    )


def _calc_texts(train: Rows, sft_rows: Rows) -> list[str]:
    return calc.tokenizer_corpus(sft_rows)


def _calc_encode(tokenizer: Any, row: dict) -> tuple[list[int], list[int]]:
    return calc.encode_teacher_row(tokenizer, row)


CALC = KitTask(
    rows=_calc_rows,
    tokenizer_texts=_calc_texts,
    tools=True,
    encode=_calc_encode,
    evaluate=_agent_eval,
    describe=lambda cfg: (
        f"data: {cfg.n_train} train / {cfg.n_test} test products ({cfg.difficulty}); "
        f"the SFT teacher answers without the calculator at rates {list(cfg.direct_rates)} "
        "by factor size"
    ),
)


# ------------------------------------------------------------------------------ guess
def _guess_rows(cfg: Any) -> tuple[Rows, Rows, list[Lesson]]:
    """Train rows: games of seeds n_dev.. (the teacher plays them: the one lesson); test rows:
    games of seeds from 10**7 on, never played by the teacher."""
    if cfg.habit_sft is not None:
        raise ValueError("the guess task has one lesson: habit_sft is not built for it")
    seeds = range(cfg.seed * 1_000_003 + cfg.n_dev, cfg.seed * 1_000_003 + cfg.n_dev + cfg.n_train)
    games = guess_teacher.teacher_games(seeds, 1.0 - cfg.hasty_rate, cfg.seed)
    train = [{k: v for k, v in g.items() if k not in ("messages", "reward")} for g in games]
    test = [guess_teacher.row(10**7 + cfg.seed * 1_000_003 + i) for i in range(cfg.n_test)]
    return train, test, [Lesson("games", games, cfg.sft)]


def _game_eval(model_dir: Path, test: Path, cfg: Any) -> dict[str, Any]:
    """Greedy games through the TextArenaGame rollout (as RL plays them: workflows/textarena_*.yaml),
    scored by the game, an invalid move as a lost game; `by_source` has each game's share won.
    The turn limit is the longest of the kit's games' (data/game_teachers.MAX_TURNS: 10)."""
    from areal_graph.workflows.rollout.textarena_game import TextArenaGame

    game = TextArenaGame(
        str(model_dir),
        max_turns=max(game_teachers.MAX_TURNS[env] for env in game_envs(cfg)),
        max_total_tokens=cfg.model.max_position_embeddings,
        invalid_move_reward=0.0,
    )
    return evaluate_model(
        model_dir, test, limit=cfg.eval_prompts, max_new_tokens=cfg.eval_max_new_tokens, rollout=game, reward_fn="agent"
    )


def _guess_encode(tokenizer: Any, row: dict) -> tuple[list[int], list[int]]:
    return guess_teacher.encode_game(tokenizer, row)


def _guess_texts(train: Rows, sft_rows: Rows) -> list[str]:
    return guess_teacher.corpus(sft_rows)


GUESS = KitTask(
    rows=_guess_rows,
    tokenizer_texts=_guess_texts,
    tools=False,
    encode=_guess_encode,
    evaluate=_game_eval,
    describe=lambda cfg: (
        f"data: {cfg.n_train} games of TextArena's GuessTheNumber-v0 played by a teacher that "
        f"moves hastily (hints ignored) {cfg.hasty_rate:.0%} of the time; {cfg.n_test} test games"
    ),
)


# ------------------------------------------------------------------------------ games
def game_envs(cfg: Any) -> list[str]:
    """The games of a "games" kit: `difficulty` is their TextArena ids, comma-separated."""
    return [env.strip() for env in cfg.difficulty.split(",") if env.strip()]


def _games_rows(cfg: Any) -> tuple[Rows, Rows, list[Lesson]]:
    """Several games, interleaved (data/game_teachers.py), each teacher careful on its share
    `worked_rates[i]` of moves. Train rows: games of seeds n_dev..; test rows: games of seeds
    from 10**7 on, never played by the teacher (TowerOfHanoi's opening is the same for every
    seed: its test games are one game, played greedily as many times)."""
    if cfg.habit_sft is not None:
        raise ValueError("the games task has one lesson: habit_sft is not built for it")
    envs = game_envs(cfg)
    base = cfg.seed * 1_000_003
    games = game_teachers.teacher_games(
        envs, cfg.worked_rates, range(base + cfg.n_dev, base + cfg.n_dev + cfg.n_train), cfg.seed
    )
    train = [{k: v for k, v in g.items() if k not in ("messages", "reward")} for g in games]
    test = [game_teachers.game_row(envs[i % len(envs)], 10**7 + base + i) for i in range(cfg.n_test)]
    return train, test, [Lesson("games", games, cfg.sft)]


GAMES = KitTask(
    rows=_games_rows,
    tokenizer_texts=_guess_texts,
    tools=False,
    encode=_guess_encode,
    evaluate=_game_eval,
    describe=lambda cfg: (
        f"data: {cfg.n_train} games of TextArena's {', '.join(game_envs(cfg))} played by teachers "
        f"careful on {', '.join(f'{r:.0%}' for r in cfg.worked_rates)} of their moves (hasty on the rest); "
        f"{cfg.n_test} test games"
    ),
)


# ------------------------------------------------------------------------------ tictactoe
def _tictactoe_rows(cfg: Any) -> tuple[Rows, Rows, list[Lesson]]:
    """TicTacToe-v0 for two seats (data/tictactoe_teacher.py): the teacher careful on
    `worked_rates[0]` of its moves. Train rows: two-player game rows of the teacher's seeds; test
    rows: evaluation rows (data/textarena_games.eval_row), the random and the heuristic opponent
    in turn, from both seats."""
    from areal_graph.data.textarena_games import GameSpec, rows_of
    from areal_graph.data.two_player_games import TICTACTOE

    if cfg.habit_sft is not None or len(cfg.worked_rates) not in (1, 2):
        raise ValueError(
            "the tictactoe task has one lesson, a careful rate and optionally a random one "
            "(worked_rates=(careful,) or (careful, random))"
        )
    if cfg.habit not in tictactoe_teacher.HABITS:
        raise ValueError(f"the tictactoe task's habit is one of {sorted(tictactoe_teacher.HABITS)}, got {cfg.habit!r}")
    base = cfg.seed * 1_000_003
    seeds = range(base + cfg.n_dev, base + cfg.n_dev + cfg.n_train)
    careful, random_rate = (*cfg.worked_rates, 0.0)[:2]
    sides = tictactoe_teacher.teacher_games(seeds, careful, cfg.seed, cfg.habit, random_rate)
    train = rows_of(GameSpec(TICTACTOE, cfg.n_train, cfg.seed, 2), first_seed=base + cfg.n_dev)
    test = rows_of(GameSpec(TICTACTOE, cfg.n_test, cfg.seed, 2, ("random", "heuristic")), first_seed=10**7 + base)
    return train, test, [Lesson("games", sides, cfg.sft)]


def _selfplay_eval(model_dir: Path, test: Path, cfg: Any) -> dict[str, Any]:
    """Greedy games through the TextArenaSelfPlay rollout against the fixed opponents the test rows
    name, from both seats; accuracy is the share won (reward 1; a draw pays 0, a loss -1)."""
    from areal_graph.workflows.rollout.textarena_selfplay import TextArenaSelfPlay

    game = TextArenaSelfPlay(str(model_dir), max_total_tokens=cfg.model.max_position_embeddings)
    return evaluate_model(
        model_dir, test, limit=cfg.eval_prompts, max_new_tokens=cfg.eval_max_new_tokens, rollout=game, reward_fn="agent"
    )


TICTACTOE_TASK = KitTask(
    rows=_tictactoe_rows,
    tokenizer_texts=_guess_texts,
    tools=False,
    encode=_guess_encode,
    evaluate=_selfplay_eval,
    describe=lambda cfg: (
        f"data: {cfg.n_train} games of TextArena's TicTacToe-v0 (half the teacher against itself, both "
        f"seats; half against random moves) played by a teacher careful (minimax) on "
        f"{cfg.worked_rates[0]:.0%} of its moves"
        + (f", a random free cell on {cfg.worked_rates[1]:.0%}" if len(cfg.worked_rates) > 1 else "")
        + f", the {cfg.habit.replace('_', ' ')} cell on the rest; "
        f"{cfg.n_test} test games "
        "against the random and the heuristic opponent from both seats"
    ),
)

KIT_TASKS: dict[str, KitTask] = {
    "arith": ARITH,
    "rg_arith": RG_ARITH,
    "calc": CALC,
    "guess": GUESS,
    "games": GAMES,
    "tictactoe": TICTACTOE_TASK,
}


def kit_task(name: str) -> KitTask:
    if name not in KIT_TASKS:
        raise ValueError(f"unknown kit task {name!r}; known: {', '.join(KIT_TASKS)}")
    return KIT_TASKS[name]
