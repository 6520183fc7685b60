"""Two-seat TextArena games (data/two_player_games.py, workflows/rollout/textarena_selfplay.py):
real TicTacToe games played through the rollout by scripted clients that read the board from the
tokens they are sent; one trajectory per trained seat, its own tokens and its reward from its view."""

from __future__ import annotations

import asyncio
import json
import random
import re

import pytest

from areal_graph.api.sampling import GenerationResult, SamplingParams
from areal_graph.data import two_player_games as tp
from areal_graph.engines.inference.rollout_eval import LocalEngineClient
from areal_graph.workflows.rollout.textarena_selfplay import TextArenaSelfPlay
from support.ci import optional

SPEC = "textarena:TicTacToe-v0?size=8&seed=0&players=2"


class BoardReader(LocalEngineClient):
    """A scripted policy: reads the last 'Available Moves' in the conversation it is sent and
    plays the first (or, once, a cell that is taken, to be refused)."""

    def __init__(self, tok, refuse_once: bool = False) -> None:
        super().__init__(engine=None)
        self.tok, self.refuse_once = tok, refuse_once
        self.sent: list[list[int]] = []

    async def generate(self, input_ids, params, rid=None) -> GenerationResult:
        text = self.tok.decode(input_ids)
        moves = re.findall(r"'\[(\d)\]'", text.rsplit("Available Moves:", 1)[1])
        move = f"[{moves[0]}]"
        if self.refuse_once and "placed their symbol" in text:
            self.refuse_once, move = False, "[" + str(next(i for i in range(9) if str(i) not in moves)) + "]"
        out = self.tok.encode(move, add_special_tokens=False) + [self.tok.convert_tokens_to_ids("<|im_end|>")]
        self.sent.append(out)
        return GenerationResult(rid or "r", out, [-0.25] * len(out), [3] * len(out), "stop", len(input_ids))


def prompts(tiny_arith_dir, tmp_path, spec=SPEC):
    from transformers import AutoTokenizer

    from areal_graph.data import textarena_games as tg
    from areal_graph.data.datasets import load_prompts

    tok = AutoTokenizer.from_pretrained(tiny_arith_dir)
    rows, _ = load_prompts(tg.materialize(spec, tmp_path), tok)
    return tok, rows


def play(tiny_arith_dir, prompt, client, group_size, **args):
    rollout = TextArenaSelfPlay(str(tiny_arith_dir), **{"max_total_tokens": 100_000, **args})
    return asyncio.run(rollout.run(prompt, client, group_size, SamplingParams(max_new_tokens=8)))


def test_self_play_gives_each_seat_its_trajectory_its_tokens_and_its_reward(ta, tiny_arith_dir, tmp_path):
    from areal_graph.api.episode import split_turns

    tok, rows = prompts(tiny_arith_dir, tmp_path)
    client = BoardReader(tok)
    trajs = play(tiny_arith_dir, rows[0], client, 4)
    assert [t.info["seat"] for t in trajs] == [0, 1, 0, 1] and [t.sample_id for t in trajs] == [0, 1, 2, 3]
    # first-free-cell against itself: O takes 0, X 1, O 2, X 3, O 4, X 5, O 6: O wins on the diagonal 2-4-6
    for t in trajs:
        m = t.info["metrics"]
        assert m["finished"] and m["won"] == (t.info["seat"] == 0) and m["lost"] == (t.info["seat"] == 1)
        assert t.info["reward"] == (1.0 if t.info["seat"] == 0 else -1.0)
        assert m["turns"] == (4 if t.info["seat"] == 0 else 3)
    runs = [split_turns(t.input_ids, t.loss_mask) for t in trajs]
    mine = [ids for r in runs for role, ids in r if role == "assistant"]
    assert sorted(map(tuple, mine)) == sorted(map(tuple, client.sent)) and len(mine) == 14
    seat1 = tok.decode(trajs[1].input_ids)
    assert "As Player 1, you will be 'X'" in seat1 and "Player 0 placed their symbol (O) in cell 0." in seat1
    assert all(v == 3 for t in trajs for v, m in zip(t.versions, t.loss_mask) if m)  # the engine's versions


