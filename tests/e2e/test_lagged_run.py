"""A lagged copy of the policy as the opponent, in a whole run as a user starts it: the shipped
self-play workflow with `models.opponent.lagged: {refresh_every: 2}` and `opponent: model:opponent`
(tests/support/lagged.py). The run starts the copy's own inference server, which loads the actor's
weights at versions 2 and 4 (each load checked against what was published), and the trained seats
play against it; the copy's moves are context, so both zero-sum bookkeeping and the per-opponent
metrics hold as with the fixed opponents."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.ci import optional
from support.e2e import kill_during_run, read_metrics, run_cli
from support.lagged import OPPONENT, lagged_selfplay_text
from support.paths import child_env


@pytest.mark.slow  # ~40 s on two cores: two servers and three workers, four steps
def test_a_lagged_copy_plays_the_opponent_and_loads_every_second_version(tmp_path):
    optional("textarena", "pip install 'textarena==0.7.4' (in the dev extra)")
    wf = tmp_path / "lagged.yaml"
    wf.write_text(lagged_selfplay_text(refresh_every=2), encoding="utf-8")
    run_dir = tmp_path / "run"
    proc = run_cli(
        wf,
        run_dir,
        OPPONENT,
        "runtime.steps=4",
        "runtime.batch_size=8",
        "runtime.eval_every=0",
        "runtime.max_staleness=1",
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = [m for m in read_metrics(run_dir) if "reward/mean" in m]
    assert len(steps) == 4
    # after the sync to version v the copy holds the last multiple of 2: none loaded before version 2
    assert [m["lagged/opponent/version"] for m in steps] == [0.0, 2.0, 2.0, 4.0]
    for m in steps:  # every trained trajectory was a game against the copy, from seat 0 or seat 1
        outcome = sum(m[f"env/{k}_vs_opponent"] for k in ("won", "drawn", "lost"))
        assert outcome == pytest.approx(m["env/finished"])
        assert m["env/won_vs_opponent"] == pytest.approx(m["env/won"])
        assert 0.0 <= m["env/opponent_version"] <= m["lagged/opponent/version"]
        assert m["env/opponent_lag"] >= 0.0
    assert steps[0]["env/opponent_version"] == 0.0  # the first batch: the copy on the actor's initial weights
    assert steps[-1]["env/opponent_version"] > 0.0  # by the last, games against refreshed weights
    trace = json.loads((run_dir / "trace.json").read_text())
    processes = {e["args"]["name"] for e in trace if e.get("name") == "process_name"}
    assert {"inference-0", "lagged-opponent-0"} <= processes, processes


@pytest.mark.slow  # ~60 s on two cores
def test_a_killed_lagged_server_comes_back_on_its_groups_version(tmp_path):
    """SIGKILL the lagged server after step 3: it is restarted on its group's committed version
    (2, while the policy's servers hold 3), the rollout's calls that died with it are redone,
    and the copy goes on loading every second version."""
    optional("textarena", "pip install 'textarena==0.7.4' (in the dev extra)")
    wf = tmp_path / "lagged.yaml"
    wf.write_text(lagged_selfplay_text(refresh_every=2), encoding="utf-8")
    run_dir, steps = tmp_path / "run", 6
    cmd = [sys.executable, "-m", "areal_graph.cli.main", "run", str(wf), "--run-dir", str(run_dir), OPPONENT]
    cmd += [f"runtime.steps={steps}", "runtime.batch_size=8", "runtime.eval_every=0", "runtime.max_staleness=1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env())
    try:
        kill_during_run(proc, run_dir, "lagged-opponent-0", after_step=3)
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    assert "lagged-opponent-0 is back on weight version 2" in out, out[-3000:]
    steps_logged = [m for m in read_metrics(run_dir) if "reward/mean" in m]
    assert [m["lagged/opponent/version"] for m in steps_logged] == [0.0, 2.0, 2.0, 4.0, 4.0, 6.0]
    summary = json.loads((run_dir / "end_state.json").read_text())
    assert summary["process_restarts"] == {"lagged-opponent-0": 1}
    assert summary["trajectories_trained"] == steps * 8 and summary["groups_failed"] == 0
