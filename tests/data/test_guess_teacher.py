"""The game kit's teacher (data/guess_teacher.py): its moves are what it says (the scan when hasty,
bisection when careful, checked against the game's own target), and its SFT conversations are
laid out token for token as the TextArenaGame rollout lays out the same game played through it."""

from __future__ import annotations

import asyncio
import json

import pytest

from areal_graph.api.sampling import GenerationResult, SamplingParams
from areal_graph.data import guess_teacher
from areal_graph.engines.inference.rollout_eval import LocalEngineClient
from support.ci import optional


@pytest.fixture(scope="module")
def ta():
    return optional("textarena", "pip install 'textarena==0.7.4' (in the dev extra)")


def target_of(seed: int) -> int:
    game = guess_teacher.make_game(guess_teacher.GAME)
    game.reset(num_players=1, seed=seed)
    return int(game.state.game_state["game_number"])


@pytest.mark.parametrize("seed", [0, 1])
def test_hasty_is_the_scan_and_careful_is_bisection(ta, seed):
    seeds = range(seed * 100, seed * 100 + 40)
    hasty = guess_teacher.teacher_games(seeds, 0.0, seed)
    careful = guess_teacher.teacher_games(seeds, 1.0, seed)
    for s, h, c in zip(seeds, hasty, careful):
        target = target_of(s)
        moves = [int(m["content"][1:-1]) for m in h["messages"] if m["role"] == "assistant"]
        assert moves == list(range(1, len(moves) + 1))  # 1, 2, 3, ... whatever the hints say
        assert (h["reward"] == 1.0) == (target <= 10) and (moves[-1] == target) == (target <= 10)
        assert c["reward"] == 1.0 and len([m for m in c["messages"] if m["role"] == "assistant"]) <= 5
        assert json.loads(c["answer"]) == {"textarena": guess_teacher.GAME, "seed": s}
    mixed = guess_teacher.teacher_games(seeds, 0.3, seed)
    wins = [sum(g["reward"] == 1.0 for g in games) for games in (hasty, mixed, careful)]
    assert wins[0] < wins[1] < wins[2] == 40


class ReplayMoves(LocalEngineClient):
    """A scripted policy that makes the teacher's moves, one per call."""

    def __init__(self, tok, moves: list[str]) -> None:
        super().__init__(engine=None)
        self.outputs = [tok.encode(m, add_special_tokens=False) + [tok.eos_token_id] for m in moves]

    async def generate(self, input_ids, params, rid=None) -> GenerationResult:
        out = self.outputs.pop(0)
        return GenerationResult(rid or "r", out, [-0.5] * len(out), [0] * len(out), "stop", len(input_ids))


def test_a_teacher_conversation_is_the_episode_the_rollout_plays(ta, tmp_path):
    from areal_graph.data.datasets import format_prompt
    from areal_graph.modelkit.tokenizer import save_tokenizer, train_tokenizer
    from areal_graph.workflows.rollout.textarena_game import TextArenaGame

    games = guess_teacher.teacher_games(range(7, 12), 0.5, 3)
    tok = train_tokenizer(guess_teacher.corpus(games), vocab_size=400)
    save_tokenizer(tok, tmp_path / "tok")
    rollout = TextArenaGame(str(tmp_path / "tok"), max_turns=10, max_total_tokens=4096)
    for game in games:
        ids, labels = guess_teacher.encode_game(tok, game)

        class Prompt:
            answer = game["answer"]
            input_ids = tok(format_prompt(tok, game["question"]), add_special_tokens=False).input_ids

        moves = [m["content"] for m in game["messages"] if m["role"] == "assistant"]
        traj = asyncio.run(rollout.episode(Prompt(), ReplayMoves(tok, moves), SamplingParams(), 0))
        assert traj.input_ids == ids
        assert traj.loss_mask == [int(label != guess_teacher.IGNORE) for label in labels]
        assert traj.info["reward"] == game["reward"]


def test_an_invalid_move_scores_what_the_library_says_unless_overridden(ta, tmp_path):
    """TextArena pays a game ended by repeated guesses its share completed (more than a loss):
    `invalid_move_reward` replaces that; the game still ends there either way."""
    from areal_graph.data.datasets import format_prompt
    from areal_graph.modelkit.tokenizer import save_tokenizer, train_tokenizer
    from areal_graph.workflows.rollout.textarena_game import TextArenaGame

    seed = next(s for s in range(100) if target_of(s) not in (1, 2))
    row = guess_teacher.row(seed)
    tok = train_tokenizer(guess_teacher.corpus([{**row, "messages": []}]) * 5, vocab_size=300)
    save_tokenizer(tok, tmp_path / "tok")

    class Prompt:
        answer = row["answer"]
        input_ids = tok(format_prompt(tok, row["question"]), add_special_tokens=False).input_ids

    rewards = {}
    for override in (None, 0.0):
        rollout = TextArenaGame(str(tmp_path / "tok"), max_turns=10, invalid_move_reward=override)
        # TextArena lets a player resubmit after one invalid move; repeating it again ends the game
        player = ReplayMoves(tok, ["[1]", "[2]"] + ["[1]"] * 8)
        traj = asyncio.run(rollout.episode(Prompt(), player, SamplingParams(), 0))
        assert traj.info["metrics"]["invalid_move"] and traj.info["metrics"]["finished"]
        assert traj.info["metrics"]["turns"] == 10 - len(player.outputs) < 10
        rewards[override] = traj.info["reward"]
    assert rewards[None] > 0.0 and rewards[0.0] == 0.0
