"""The shipped verifiers workflow as a user runs it (`make test-verifiers`): `areal-graph run
workflows/verifiers_try_again.yaml` trains a verifiers environment from its own venv, logs the
environment's metrics, and `areal-graph eval --workflow RUN/config.yaml` scores what the run's
own evaluation scored."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from areal_graph.data import verifiers_tasks
from support.e2e import read_metrics
from support.paths import REPO

pytestmark = pytest.mark.verifiers


def cli(*args: str, cwd, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "areal_graph.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_a_verifiers_environment_trains_and_eval_agrees_with_the_run(tmp_path):
    try:
        verifiers_tasks.python()
    except verifiers_tasks.VerifiersError as err:
        pytest.skip(str(err))
    run_dir = tmp_path / "run"
    proc = cli(
        "run",
        str(REPO / "workflows" / "verifiers_try_again.yaml"),
        "--run-dir",
        str(run_dir),
        "runtime.steps=2",
        "runtime.eval_every=2",
        "data.eval_size=32",
        "runtime.batch_size=16",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = read_metrics(run_dir)
    steps = [m for m in metrics if "reward/mean" in m]
    assert len(steps) == 2 and all(1.0 <= m["env/turns"] <= 2.0 for m in steps)
    assert all(m["env/reward.right_early"] == pytest.approx(m["reward/mean"]) for m in steps)
    evals = [m for m in metrics if "eval/accuracy" in m]
    assert [m["step"] for m in evals] == [0, 2]
    out = tmp_path / "eval.json"
    got = cli(
        "eval",
        str(run_dir / "final_model"),
        "--workflow",
        str(run_dir / "config.yaml"),
        "--json",
        str(out),
        cwd=tmp_path,
    )
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["prompts"] == 32
    assert result["greedy_accuracy"] == pytest.approx(evals[-1]["eval/accuracy"])
    assert result["env"]["turns"] == pytest.approx(evals[-1]["eval/env/turns"])