@pytest.mark.parametrize("opponent", ["random", "heuristic"])
def test_a_fixed_opponent_plays_one_seat_and_the_policy_both_in_turn(ta, tiny_arith_dir, tmp_path, opponent):
    tok, rows = prompts(tiny_arith_dir, tmp_path)
    trajs = play(tiny_arith_dir, rows[1], BoardReader(tok), 4, opponent=opponent)
    assert [t.info["seat"] for t in trajs] == [0, 1, 0, 1]
    for t in trajs:
        m = t.info["metrics"]
        assert m["finished"] and m["won"] + m["drawn"] + m["lost"] == 1
        assert m[f"won_vs_{opponent}"] == m["won"] and m[f"lost_vs_{opponent}_seat{t.info['seat']}"] == m["lost"]
        assert t.info["reward"] == {(1, 0, 0): 1.0, (0, 1, 0): 0.0, (0, 0, 1): -1.0}[(m["won"], m["drawn"], m["lost"])]
    if opponent == "heuristic":  # the first free cell never beats win-block-centre
        assert not any(t.info["metrics"]["won"] for t in trajs)


class LastCell(BoardReader):
    """A scripted lagged opponent on servers of its own: plays the last free cell, with its own
    log-probs and weight version (2, the policy's being 3)."""

    async def generate(self, input_ids, params, rid=None) -> GenerationResult:
        text = self.tok.decode(input_ids)
        self.seen.append(text)
        moves = re.findall(r"'\[(\d)\]'", text.rsplit("Available Moves:", 1)[1])
        out = self.tok.encode(f"[{moves[-1]}]", add_special_tokens=False) + [
            self.tok.convert_tokens_to_ids("<|im_end|>")
        ]
        self.sent.append(out)
        return GenerationResult(rid or "r", out, [-1.5] * len(out), [2] * len(out), "stop", len(input_ids))

    def __init__(self, tok) -> None:
        super().__init__(tok)
        self.seen: list[str] = []


def test_a_lagged_model_plays_one_seat_on_its_own_servers_and_only_the_policys_tokens_are_trained(
    ta, tiny_arith_dir, tmp_path
):
    from areal_graph.api.episode import split_turns

    tok, rows = prompts(tiny_arith_dir, tmp_path)
    policy, lagged = BoardReader(tok), LastCell(tok)
    trajs = play(tiny_arith_dir, rows[0], policy, 4, opponent="model:opp", served_models={"opp": lagged})
    assert [t.info["seat"] for t in trajs] == [0, 1, 0, 1] and [t.sample_id for t in trajs] == [0, 1, 2, 3]
    # first free cell against last free cell: as O it takes 0, 1, 2 and wins; as X it loses to 8, 7, 6
    for t in trajs:
        m, seat = t.info["metrics"], t.info["seat"]
        assert m["finished"] and (m["won"], m["lost"]) == (seat == 0, seat == 1)
        assert (m["won_vs_opp"], m[f"lost_vs_opp_seat{seat}"]) == (seat == 0, seat == 1)
        assert (m["opponent_version"], m["opponent_lag"]) == (2, 1)
        assert t.info["opponent"] == "model:opp" and "won_vs_model:opp" not in m
        # every trained token is the policy's: its log-probs, its version; the opponent's moves are context
        trained = [(lp, v) for lp, v, mask in zip(t.behav_logprobs, t.versions, t.loss_mask) if mask]
        assert trained and set(trained) == {(-0.25, 3)}
        context = [v for v, mask in zip(t.versions, t.loss_mask) if not mask]
        assert set(context) == {-1}
    mine = [ids for t in trajs for role, ids in split_turns(t.input_ids, t.loss_mask) if role == "assistant"]
    assert sorted(map(tuple, mine)) == sorted(map(tuple, policy.sent))
    assert len(policy.sent) == 2 * 3 + 2 * 2 and len(lagged.sent) == 2 * 2 + 2 * 3
    seat0 = tok.decode(trajs[0].input_ids)
    assert "Player 1 placed their symbol (X) in cell 8." in seat0  # the opponent's move, told by the game
    # the opponent has a conversation of its own, as the seat it plays (seat 1 in games 0 and 2, 0 in 1 and 3)
    as_o = [text for text in lagged.seen if "As Player 0, you will be 'O'" in text]
    as_x = [text for text in lagged.seen if "As Player 1, you will be 'X'" in text]
    assert (len(as_o), len(as_x)) == (2 * 3, 2 * 2) and not set(as_o) & set(as_x)


