"""OpenEnv environments as episodes (workflows/rollout/openenv_episode.py): the shipped arithmetic
environment started here in its own process, played by a scripted policy and by the real engine
(the trained tokens are the sampled ones, the environment's observations user turns after them),
and the errors of an environment that is not there, does not answer, or cannot be imported."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import threading

import psutil
import pytest

from areal_graph.api.episode import split_turns
from areal_graph.api.sampling import GenerationResult, SamplingParams
from areal_graph.data.chatml import user_turn_text
from areal_graph.engines.inference.rollout_eval import LocalEngineClient, make_rollout
from areal_graph.workflows.openenv_envs import arith_server
from areal_graph.workflows.openenv_envs.arith import ArithAction, ArithEnvironment
from areal_graph.workflows.rollout import openenv_client, openenv_server
from areal_graph.workflows.rollout.chatml_turns import ChatMLTurns
from areal_graph.workflows.rollout.openenv_episode import OpenEnvEpisode, episode_seed, observation_text
from support.ci import optional

ROLLOUT = "areal_graph.workflows.rollout.openenv_episode:OpenEnvEpisode"
ARITH = "areal_graph.workflows.openenv_envs.arith:ArithEnvironment"


@pytest.fixture(scope="module")
def kit_dir():
    optional("openenv", "pip install 'openenv-core==0.2.1' (in the dev extra)")
    from areal_graph.modelkit.builtin import resolve_model_path

    return str(resolve_model_path("builtin:tiny-arith"))


class Row:
    def __init__(self, id: str, answer: str = "7") -> None:
        self.id, self.answer, self.text, self.input_ids = id, answer, "", [1]


def solve(question: str) -> int:
    tokens = question.split()
    value = int(tokens[0])
    for op, b in zip(tokens[1::2], tokens[2::2]):
        value = value + int(b) if op == "+" else value - int(b)
    return value


class ArithPlayer(LocalEngineClient):
    """A scripted policy: answers the last question it was asked, wrongly on the first try of the
    answers in `wrong_first` (answer index j is read from the sampling seed)."""

    def __init__(self, tok, wrong_first=()) -> None:
        super().__init__(engine=None)
        self.tok, self.wrong_first, self.sent = tok, set(wrong_first), []

    async def generate(self, input_ids, params, rid=None) -> GenerationResult:
        text = self.tok.decode(list(input_ids))
        value = solve(re.findall(r"What is ([0-9 +\-]+)\?", text)[-1])
        j, turn = divmod(params.seed, 1000)
        if j in self.wrong_first and turn == 0:
            value += 1
        out = self.tok.encode(f"The answer is \\boxed{{{value}}}.", add_special_tokens=False)
        out.append(self.tok.convert_tokens_to_ids("<|im_end|>"))
        self.sent.append(out)
        return GenerationResult(rid or "r", out, [-0.5] * len(out), [0] * len(out), "stop", len(input_ids))


def test_the_arith_environment_scores_its_own_problems_with_one_retry():
    env = ArithEnvironment()
    first = env.reset(seed=11)
    assert env.reset(seed=11).prompt == first.prompt  # a seed is a problem
    answer = solve(first.prompt.removeprefix("What is ").rstrip("?"))
    again = env.step(ArithAction(message=f"\\boxed{{{answer + 1}}}"))
    assert (again.done, again.reward) == (
        False,
        0.0,
    ) and again.prompt == f"That is not right. Try again: {first.prompt}"
    assert (lambda o: (o.done, o.reward))(env.step(ArithAction(message=f"The answer is \\boxed{{{answer}}}."))) == (
        True,
        0.5,
    )
    env.reset(seed=11)
    assert env.step(ArithAction(message=f"\\boxed{{{answer}}}")).reward == 1.0
    assert arith_server.app.title  # the app `uvicorn ...arith_server:app` serves


def test_seeds_come_from_the_row_and_observations_render_as_text():
    assert episode_seed(Row("a", '{"seed": 42}')) == 42
    assert episode_seed(Row("row-1")) == episode_seed(Row("row-1")) != episode_seed(Row("row-2"))
    assert 0 <= episode_seed(Row("row-1")) < 2**31
    assert observation_text({"prompt": "hi", "n": 3}, "") == "hi"
    assert observation_text({"a": "x", "b": "y"}, "") == '{"a": "x", "b": "y"}'
    with pytest.raises(openenv_client.OpenEnvError, match=r"observation_field 'text'.*\['prompt'\]"):
        observation_text({"prompt": "hi"}, "text")
    assert openenv_client.ws_url("https://h:1/x/") == "wss://h:1/x/ws"


def test_rollout_args_are_checked_before_the_run():
    check = OpenEnvEpisode.check_args
    assert "exactly one of env" in check({})
    assert "exactly one of env" in check({"env": ARITH, "url": "http://127.0.0.1:1"})
    assert "module:Class" in check({"env": "no_colon"})
    assert "an OpenEnv server's address" in check({"url": "127.0.0.1:8000"})
    assert "reward must be one of" in check({"url": "http://h:1", "reward": "mean"})
    assert "timeout_s must be a positive" in check({"url": "http://h:1", "timeout_s": 0})
    assert check({"env": ARITH, "max_turns": 2}) is None and check({"url": "http://h:1"}) is None
    # the environment itself is imported at validate, not when the first episode starts
    assert "cannot import 'no_such_pkg_xyz'" in check({"env": "no_such_pkg_xyz:Env"})
    assert "has no 'Nope'" in check({"env": "areal_graph.workflows.openenv_envs.arith:Nope"})
    assert "neither an OpenEnv Environment subclass nor an app" in check({"env": "json:JSONDecoder"})


def test_a_tokenizer_without_chatml_is_refused_by_name(kit_dir, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(kit_dir)
    turns = ChatMLTurns(tok, "OpenEnvEpisode")
    assert tok.decode(turns.user_turn("hi", closed=True)) == user_turn_text("hi", closed=True)
    assert turns.closed([5, turns.end_id]) and not turns.closed([]) and not turns.closed([turns.end_id, 5])
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tok.save_pretrained(tmp_path / "tok")
    with pytest.raises(ValueError, match="OpenEnvEpisode appends user turns in ChatML"):
        OpenEnvEpisode(str(tmp_path / "tok"), url="http://127.0.0.1:1")


def test_a_started_environment_plays_whole_episodes_in_its_own_process(kit_dir):
    """The shipped environment in a child process: a group plays one problem, a right answer scores
    1, a wrong one is asked again (a user turn appended after the reply's tokens) and scores 0.5."""
    rollout = make_rollout(ROLLOUT, kit_dir, env=ARITH, max_turns=3)

    async def play():
        player = ArithPlayer(rollout.tok, wrong_first={1})
        trajs = await rollout.run(Row("row-1"), player, 2, SamplingParams(max_new_tokens=16, seed=0))
        server = psutil.Process(rollout._server.proc.pid)
        assert server.pid != os.getpid() and server.is_running()
        await rollout.aclose()
        return player, trajs, server

    player, (right, retried), server = asyncio.run(play())
    assert not server.is_running()  # aclose stopped it
    assert right.info["reward"] == 1.0 and right.info["metrics"] == {"turns": 1, "finished": True, "reward_steps": 1}
    assert retried.info["reward"] == 0.5 and retried.info["metrics"]["turns"] == 2
    tok = rollout.tok
    question = re.search(r"What is [^?]+\?", tok.decode(right.input_ids)).group(0)
    assert question in tok.decode(retried.input_ids)  # the same episode (seed) for the whole group
    runs = split_turns(retried.input_ids, retried.loss_mask)
    assert [role for role, _ in runs] == ["prompt", "assistant", "environment", "assistant"]
    assert sorted(
        tuple(ids)
        for t in (right, retried)
        for role, ids in split_turns(t.input_ids, t.loss_mask)
        if role == "assistant"
    ) == sorted(map(tuple, player.sent))
    assert (
        tok.decode(runs[2][1])
        == f"\n<|im_start|>user\nThat is not right. Try again: {question}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_with_the_real_engine_the_trained_tokens_are_the_sampled_ones(kit_dir):
    from areal_graph.engines.inference.engine import EmbeddedEngine
    from support.recording import RecordingClient

    rollout = make_rollout(ROLLOUT, kit_dir, env=ARITH, max_turns=2)
    engine = EmbeddedEngine(kit_dir, max_context=256)
    client = RecordingClient(engine)

    async def play():
        try:
            return await rollout.run(Row("row-7"), client, 3, SamplingParams(max_new_tokens=24, seed=3))
        finally:
            await rollout.aclose()

    with engine:
        trajectories = asyncio.run(play())
    sampled = [ids for t in trajectories for role, ids in split_turns(t.input_ids, t.loss_mask) if role == "assistant"]
    assert sorted(map(tuple, sampled)) == sorted(map(tuple, client.outputs)) and len(client.outputs) >= 3
    for t in trajectories:
        assert t.info["reward"] in (0.0, 0.5, 1.0) and 1 <= t.info["metrics"]["turns"] <= 2


def episode_error(kit_dir, **args) -> str:
    """The error a rollout with these arguments meets: when it is built (check_args imports an
    `env` there, as validate does) or in its first episode (an environment that does not answer)."""

    async def play():
        rollout = make_rollout(ROLLOUT, kit_dir, **args)
        try:
            await rollout.run(Row("r"), ArithPlayer(rollout.tok), 1, SamplingParams(max_new_tokens=8, seed=0))
        finally:
            await rollout.aclose()

    with pytest.raises((openenv_client.OpenEnvError, ValueError)) as err:
        asyncio.run(play())
    return str(err.value)


def test_a_url_that_refuses_connections_is_named_with_what_to_do(kit_dir):
    url = f"http://127.0.0.1:{openenv_server.free_port()}"
    message = episode_error(kit_dir, url=url, timeout_s=5)
    assert url in message and "could not be reached" in message and "is its server running?" in message
    assert "rollout_args.url" in message and "rollout_args.env" in message


def test_an_environment_that_never_answers_fails_at_the_timeout(kit_dir):
    """A socket that accepts connections and never replies: the episode fails after timeout_s."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        held: list[socket.socket] = []
        stop = threading.Event()

        def accept():
            silent.settimeout(0.2)
            while not stop.is_set():
                try:
                    held.append(silent.accept()[0])
                except OSError:
                    pass

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        try:
            message = episode_error(kit_dir, url=url, timeout_s=0.5)
        finally:
            stop.set()
            thread.join()
            for conn in held:
                conn.close()
    assert url in message and "within timeout_s=0.5 s" in message and "raise rollout_args.timeout_s" in message


def test_an_environment_that_cannot_be_imported_is_named(kit_dir):
    message = episode_error(kit_dir, env="no_such_package.envs:GameEnvironment")
    assert "'no_such_package.envs:GameEnvironment'" in message and "cannot import 'no_such_package.envs'" in message
    assert "python_path" in message and "rollout_args.url" in message
    message = episode_error(kit_dir, env="areal_graph.workflows.openenv_envs.arith:NoSuchEnv")
    assert "has no 'NoSuchEnv'" in message and "ArithEnvironment" in message
    message = episode_error(kit_dir, env="areal_graph.workflows.openenv_envs.arith:LEVEL")
    assert "neither an OpenEnv Environment subclass nor an app" in message
