"""A reward function that fails: now and then, the failed answers score 0 and are counted (the
rest of the call counts); on every answer of a call, the call fails with the function's own error
(RewardFailed), which the controller retries and, when it keeps failing, stops the run on."""

from __future__ import annotations

import pytest

from areal_graph.api.rollout import Trajectory
from areal_graph.workflows.rollout.base import pack_trajectories
from support.paths import TESTS


@pytest.fixture
def host_for(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(TESTS))
    from areal_graph.modelkit.tokenizer import save_tokenizer, train_tokenizer
    from areal_graph.runtime.hosts.reward_host import RewardHost

    tok = train_tokenizer(["the answer is 42 and 7 or 77"] * 20, vocab_size=300)
    save_tokenizer(tok, tmp_path / "tok")
    hosts = []

    def make(fn: str) -> tuple[RewardHost, object]:
        hosts.append(RewardHost(str(tmp_path / "tok"), fn=fn, num_workers=1))
        return hosts[-1], tok

    yield make
    for h in hosts:
        h.close()


def batch_of(tok, answers: list[str]):
    trajectories = []
    for i, text in enumerate(answers):
        prompt, out = tok.encode("the answer is", add_special_tokens=False), tok.encode(text, add_special_tokens=False)
        trajectories.append(
            Trajectory.from_generation(prompt, out, [-0.1] * len(out), [0] * len(out), "stop", answer="42", sample_id=i)
        )
    return pack_trajectories(trajectories)


def test_some_failures_score_zero_and_are_counted(host_for):
    host, tok = host_for("support.e2e_rewards:fails_on_odd_length")
    batch = batch_of(tok, [" 42", " 7", " 77"])
    completions = host.completions(batch)
    out, stats = host.score(batch)
    expect = [0.0 if len(c) % 2 else 1.0 for c in completions]
    assert 0 < expect.count(0.0) < 3, completions  # the case needs both kinds
    assert out["rewards"].tolist() == expect and stats == {"failures": float(expect.count(0.0))}


def test_a_call_whose_every_answer_fails_raises_the_functions_error(host_for):
    from areal_graph.runtime.hosts.reward_host import RewardFailed

    host, tok = host_for("support.e2e_rewards:always_fails")
    with pytest.raises(
        RewardFailed,
        match=r"reward fn 'support.e2e_rewards:always_fails' failed on all 2 answers "
        r"\(error\): RuntimeError: the grader's database is down",
    ):
        host.score(batch_of(tok, [" 42", " 7"]))


def test_a_worker_error_is_one_line_on_the_console():
    from areal_graph.runtime.orchestration.controller import NodeFailed
    from areal_graph.runtime.rpc.worker_client import WorkerError

    remote = (
        "worker reward: Execute 'reward'.score raised\nTraceback (most recent call last):\n"
        '  File "x.py", line 1, in score\n    raise RewardFailed(...)\n'
        "areal_graph.runtime.hosts.reward_host.RewardFailed: reward fn 'f' failed on all 8 answers\n"
    )
    err = WorkerError("reward", "RewardHost", "score", remote)
    assert err.summary == "areal_graph.runtime.hosts.reward_host.RewardFailed: reward fn 'f' failed on all 8 answers"
    message = str(NodeFailed("reward", "reward f", err))
    assert message == (
        "node 'reward' (reward f): areal_graph.runtime.hosts.reward_host.RewardFailed: reward fn 'f' "
        "failed on all 8 answers (traceback in logs/reward.log)"
    )
    assert "\n" not in message