def test_a_lagged_opponent_needs_its_servers(ta, tiny_arith_dir, tmp_path):
    tok, rows = prompts(tiny_arith_dir, tmp_path)
    with pytest.raises(ValueError, match="no servers of model 'opp' were given \\(served models: other\\)"):
        TextArenaSelfPlay(str(tiny_arith_dir), opponent="model:opp", served_models={"other": LastCell(tok)})
    with pytest.raises(ValueError, match="opponent model:opp plays on that model's servers, and none were given"):
        play(tiny_arith_dir, rows[0], BoardReader(tok), 2, opponent="model:opp")
    eval_tok, eval_rows = prompts(tiny_arith_dir, tmp_path / "eval", SPEC + "&opponents=random")
    [t] = play(tiny_arith_dir, eval_rows[0], BoardReader(eval_tok), 1, opponent="model:opp")
    assert t.info["opponent"] == "random"  # an evaluation row plays its fixed opponent, no servers needed


def test_evaluation_rows_name_their_opponent_and_seat(ta, tiny_arith_dir, tmp_path):
    tok, rows = prompts(tiny_arith_dir, tmp_path, SPEC.replace("size=8", "size=4") + "&opponents=random,heuristic")
    refs = [json.loads(r.answer) for r in rows]
    assert [(r["opponent"], r["seat"]) for r in refs] == [
        ("random", 0),
        ("heuristic", 0),
        ("random", 1),
        ("heuristic", 1),
    ]
    for row, ref in zip(rows, refs):  # the rollout's own opponent (self) gives way to the row's
        [t] = play(tiny_arith_dir, row, BoardReader(tok), 1)
        assert (t.info["seat"], t.info["opponent"]) == (ref["seat"], ref["opponent"])


def test_a_refused_move_is_counted_and_a_second_in_a_turn_loses(ta, tiny_arith_dir, tmp_path):
    tok, rows = prompts(tiny_arith_dir, tmp_path)
    trajs = play(tiny_arith_dir, rows[0], BoardReader(tok, refuse_once=True), 2)
    refused = [t.info["metrics"]["refused_moves"] for t in trajs]
    assert sorted(refused) == [0, 1]

    class AlwaysTaken(BoardReader):
        async def generate(self, input_ids, params, rid=None):
            out = self.tok.encode("[10]", add_special_tokens=False) + [self.tok.convert_tokens_to_ids("<|im_end|>")]
            return GenerationResult(rid or "r", out, [-0.5] * len(out), [0] * len(out), "stop", len(input_ids))

    [t0, t1] = play(tiny_arith_dir, rows[0], AlwaysTaken(tok), 2)
    assert t0.info["metrics"]["invalid_move"] and t0.info["reward"] == -1.0 and t1.info["metrics"]["won"]
    [t0, t1] = play(tiny_arith_dir, rows[0], AlwaysTaken(tok), 2, invalid_move_reward=-2.0, reward="game")
    assert t0.info["reward"] == -2.0


def test_a_list_of_opponents_gives_each_prompt_group_one_of_them_by_its_seed(ta, tiny_arith_dir, tmp_path):
    tok, rows = prompts(tiny_arith_dir, tmp_path)
    seen = {}
    for row in rows[:4]:
        seed = json.loads(row.answer)["seed"]
        trajs = play(tiny_arith_dir, row, BoardReader(tok), 4, opponent=["self", "random"])
        seen[seed % 2] = [t.info["opponent"] for t in trajs]
        assert [t.info["seat"] for t in trajs] == [0, 1, 0, 1] and [t.sample_id for t in trajs] == [0, 1, 2, 3]
    # even seeds: 2 games against itself (both seats trained); odd: 4 games against random moves
    assert seen == {0: ["self"] * 4, 1: ["random"] * 4}


