"""verifiers environments trained through VerifiersEnv, for real: verifiers 0.4 in its own venv
(`make install-verifiers`; these tests run with `make test-verifiers`), the builtin tiny-arith kit
behind a real inference server, the shipped example environments (workflows/verifiers_envs/).

Every reward is checked against an independent scorer of the policy's own tokens (the problems
are evaluated left to right here, not by the taskset), every trained token against what the
episode sampled, and the failures by what the user reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from areal_graph.api.sampling import SamplingParams
from areal_graph.data import verifiers_tasks
from areal_graph.workflows.rollout.verifiers_env import VerifiersEnv, VerifiersEpisodeFailed
from support.paths import FIXTURES

pytestmark = pytest.mark.verifiers
SAMPLE = SamplingParams(max_new_tokens=48, temperature=1.0)


@pytest.fixture(scope="module")
def python():
    try:
        return verifiers_tasks.python()
    except verifiers_tasks.VerifiersError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def kit_model():
    from areal_graph.modelkit.builtin import resolve_model_path

    return str(resolve_model_path("builtin:tiny-arith"))


@pytest.fixture(scope="module")
def server(kit_model, python):
    from areal_graph.engines.inference.server.process import ServerProcess

    proc = ServerProcess(kit_model, extra_args=["--threads", "1", "--max-running", "32"])
    proc.start()
    yield proc.url
    proc.stop()


class Row:
    """What the rollout worker hands a rollout class for one dataset row."""

    def __init__(self, row: dict) -> None:
        self.id, self.answer, self.input_ids = row["id"], row["answer"], [0]
        self.question = row["question"][-1]["content"]


def left_to_right(question: str) -> int:
    """The value of "What is 6 + 0 - 4?" evaluated left to right: the independent scorer."""
    tokens = re.findall(r"\d+|[+-]", question)
    value = int(tokens[0])
    for op, num in zip(tokens[1::2], tokens[2::2]):
        value = value + int(num) if op == "+" else value - int(num)
    return value


def boxed(text: str) -> int | None:
    found = re.findall(r"\\boxed\{(-?\d+)\}", text)
    return int(found[-1]) if found else None


def play(url: str, rollout: VerifiersEnv, rows: list[Row], group: int) -> list[list]:
    from areal_graph.engines.inference.client import InferenceClient

    async def run():
        client = InferenceClient(url)
        try:
            return [await rollout.run(row, client, group, SAMPLE) for row in rows]
        finally:
            await rollout.aclose()
            await client.close()

    return asyncio.run(run())


def answers(tok, traj) -> list[str]:
    """The policy's answers in a trajectory, one per turn (its runs of loss_mask 1)."""
    runs, current = [], []
    for t, m in zip(traj.input_ids, traj.loss_mask):
        if m:
            current.append(t)
        elif current:
            runs.append(current)
            current = []
    runs += [current] if current else []
    return [tok.decode(r, skip_special_tokens=True) for r in runs]


def test_listing_gives_the_tasksets_own_tasks_as_rows(python):
    rows = verifiers_tasks.list_tasks(verifiers_tasks.parse_spec("verifiers:vf_arith?size=6&seed=3"))
    again = verifiers_tasks.list_tasks(verifiers_tasks.parse_spec("verifiers:vf_arith?size=6&seed=3"))
    other = verifiers_tasks.list_tasks(verifiers_tasks.parse_spec("verifiers:vf_arith?size=6&seed=4"))
    assert rows == again and rows != other and len(rows) == 6
    assert [json.loads(r["answer"])["task"] for r in rows] == list(range(6))
    assert all(json.loads(r["answer"])["options"] == {"seed": 3} for r in rows)
    for r in rows:
        [message] = r["question"]
        assert message["role"] == "user" and 0 <= left_to_right(message["content"]) <= 9


def test_single_turn_rewards_are_the_rubrics_and_match_an_independent_scorer(server, kit_model):
    rows = [Row(r) for r in verifiers_tasks.list_tasks(verifiers_tasks.parse_spec("verifiers:vf_arith?size=4&seed=5"))]
    rollout = VerifiersEnv(kit_model)
    groups = play(server, rollout, rows, 4)
    rewards = []
    for row, group in zip(rows, groups):
        assert [t.sample_id for t in group] == [0, 1, 2, 3]
        for traj in group:
            [answer] = answers(rollout.tokenizer, traj)
            expected = float(boxed(answer) == left_to_right(row.question))
            assert traj.info["reward"] == expected and traj.info["metrics"]["reward.correct"] == expected
            assert traj.info["metrics"]["turns"] == 1 and traj.info["dropped_trajectories"] == 0
            prompt = rollout.tokenizer.apply_chat_template(
                [{"role": "user", "content": row.question}], add_generation_prompt=True, tokenize=False
            )
            assert rollout.tokenizer.decode(traj.input_ids[: traj.loss_mask.index(1)]) == prompt
            rewards.append(expected)
    assert 0 < sum(rewards) < len(rewards)  # the kit is right some of the time: the check can fail both ways


def test_a_multi_turn_environment_is_one_trajectory_per_episode(server, kit_model):
    rows = [
        Row(r)
        for r in verifiers_tasks.list_tasks(verifiers_tasks.parse_spec("verifiers:vf_arith_try_again?size=4&seed=5"))
    ]
    rollout = VerifiersEnv(kit_model)
    groups = play(server, rollout, rows, 6)
    turns_seen = set()
    for row, group in zip(rows, groups):
        truth = left_to_right(row.question)
        for traj in group:
            said = [boxed(a) for a in answers(rollout.tokenizer, traj)]
            turns = traj.info["metrics"]["turns"]
            turns_seen.add(turns)
            assert len(said) == turns == (1 if said[0] == truth else 2)
            expected = 1.0 if said[0] == truth else 0.5 if said[-1] == truth else 0.0
            assert traj.info["reward"] == expected and traj.info["metrics"]["solved_first"] == float(turns == 1)
            text = rollout.tokenizer.decode(traj.input_ids)
            assert ("That is not right. Try again:" in text) == (turns == 2)
            assert traj.info["dropped_trajectories"] == 0
    assert turns_seen == {1, 2}


