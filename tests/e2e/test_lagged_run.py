"""A lagged copy of the policy as the opponent, in a whole run as a user starts it: the shipped
self-play workflow with `models.opponent.lagged: {refresh_every: 2}` and `opponent: model:opponent`
(tests/support/lagged.py). The run starts the copy's own inference server, which loads the actor's
weights at versions 2 and 4 (each load checked against what was published), and the trained seats
play against it; the copy's moves are context, so both zero-sum bookkeeping and the per-opponent
metrics hold as with the fixed opponents."""

from __future__ import annotations

import json

import pytest

from support.ci import optional
from support.e2e import read_metrics, run_cli
from support.lagged import OPPONENT, lagged_selfplay_text


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