def test_with_no_retries_a_refused_move_loses_at_once(ta, tiny_arith_dir, tmp_path):
    """retries: 0 (SPIRAL's rule): the first move the game refuses ends it, lost by that seat;
    with the game's own allowance (1) the same move is retried and the game goes on."""
    tok, rows = prompts(tiny_arith_dir, tmp_path)
    kept = play(tiny_arith_dir, rows[0], BoardReader(tok, refuse_once=True), 2)
    assert sorted(t.info["metrics"]["refused_moves"] for t in kept) == [0, 1]
    assert not any(t.info["metrics"]["invalid_move"] for t in kept)
    strict = play(tiny_arith_dir, rows[0], BoardReader(tok, refuse_once=True), 2, retries=0)
    offender = next(t for t in strict if t.info["metrics"]["invalid_move"])
    other = next(t for t in strict if t is not offender)
    assert offender.info["reward"] == -1.0 and offender.info["metrics"]["refused_moves"] == 0
    assert other.info["metrics"]["won"] and other.info["reward"] == 1.0
    assert sum(t.info["metrics"]["turns"] for t in strict) < sum(t.info["metrics"]["turns"] for t in kept)


def test_bad_arguments_and_data_are_named(ta, tiny_arith_dir):
    for bad in (-1, 1.5, True, "0"):
        assert (
            f"rollout_args.retries must be a whole number >= 0 (refused moves a seat may retry per turn), not {bad!r}"
            == (TextArenaSelfPlay.check_args({"retries": bad}))
        )
        with pytest.raises(ValueError, match="rollout_args.retries must be a whole number"):
            TextArenaSelfPlay(str(tiny_arith_dir), retries=bad)
    assert TextArenaSelfPlay.check_args({"retries": 0}) is None
    for bad in (1, "true", None):
        assert f"rollout_args.mask_illegal_moves must be true or false, not {bad!r}" == (
            TextArenaSelfPlay.check_args({"mask_illegal_moves": bad})
        )
    assert TextArenaSelfPlay.check_backend({"mask_illegal_moves": True}, "embedded") is None
    assert TextArenaSelfPlay.check_backend({"mask_illegal_moves": False}, "sglang") is None
    assert "inference.backend 'sglang' does not" in TextArenaSelfPlay.check_backend(
        {"mask_illegal_moves": True}, "sglang"
    )
    assert TextArenaSelfPlay.check_args({"opponent": ["self", "heuristic"]}) is None
    assert "is an empty list" in TextArenaSelfPlay.check_args({"opponent": []})
    assert "each entry must be one of self, random, heuristic, not 'expert'" in (
        TextArenaSelfPlay.check_args({"opponent": ["self", "expert"]})
    )
    assert "a lagged copy (model:opp) in a list of opponents is not built yet" in (
        TextArenaSelfPlay.check_args({"opponent": ["self", "model:opp"]})
    )
    assert TextArenaSelfPlay.check_args({"opponent": "model:lagged"}) is None  # the workflow's rules check the name
    assert "'model:' names no model" in TextArenaSelfPlay.check_args({"opponent": "model:"})
    assert "must be one of self, random, heuristic or model:NAME (a lagged copy of the policy), not 'expert'" in (
        TextArenaSelfPlay.check_args({"opponent": "expert"})
    )
    assert TextArenaSelfPlay.check_args({"opponent": "heuristic"}) is None
    assert "add &players=2" in TextArenaSelfPlay.check_data({}, "textarena:TicTacToe-v0?size=4")
    assert "plays textarena: games" in TextArenaSelfPlay.check_data({}, "builtin:arith/train")
    assert "not built for two-seat play" in TextArenaSelfPlay.check_data({}, "textarena:Chess-v0?players=2")
    assert TextArenaSelfPlay.check_data({}, SPEC) is None
    from areal_graph.workflows.rollout.textarena_game import TextArenaGame

    assert "TextArenaGame plays one: use rollout_class" in TextArenaGame.check_data({}, SPEC)
    assert TextArenaGame.check_data({}, "textarena:GuessTheNumber-v0?size=4") is None
    with pytest.raises(ValueError, match="group_size 3 is odd"):
        play(tiny_arith_dir, _row(), BoardReader(None), 3)