def test_an_environment_that_raises_is_named_and_a_dead_runner_restarts(server, kit_model, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(FIXTURES / "verifiers_envs"))
    rows = [Row(r) for r in verifiers_tasks.list_tasks(verifiers_tasks.parse_spec("verifiers:vf_raises?size=2"))]
    with pytest.raises(VerifiersEpisodeFailed, match=r"'vf_raises'.*task 0: .*the board is on fire"):
        play(server, VerifiersEnv(kit_model), rows[:1], 2)
    with pytest.raises(verifiers_tasks.VerifiersError, match="no_such_taskset"):
        verifiers_tasks.list_tasks(verifiers_tasks.parse_spec("verifiers:no_such_taskset?size=2"))
    assert "no_such_taskset" in verifiers_tasks.check_spec("verifiers:no_such_taskset")  # what validate says
    assert verifiers_tasks.check_spec("verifiers:vf_raises?size=2") is None
    assert "did you mean 'vf_arith_try_again'" in verifiers_tasks.check_spec("verifiers:vf_arith_tryagain")

    from areal_graph.engines.inference.client import InferenceClient

    arith = [Row(r) for r in verifiers_tasks.list_tasks(verifiers_tasks.parse_spec("verifiers:vf_arith?size=2"))]
    rollout = VerifiersEnv(kit_model)

    async def kill_between_groups():
        client = InferenceClient(server)
        try:
            await rollout.run(arith[0], client, 2, SAMPLE)
            [runner] = rollout._runners.values()
            first = runner.proc.pid
            runner.proc.kill()
            await runner.proc.wait()
            group = await rollout.run(arith[1], client, 2, SAMPLE)
            return first, runner.proc.pid, group
        finally:
            await rollout.aclose()
            await client.close()

    first, second, group = asyncio.run(kill_between_groups())
    assert first != second and len(group) == 2 and all(t.info["metrics"]["turns"] == 1 for t in group)


def test_what_the_user_reads_for_a_wrong_env_argument_and_an_unimportable_package(python, tmp_path, monkeypatch):
    said = VerifiersEnv.check_data({"env_args": {"invalid_retries": 2}}, "verifiers:vf_arith_try_again?size=8")
    assert said.startswith("rollout_args.env_args: 'invalid_retries' is not a field of SingleAgentEnvConfig")
    assert "(its fields: timeout, retries, max_concurrent_agents, interception, agent)" in said
    assert VerifiersEnv.check_data({"env_args": {"agent": {"max_turns": 2}}}, "verifiers:vf_arith?size=8") is None
    option = verifiers_tasks.check_spec("verifiers:vf_arith?size=2&sede=3")
    assert (
        "'sede' is not an option of taskset 'vf_arith' (the fields of ArithConfig: task, system_prompt, seed)" in option
    )
    # a package two folders below where the user is: our message, not verifiers' "must already be installed"
    package = tmp_path / "envs" / "tasks" / "vf_mine"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text((verifiers_tasks.EXAMPLES / "vf_arith" / "__init__.py").read_text())
    monkeypatch.chdir(tmp_path)
    problem = verifiers_tasks.check_spec("verifiers:vf_mine?size=2")
    assert "the taskset package 'vf_mine' is not importable" in problem and "must already be installed" not in problem
    assert f"a package 'vf_mine' is in {tmp_path / 'envs' / 'tasks'}" in problem and "`python_path:`" in problem
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "envs" / "tasks"))  # what python_path: [envs/tasks] does
    assert verifiers_tasks.check_spec("verifiers:vf_mine?size=2") is None


def test_eval_of_a_rubric_that_raises_is_one_line_and_the_log_has_verifiers_traceback(python, tmp_path, monkeypatch):
    from areal_graph.cli.main import main

    workflow = (verifiers_tasks.PACKAGE / "workflows" / "verifiers_try_again.yaml").read_text()
    workflow = workflow.replace("vf_arith_try_again?size=2000&seed=1", "vf_rubric_raises?size=2")
    workflow = workflow.replace("vf_arith_try_again?size=128&seed=2", "vf_rubric_raises?size=2")
    path = tmp_path / "wf.yaml"
    path.write_text(workflow + f"python_path: [{FIXTURES / 'verifiers_envs'}]\n")
    monkeypatch.setenv("COLUMNS", "400")
    buffer = io.StringIO()
    with contextlib.redirect_stderr(buffer):
        code = main(["eval", "builtin:tiny-arith", "--workflow", str(path), "--limit", "2"])
    text = buffer.getvalue()
    assert code == 1
    [line] = [x for x in text.splitlines() if x.strip() and "it/s]" not in x]
    assert line.startswith("eval: the rollout class areal_graph.workflows.rollout.verifiers_env:VerifiersEnv failed: ")
    assert 'TaskError: task RubricRaisesTask scoring: KeyError: "the rubric\'s answer key"' in line
    log = Path(re.search(r"\(traceback in (\S+\.log)\)$", line).group(1))
    logged = log.read_text()
    assert "VerifiersEpisodeFailed" in logged and 'raise KeyError("the rubric' in logged  # verifiers' own traceback
    log.unlink()
