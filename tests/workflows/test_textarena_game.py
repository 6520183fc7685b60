"""TextArena single-player games (data/textarena_games.py, workflows/rollout/textarena_game.py):
game seeds as rows, a whole real game played through the rollout class (a scripted binary-search
player wins GuessTheNumber), and the trained tokens exactly the ones the engine sampled."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from areal_graph.api.sampling import GenerationResult, SamplingParams
from areal_graph.engines.inference.rollout_eval import LocalEngineClient
from areal_graph.workflows.rollout.textarena_game import TextArenaGame

ROLLOUT = "areal_graph.workflows.rollout.textarena_game:TextArenaGame"


def test_specs_and_games_are_checked(ta):
    from areal_graph.data import textarena_games as tg

    assert tg.parse_spec("textarena:GuessTheNumber-v0?size=5&seed=2") == tg.GameSpec("GuessTheNumber-v0", 5, 2)
    for bad, message in (
        ("textarena:", "give a game"),
        ("textarena:X?size=0", "size must be in"),
        ("textarena:X?colour=red", "options are size, seed, players, opponents"),
        ("textarena:X?players=3", "players must be 1 or 2"),
        ("textarena:X?opponents=random", "add &players=2"),
        ("textarena:X?players=2&opponents=random,expert", "not expert"),
    ):
        with pytest.raises(tg.TextArenaError, match=message):
            tg.parse_spec(bad)
    assert "did you mean 'GuessTheNumber-v0'" in tg.check_env("GuessTheNumbr-v0")
    assert tg.check_env("GuessTheNumber-v0") is None
    assert "not single-player: it is a game for 2 players" in tg.check_env("TicTacToe-v0")
    assert TextArenaGame.check_args({}) is None  # installed: nothing to say before the run


def test_a_tokenizer_without_chatml_is_refused_by_name(tmp_path):
    from areal_graph.modelkit.tokenizer import save_tokenizer, train_tokenizer

    tok = train_tokenizer(["guess a number"] * 10, vocab_size=270)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    save_tokenizer(tok, tmp_path / "tok")
    with pytest.raises(ValueError, match="chat template is not ChatML"):
        TextArenaGame(str(tmp_path / "tok"))


def test_rows_name_games_by_seed_and_open_with_the_games_own_message(ta, tmp_path):
    from areal_graph.data import textarena_games as tg

    path = tg.materialize("textarena:GuessTheNumber-v0?size=3&seed=4", tmp_path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [json.loads(r["answer"])["seed"] for r in rows] == [4 * 1_000_003 + i for i in range(3)]
    assert all(r["question"].startswith("You are Player 0. You are playing Guess The Number.") for r in rows)
    assert tg.materialize("textarena:GuessTheNumber-v0?size=3&seed=4", tmp_path) == path


class BinarySearchPlayer(LocalEngineClient):
    """A scripted policy: reads the game's last hint from the conversation and bisects."""

    def __init__(self, tok) -> None:
        super().__init__(engine=None)
        self.tok, self.lo, self.hi, self.sent = tok, 1, 20, []

    async def generate(self, input_ids, params, rid=None) -> GenerationResult:
        text = self.tok.decode(list(input_ids))
        hints = re.findall(r"The target number is (higher|lower)", text)
        if hints and self.sent:
            last = self.sent[-1][1]
            self.lo, self.hi = (last + 1, self.hi) if hints[-1] == "higher" else (self.lo, last - 1)
        guess = (self.lo + self.hi) // 2
        out = self.tok.encode(f"My guess: [{guess}]", add_special_tokens=False) + [
            self.tok.convert_tokens_to_ids("<|im_end|>")
        ]
        self.sent.append((out, guess))
        return GenerationResult(rid or "r", out, [-0.5] * len(out), [0] * len(out), "stop", len(input_ids))


def prompt_of(tiny_arith_dir, tmp_path, seed: int = 4):
    from transformers import AutoTokenizer

    from areal_graph.data import textarena_games as tg
    from areal_graph.data.datasets import load_prompts

    tok = AutoTokenizer.from_pretrained(tiny_arith_dir)
    path = tg.materialize(f"textarena:GuessTheNumber-v0?size=1&seed={seed}", tmp_path)
    [prompt], _ = load_prompts(path, tok)
    return tok, prompt


def test_a_whole_game_is_one_trajectory_and_the_games_reward_is_the_episodes(ta, tiny_arith_dir, tmp_path):
    from areal_graph.api.episode import split_turns
    from areal_graph.engines.inference.rollout_eval import make_rollout

    tok, prompt = prompt_of(tiny_arith_dir, tmp_path)
    rollout = make_rollout(ROLLOUT, str(tiny_arith_dir))
    player = BinarySearchPlayer(tok)
    [traj] = asyncio.run(rollout.run(prompt, player, 1, SamplingParams(max_new_tokens=16)))
    assert traj.info["reward"] == 1.0 and traj.info["metrics"]["won"] and traj.info["metrics"]["finished"]
    assert traj.info["metrics"]["turns"] == len(player.sent) <= 5  # bisection finds 1..20 in at most 5
    runs = split_turns(traj.input_ids, traj.loss_mask)
    assert [ids for role, ids in runs if role == "assistant"] == [out for out, _ in player.sent]  # the exact tokens
    env_turns = [tok.decode(ids) for role, ids in runs if role == "environment"]
    assert len(env_turns) == len(player.sent) - 1
    assert all(re.search(r"The target number is (higher|lower)\.", t) for t in env_turns)
    assert all(t.startswith("\n<|im_start|>user\n") and t.endswith("<|im_start|>assistant\n") for t in env_turns)