def _row():
    class Row:
        id, text, input_ids = "r", "", [1]
        answer = json.dumps({"textarena": "TicTacToe-v0", "seed": 0, "players": 2})

    return Row()


def test_two_player_specs_are_checked(ta):
    from areal_graph.data import textarena_games as tg

    assert tg.check_spec(SPEC) is None
    assert "not built for two-seat play" in tg.check_spec("textarena:Chess-v0?players=2")
    message = tg.check_env("TicTacToe-v0")
    assert "is not single-player" in message and "add &players=2" in message and "TextArenaSelfPlay" in message


# ------------------------------------------------------------------------------ the fixed opponents
def random_board(rng: random.Random) -> dict:
    cells = [""] * 9
    for k in range(rng.randint(0, 7)):
        free = [i for i in range(9) if not cells[i]]
        cells[rng.choice(free)] = "OX"[k % 2]
    return {"board": [cells[0:3], cells[3:6], cells[6:9]]}


def wins(cells: list[str], mark: str) -> bool:
    lines = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
    return any(all(cells[i] == mark for i in line) for line in lines)


def test_the_heuristic_wins_when_it_can_and_blocks_when_it_must():
    rng = random.Random(0)
    checked = 0
    for _ in range(3000):
        state = random_board(rng)
        cells = tp.tictactoe_cells(state)
        if wins(cells, "O") or wins(cells, "X") or all(cells):
            continue
        seat = rng.randint(0, 1)
        mine, theirs = tp.tictactoe_mark(seat), tp.tictactoe_mark(1 - seat)
        move = tp.tictactoe_heuristic(state, seat, rng)
        assert not cells[move]

        def after(mark, i):
            return [mark if j == i else c for j, c in enumerate(cells)]

        can_win = [i for i in range(9) if not cells[i] and wins(after(mine, i), mine)]
        must_block = [i for i in range(9) if not cells[i] and wins(after(theirs, i), theirs)]
        if can_win:
            assert move in can_win
        elif must_block:
            assert move in must_block
        checked += 1
    assert checked > 1000


def test_the_heuristic_beats_random_play_from_both_seats():
    """Real games: the heuristic against uniform random moves, 200 games per seat."""
    from areal_graph.data.textarena_games import make_game

    optional("textarena", "pip install 'textarena==0.7.4' (in the dev extra)")
    game_def = tp.two_player_game(tp.TICTACTOE)
    for seat in (0, 1):
        results = []
        for seed in range(200):
            rng = random.Random(seed)
            game = make_game(tp.TICTACTOE)
            game.reset(num_players=2, seed=seed)
            done = False
            while not done:
                pid, _ = game.get_observation()
                who = "heuristic" if pid == seat else "random"
                done, _ = game.step(game_def.opponent_move(who, game.state.game_state, pid, rng))
            results.append(game.close()[0][seat])
        won, lost = results.count(1) / 200, results.count(-1) / 200
        assert won > (0.8 if seat == 0 else 0.5) and lost < 0.1, (seat, won, lost)


