"""`areal-graph tune --verify` end to end on the tiny test kit: it calibrates with a real run,
searches, runs the best configuration and the workflow as given, and says what each measured
(cli/cmd_tune.py, cli/measured_run.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from areal_graph.cli.measured_run import measured_run
from support.e2e import write_workflow
from support.paths import child_env


# ~45 s: three real runs. The default run keeps tests/cli/test_cmd_tune.py (a real calibration and
# ranking); this one, which also verifies the winner, runs with `make test-slow`.
@pytest.mark.slow
def test_tune_calibrates_searches_and_verifies(kit, tmp_path):
    wf = write_workflow(kit, tmp_path)
    small = [
        "runtime.batch_size=8",
        "nodes.rollout.group_size=4",
        "runtime.max_concurrent_rollouts=16",
        "nodes.rollout.sampling.max_new_tokens=16",
        "data.eval_size=8",
        "runtime.steps=6",
    ]
    cmd = [
        sys.executable,
        "-m",
        "areal_graph.cli.main",
        "tune",
        str(wf),
        *small,
        "--calibration-steps",
        "10",
        "--verify",
        "--verify-steps",
        "4",
        "--top",
        "2",
        "--seeds",
        "1",
        "--work-dir",
        str(tmp_path / "tune"),
        "--json",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=child_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert (tmp_path / "tune" / "calibration" / "trace.json").exists() and out["calibrated_on"].endswith("calibration")
    verified = {r["label"]: r for r in out["verify"]}
    assert set(verified) == {"best", "as given"}
    for row in verified.values():
        assert row["exit"] == 0 and row["measured_s"] > 0 and row["predicted_s"] > 0 and row["steps"] == 4


def test_a_run_that_fails_is_measured_as_failed(tmp_path):
    got = measured_run(tmp_path / "missing.yaml", [], tmp_path / "run", tmp_path / "run.log")
    assert got.exit_code != 0 and got.window_s is None and "missing.yaml" in (tmp_path / "run.log").read_text()
