"""Rewards see the episode: turns, tool calls and the rollout's info reach a reward fn that asks."""

from __future__ import annotations

import json
import sys

import pytest

from areal_graph.api.episode import MAX_INFO_BYTES, Episode, Turn, info_json, split_turns
from areal_graph.api.reward_fns import wants_episode
from areal_graph.api.rollout import Trajectory
from areal_graph.workflows.rollout.base import pack_trajectories
from support.paths import TESTS


def test_turns_split_where_the_loss_mask_changes():
    runs = split_turns([1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 1, 1, 0, 0, 1, 0])
    assert runs == [
        ("prompt", [1, 2]),
        ("assistant", [3, 4]),
        ("environment", [5, 6]),
        ("assistant", [7]),
        ("environment", [8]),
    ]
    assert split_turns([5], [0]) == [("prompt", [5])]


def test_which_functions_want_the_episode():
    def two(completion, answer):
        return 0.0

    def three(completion, answer, episode):
        return 0.0

    def kw(completion, answer, **kwargs):
        return 0.0

    assert (wants_episode(two), wants_episode(three), wants_episode(kw)) == (False, True, True)


def test_episode_round_trips_and_counts_tool_calls():
    ep = Episode(
        "c",
        "a",
        (Turn("prompt", "q"), Turn("assistant", "x"), Turn("environment", "42"), Turn("assistant", "y")),
        {"k": [1, 2]},
        truncated=True,
    )
    assert Episode.from_dict(json.loads(json.dumps(ep.as_dict()))) == ep
    assert ep.tool_calls == 1 and ep.assistant_turns == 2  # counted from turns without an info count
    assert Episode("c", "a", ep.turns, {"tool_calls": 3}).tool_calls == 3  # the rollout's own count wins


def test_info_travels_as_json_and_bad_info_is_a_clear_error():
    t = Trajectory([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], [-1, 0, 0], answer="7", info={"tool_calls": 2})
    batch = pack_trajectories([t])
    assert json.loads(batch.meta["info"][0]) == {"tool_calls": 2}
    t.info = {"obj": object()}
    with pytest.raises(ValueError, match="Trajectory.info of sample 0 must be JSON-serialisable"):
        pack_trajectories([t])
    t.info = {"big": "x" * (MAX_INFO_BYTES + 1)}
    with pytest.raises(ValueError, match="at most"):
        info_json(t.info)


@pytest.fixture()
def tests_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


def test_the_reward_host_hands_the_episode_to_a_function_that_takes_it(tests_on_path, tmp_path):
    """A packed 2-turn trajectory (prompt, answer with a tool call, tool output, final answer)
    and a single-turn one; the reward fn encodes what it saw, scored in the real process pool."""
    from areal_graph.modelkit.tokenizer import save_tokenizer, train_tokenizer
    from areal_graph.runtime.hosts.reward_host import RewardHost

    tok = train_tokenizer(["what is 6*7? call the tool 42 the answer is 42"] * 20, vocab_size=300)
    save_tokenizer(tok, tmp_path / "tok")
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    prompt, call, out, final = enc("what is 6*7?"), enc(" call the tool"), enc(" 42"), enc(" the answer is 42")
    multi = Trajectory(
        list(prompt),
        [0] * len(prompt),
        [0.0] * len(prompt),
        [-1] * len(prompt),
        answer="42",
        info={"tool_calls": 1, "marker": 3},
    )
    multi.append(call, generated=True, logprobs=[-0.1] * len(call), versions=[0] * len(call))
    multi.append(out, generated=False)
    multi.append(final, generated=True, logprobs=[-0.1] * len(final), versions=[0] * len(final))
    single = Trajectory.from_generation(
        prompt, final, [-0.1] * len(final), [0] * len(final), "length", answer="42", sample_id=1
    )
    batch = pack_trajectories([multi, single])
    host = RewardHost(str(tmp_path / "tok"), fn="support.e2e_rewards:episode_fingerprint", num_workers=1)
    try:
        out, stats = host.score(batch)
    finally:
        host.close()
    # multi: 1 tool call, 2 assistant turns, 4 runs (p a e a), marker 3; single: 0 calls, 1 turn, 2 runs, truncated
    assert out["rewards"].tolist() == [100 + 20 + 4 + 3000, 0 + 10 + 2 + 0.5]
    assert stats == {"failures": 0.0}
    assert host.episodes(batch, host.completions(batch))[0].turns[2] == Turn("environment", " 42")


def test_pool_workers_exit_when_the_process_owning_the_pool_is_killed(tmp_path):
    """A SIGKILLed owner (e.g. a reward worker) must not leave its pool workers and forkserver behind."""
    import os
    import signal
    import subprocess
    import time

    import psutil

    code = (
        "from areal_graph.tools.reward_pool import RewardPool\n"
        "import sys, time\n"
        "pool = RewardPool(num_workers=2)\n"
        "print(pool.score(['\\\\boxed{1}'], ['1'])[0].reward, flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "1.0"
        family = psutil.Process(owner.pid).children(recursive=True)
        assert len(family) >= 3  # the forkserver, its two workers (and the resource tracker)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        deadline = time.monotonic() + 15
        while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family):
            assert time.monotonic() < deadline, [p.cmdline()[-1][:80] for p in family if p.is_running()]
            time.sleep(0.2)
    finally:
        if owner.poll() is None:
            owner.kill()


def test_the_agent_reward_is_the_one_the_agent_set():
    from areal_graph.api.reward_fns import resolve_reward_fn

    fn = resolve_reward_fn("agent")
    assert wants_episode(fn)
    assert fn("x", "", episode=Episode("x", "", info={"reward": 0.75})) == 0.75
    with pytest.raises(ValueError, match="no reward of its own"):
        fn("x", "", episode=Episode("x", "", info={}))


def test_validate_checks_the_agent_an_openai_rollout_names(tmp_path):
    """The shipped OpenAI-style workflow validates; a missing or wrong agent is named before anything starts."""
    from areal_graph.workflows.rollout.openai_agent import OpenAIAgentRollout

    assert OpenAIAgentRollout.check_args({"agent": "areal_graph.workflows.agents.calculator:calculator_agent"}) is None
    assert "no module named 'nope'" in OpenAIAgentRollout.check_args({"agent": "nope.mod:fn"})
    assert "must be an async function" in OpenAIAgentRollout.check_args(
        {"agent": "areal_graph.tools.calculator:calculate"}
    )
    assert "name the agent" in OpenAIAgentRollout.check_args({})