# ------------------------------------------------------------------------------ the shipped workflow
def test_the_shipped_workflow_validates_and_names_what_is_wrong(ta):
    from areal_graph.graph.loader import load_workflow
    from areal_graph.graph.problems import WorkflowError
    from support.paths import WORKFLOWS

    wf = WORKFLOWS / "textarena_selfplay.yaml"
    spec = load_workflow(wf)
    rollout = spec.nodes["rollout"].params
    assert spec.nodes["advantage"].params.baseline == "seat" and spec.models["actor"].path == "builtin:tiny-tictactoe"
    for dataset in (spec.data.train, spec.data.eval):
        assert TextArenaSelfPlay.check_data(dict(rollout.rollout_args), dataset) is None
    for overrides, field, message in (
        (["nodes.rollout.rollout_args.opponent=model:lagged"], "rollout_args.opponent", "unknown model 'lagged'"),
        (["nodes.advantage.estimator=gae"], "baseline", "estimator 'gae' has none"),
        (["nodes.advantage.baseline=seats"], "baseline", "seat"),
        (
            ["nodes.rollout.rollout_args.mask_illegal_moves=true", "inference.backend=vllm"],
            "rollout_args",
            "only the embedded engine's constrained decoding takes; inference.backend 'vllm' does not",
        ),
        (["nodes.rollout.rollout_args.mask_illegal_moves=3"], "rollout_class", "must be true or false, not 3"),
    ):
        with pytest.raises(WorkflowError) as err:
            load_workflow(wf, overrides)
        text = str(err.value)
        assert f"field '{field}'" in text and message in text, text


def test_with_the_real_engine_and_kit_each_seat_trains_its_own_sampled_tokens(ta, tmp_path):
    """The shipped kit's policy in self-play: every loss-mask run of every seat is one of the
    engine's outputs, with the engine's log-probs, and no seat holds another's tokens as its own."""
    from areal_graph.api.episode import split_turns
    from areal_graph.engines.inference.engine import EmbeddedEngine
    from areal_graph.modelkit.builtin import resolve_model_path
    from support.recording import RecordingClient

    kit = resolve_model_path("builtin:tiny-tictactoe")
    tok, rows = prompts(kit, tmp_path)
    engine = EmbeddedEngine(str(kit), max_context=1536)
    client = RecordingClient(engine)
    rollout = TextArenaSelfPlay(str(kit), max_total_tokens=1536)
    with engine:
        trajs = asyncio.run(rollout.run(rows[0], client, 4, SamplingParams(max_new_tokens=6, seed=11)))
    recorded = sorted((tuple(o), tuple(lp)) for o, lp in zip(client.outputs, client.logprobs))
    trained = []
    for t in trajs:
        start = 0
        for role, ids in split_turns(t.input_ids, t.loss_mask):
            if role == "assistant":
                trained.append((tuple(ids), tuple(t.behav_logprobs[start : start + len(ids)])))
            start += len(ids)
    assert sorted(trained) == recorded  # every generation is exactly one seat's, log-probs and all
    assert [t.info["seat"] for t in trajs] == [0, 1, 0, 1]


@pytest.mark.parametrize("seed", [5, 23])
def test_masked_moves_are_legal_and_their_log_probs_are_the_masked_distributions(ta, tmp_path, seed):
    """mask_illegal_moves, with the real engine and kit at temperature 3 (much mass on taken
    cells): no move is ever refused; the brackets, which the grammar forced, are context; each
    trained token is a cell that was free, with the behaviour log-prob of the policy's
    distribution restricted to the free cells, as an independent float64 forward computes it."""
    import math

    import torch
    from transformers import AutoModelForCausalLM

    from areal_graph.engines.inference.engine import EmbeddedEngine
    from areal_graph.modelkit.builtin import resolve_model_path

    kit = resolve_model_path("builtin:tiny-tictactoe")
    tok, rows = prompts(kit, tmp_path)
    engine = EmbeddedEngine(str(kit), max_context=1536)
    rollout = TextArenaSelfPlay(str(kit), max_total_tokens=1536, mask_illegal_moves=True)
    sampling = SamplingParams(max_new_tokens=6, seed=seed, temperature=3.0)
    free_play = TextArenaSelfPlay(str(kit), max_total_tokens=1536)
    with engine:
        trajs = asyncio.run(rollout.run(rows[0], LocalEngineClient(engine), 8, sampling))
        unmasked = asyncio.run(free_play.run(rows[0], LocalEngineClient(engine), 8, sampling))
    assert all(t.info["metrics"]["refused_moves"] == 0 and not t.info["metrics"]["invalid_move"] for t in trajs)
    assert sum(t.info["metrics"]["refused_moves"] + t.info["metrics"]["invalid_move"] for t in unmasked) > 0
    model = AutoModelForCausalLM.from_pretrained(kit, torch_dtype=torch.float64).eval()
    digits = {tok.convert_tokens_to_ids(str(c)): c for c in range(9)}
    checked, worst = 0, 0.0
    for t in trajs:
        with torch.no_grad():
            logits = model(torch.tensor([t.input_ids])).logits[0] / 3.0
        for i, (token, trained) in enumerate(zip(t.input_ids, t.loss_mask)):
            if not trained:
                continue
            free = [
                int(c) for c in re.findall(r"'\[(\d)\]'", tok.decode(t.input_ids[:i]).rsplit("Available Moves:", 1)[1])
            ]
            assert token in digits and digits[token] in free, (tok.decode(t.input_ids[: i + 1])[-200:], free)
            allowed = [tok.convert_tokens_to_ids(str(c)) for c in free]
            masked = torch.log_softmax(logits[i - 1, allowed], dim=-1)
            expected = float(masked[allowed.index(token)])
            worst = max(worst, abs(expected - t.behav_logprobs[i]))
            checked += 1
            assert len(free) > 1 or math.isclose(expected, 0.0)
    assert checked >= 8 and worst < 1e-5, (checked, worst)