def test_with_the_real_engine_the_trained_tokens_are_the_sampled_ones(ta, tiny_arith_dir, tmp_path):
    """Whatever the (warm-start, not game-trained) policy writes, including replies the game
    refuses and replies cut at the length limit, the loss-mask runs are the engine's outputs."""
    from areal_graph.api.episode import split_turns
    from areal_graph.engines.inference.engine import EmbeddedEngine
    from areal_graph.engines.inference.rollout_eval import make_rollout
    from support.recording import RecordingClient

    tok, prompt = prompt_of(tiny_arith_dir, tmp_path, seed=5)
    engine = EmbeddedEngine(str(tiny_arith_dir), max_context=2048)
    rollout = make_rollout(ROLLOUT, str(tiny_arith_dir))
    client = RecordingClient(engine)
    with engine:
        trajectories = asyncio.run(rollout.run(prompt, client, 2, SamplingParams(max_new_tokens=12, seed=3)))
    sampled = [ids for t in trajectories for role, ids in split_turns(t.input_ids, t.loss_mask) if role == "assistant"]
    assert sorted(map(tuple, sampled)) == sorted(map(tuple, client.outputs)) and len(client.outputs) >= 2
    for t in trajectories:
        assert t.info["metrics"]["finished"] and "reward" in t.info


class ScriptedMoves(LocalEngineClient):
    """A scripted policy that plays a fixed list of moves."""

    def __init__(self, tok, moves: list[str]) -> None:
        super().__init__(engine=None)
        self.tok, self.moves = tok, list(moves)

    async def generate(self, input_ids, params, rid=None) -> GenerationResult:
        out = self.tok.encode(self.moves.pop(0), add_special_tokens=False) + [
            self.tok.convert_tokens_to_ids("<|im_end|>")
        ]
        return GenerationResult(rid or "r", out, [-0.5] * len(out), [0] * len(out), "stop", len(input_ids))


@pytest.mark.parametrize("reward", ["game", "won"])
def test_reward_won_pays_a_lost_game_nothing_where_the_game_pays_its_share(ta, tiny_arith_dir, tmp_path, reward):
    """FrozenLake pays a fall into a hole its share of the way done; reward: won pays it 0."""
    from transformers import AutoTokenizer

    from areal_graph.data import game_teachers as gt
    from areal_graph.data import textarena_games as tg
    from areal_graph.data.datasets import load_prompts

    path = tg.materialize("textarena:FrozenLake-v0?size=40&seed=0", tmp_path)
    tok = AutoTokenizer.from_pretrained(tiny_arith_dir)
    prompts, _ = load_prompts(path, tok)
    for prompt in prompts:  # a lake where walking down, then right, ends in a hole past the start
        game = tg.make_game("FrozenLake-v0")
        game.reset(num_players=1, seed=json.loads(prompt.answer)["seed"])
        moves = []
        while True:
            move = gt.lake_hasty(game.state.game_state)
            moves.append(move)
            done, _ = game.step(move)
            if done:
                break
        share = game.close()[0][0]
        if 0.0 < share < 1.0:
            break
    rollout = TextArenaGame(str(tiny_arith_dir), max_turns=10, max_total_tokens=100_000, reward=reward)
    [traj] = asyncio.run(rollout.run(prompt, ScriptedMoves(tok, moves), 1, SamplingParams(max_new_tokens=8)))
    assert traj.info["metrics"]["turns"] == len(moves) and not traj.info["metrics"]["won"]
    assert traj.info["reward"] == (share if reward == "game" else 0.0)


def test_an_unknown_reward_is_refused_with_the_choices(ta, tiny_arith_dir):
    assert "must be one of game, won, not 'wins'" in TextArenaGame.check_args({"reward": "wins"})
    with pytest.raises(ValueError, match="game, won"):
        TextArenaGame(str(tiny_arith_dir), reward="wins")


@pytest.mark.parametrize(
    ("moves", "reward", "won", "invalid"),
    [
        (["[S 9]", "[E 5]", "[N 6]", "[D 7]", "[M 1]", "[O 0]", "[R 8]", "[Y 2]"], 1.0, True, False),
        (["[S 9]", "[E 5]", "[N 6]", "[D 3]", "[M 1]", "[O 0]", "[R 4]", "[Y 2]"], 0.0, False, False),
        # two moves the game refuses: textarena 0.7.4 "rewards" this with the reason's text
        (["[S 9]", "[X 3]", "hello"], 0.0, False, True),
    ],
)
def test_cryptarithm_is_won_lost_or_ended_by_an_invalid_move(ta, tiny_arith_dir, tmp_path, moves, reward, won, invalid):
    from transformers import AutoTokenizer

    from areal_graph.data import textarena_games as tg
    from areal_graph.data.datasets import load_prompts

    assert tg.seat_reward({0: "Bad action format. Use `[A 5]`."}, 0) is None and tg.seat_reward({0: 1}, 0) == 1.0
    tok = AutoTokenizer.from_pretrained(tiny_arith_dir)
    prompts, _ = load_prompts(tg.materialize("textarena:Cryptarithm-v0?size=1&seed=0", tmp_path), tok)
    rollout = TextArenaGame(str(tiny_arith_dir), max_turns=10, max_total_tokens=100_000)
    [traj] = asyncio.run(rollout.run(prompts[0], ScriptedMoves(tok, moves), 1, SamplingParams(max_new_tokens=8)))
    metrics = traj.info["metrics"]
    assert (traj.info["reward"], metrics["won"], metrics["invalid_move"]) == (reward, won, invalid)
    assert metrics["finished"] and metrics["turns"] == len(moves)
