"""Authoring a workflow the project does not ship (issue 34), as a user would: a two-turn "try
again" environment next to its workflow file (tests/fixtures/try_again/), run from another folder
with no PYTHONPATH, evaluated by `areal-graph eval --workflow` exactly as the run evaluates; and a
reward function with a bug stops the run with its own error, in a few lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support.e2e import SMALL, read_metrics, run_cli, write_workflow
from support.paths import FIXTURES

TRY_AGAIN = FIXTURES / "try_again" / "try_again.yaml"


def cli(*args: str, cwd, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the workflow's folder must be enough
    env["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, "-m", "areal_graph.cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ~35 s (a run, then eval): `make test-slow`; tests/cli/test_cmd_eval.py keeps eval --workflow in the default run
@pytest.mark.slow
def test_eval_with_the_runs_workflow_scores_what_the_runs_own_evaluation_scored(tmp_path):
    """The run evaluates before its step and after it; `eval --workflow RUN/config.yaml` of the
    initial and the final model gives the same accuracy (episode reward: 1 first try, 0.5 second;
    correct above 0.5) and the same environment metrics."""
    run_dir = tmp_path / "run"
    proc = cli(
        "run",
        str(TRY_AGAIN),
        "--run-dir",
        str(run_dir),
        "runtime.steps=1",
        "runtime.eval_every=1",
        "data.eval_size=48",
        "runtime.batch_size=16",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    evals = [m for m in read_metrics(run_dir) if "eval/accuracy" in m]
    assert [m["step"] for m in evals] == [0, 1]
    # every training request in the trace says which group, episode (answer) and turn it was
    trace = json.loads((run_dir / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    requests = [e["args"] for e in events if e.get("name") == "request" and e.get("cat") == "request"]
    assert requests and all({"group", "episode", "turn"} <= set(a) for a in requests)
    train = [a for a in requests if a["group"] >= 0]
    assert {a["turn"] for a in train} == {0, 1} and {a["episode"] for a in train} == set(range(8))
    assert {a["group"] for a in requests if a["group"] < 0} == set(range(-48, 0))  # the evaluations': 1 answer
    assert {a["episode"] for a in requests if a["group"] < 0} == {0}
    turns: dict[tuple[int, int], dict[str, int]] = {}  # (each evaluation reuses the group ids -48..-1)
    for a in train:  # a request resubmitted after an interruption keeps its id and its turn
        turns.setdefault((a["group"], a["episode"]), {})[a["rid"]] = a["turn"]
    assert all(sorted(t.values()) in ([0], [0, 1]) for t in turns.values())  # a first turn each, then maybe one more
    for model, logged in (("builtin:tiny-arith", evals[0]), (str(run_dir / "final_model"), evals[1])):
        out = tmp_path / "eval.json"
        got = cli(
            "eval", model, "--workflow", str(run_dir / "config.yaml"), "--json", str(out), "--show", "2", cwd=tmp_path
        )
        assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
        result = json.loads(out.read_text())
        assert result["prompts"] == 48
        assert result["greedy_accuracy"] == pytest.approx(logged["eval/accuracy"])
        assert result["env"]["solved_first"] == pytest.approx(logged["eval/env/solved_first"])
        assert result["env"]["turns"] == pytest.approx(logged["eval/env/turns"])
        assert 0.0 < result["greedy_accuracy"] < 1.0  # a model that is sometimes right: the comparison means something
        second = [p for p in result["per_prompt"] if len(p["greedy_turns"]) == 3]  # model, env, model
        assert second and all(
            p["greedy_turns"][1][1].startswith("userThat is not right. Try again: What is")
            or "Try again: What is" in p["greedy_turns"][1][1]
            for p in second
        )
        assert all(p["greedy_reward"] in (0.0, 0.5, 1.0) for p in result["per_prompt"])
        assert "    env: " in got.stdout and "    model: " in got.stdout  # --show prints the turns, labelled


def test_a_reward_that_always_fails_stops_the_run_with_its_error(kit, tmp_path):
    """As a rollout that always raises does: groups are retried, then counted, and when they keep
    failing the run stops naming the node, the function and its exception, without a traceback
    per group on the console."""
    wf = write_workflow(kit, tmp_path)
    overrides = [o for o in SMALL if not o.startswith(("nodes.reward.fn", "runtime.eval_every"))]
    proc = run_cli(
        wf, tmp_path / "run", *overrides, "runtime.eval_every=0", "nodes.reward.fn=support.e2e_rewards:always_fails"
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "node 'reward' (reward support.e2e_rewards:always_fails)" in out
    assert "RuntimeError: the grader's database is down" in out
    assert "prompt groups in a row failed" in out
    assert out.count("Traceback") == 0 and len(out.splitlines()) < 150, out[-5000:]


@pytest.mark.slow
def test_a_reward_that_always_fails_at_the_step_0_evaluation_stops_the_run_there(kit, tmp_path):
    """The same error, met first by the evaluation at step 0 (a second whole run: `make test-slow`)."""
    wf = write_workflow(kit, tmp_path)
    overrides = [o for o in SMALL if not o.startswith(("nodes.reward.fn", "runtime.eval_every"))]
    proc = run_cli(
        wf, tmp_path / "run2", *overrides, "runtime.eval_every=3", "nodes.reward.fn=support.e2e_rewards:always_fails"
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "the grader's database is down" in out and out.count("Traceback") == 0, out[-3000:]