# ------------------------------------------------------------------------------ the kit's teacher
def test_the_teachers_careful_play_is_perfect_and_its_habit_is_the_last_free_cell(ta):
    """Careful (minimax) never loses: against itself every game is drawn, against random moves it
    wins most and loses none; the habit takes the last free cell; each seat's conversation is laid
    out as the rollout lays it out (its opening, then user turns between its moves)."""
    from areal_graph.data import tictactoe_teacher as tt

    rng = random.Random(0)
    selfplay = [side for i in range(30) for side in tt.teacher_game(i, 1.0, rng, "self")]
    assert len(selfplay) == 60 and all(side["reward"] == 0.0 for side in selfplay)
    vs_random = [side for i in range(200) for side in tt.teacher_game(i, 1.0, rng, "random")]
    rewards = [side["reward"] for side in vs_random]
    assert rewards.count(-1.0) == 0 and rewards.count(1.0) > 150
    assert {side["seat"] for side in vs_random} == {0, 1}
    for name, moves in (
        ("last_free", ["[8]", "[6]", "[4]", "[2]"]),  # O takes 8, (X 7), 6, (X 5), 4, (X 3), 2: the diagonal
        ("first_free", ["[0]", "[2]", "[4]", "[6]"]),  # O takes 0, (X 1), 2, (X 3), 4, (X 5), 6: the diagonal
    ):
        habit = tt.teacher_game(0, 0.0, rng, "self", name)
        assert [m["content"] for m in habit[0]["messages"] if m["role"] == "assistant"] == moves
        assert habit[0]["reward"] == 1.0 and habit[1]["reward"] == -1.0
    assert tt.teacher_game(0, 0.0, rng, "self") == tt.teacher_game(0, 0.0, rng, "self", "last_free")
    # random_rate: that share of moves is any free cell (never a taken one: no move is refused),
    # so the games leave the habit's path
    mixed = [tt.teacher_game(i, 0.0, random.Random(i), "self", "last_free", random_rate=0.5) for i in range(40)]
    assert not any("invalid move" in m["content"] for game in mixed for side in game for m in side["messages"])
    habit_only = [tt.teacher_game(i, 0.0, random.Random(i), "self") for i in range(40)]
    assert len({str(g[0]["messages"]) for g in habit_only}) == 1 and len({str(g[0]["messages"]) for g in mixed}) > 10
    for side in selfplay[:4]:
        assert side["question"].startswith(f"You are Player {side['seat']} in Tic Tac Toe.")
        assert [m["role"] for m in side["messages"]] == ["assistant", "user"] * (len(side["messages"]) // 2) + (
            ["assistant"] if len(side["messages"]) % 2 else []
        )
