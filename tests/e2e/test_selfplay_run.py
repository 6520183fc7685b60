"""The shipped self-play workflow trained for a few steps as a user runs it: both seats of every
game are trained with a baseline per seat, and the evaluation plays the fixed opponents from both
seats (workflows/textarena_selfplay.yaml on the shipped kit tiny-tictactoe)."""

from __future__ import annotations

import pytest

from support.ci import optional
from support.e2e import read_metrics, run_cli
from support.paths import WORKFLOWS


def test_the_selfplay_workflow_trains_both_seats_and_evaluates_against_fixed_opponents(tmp_path):
    optional("textarena", "pip install 'textarena==0.7.4' (in the dev extra)")
    run_dir = tmp_path / "run"
    proc = run_cli(
        WORKFLOWS / "textarena_selfplay.yaml",
        run_dir,
        "runtime.steps=2",
        "runtime.batch_size=8",
        "runtime.eval_every=2",
        "data.eval_size=4",
        "runtime.max_staleness=1",
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = read_metrics(run_dir)
    steps = [m for m in metrics if "reward/mean" in m]
    assert len(steps) == 2
    for m in steps:
        # every game is one seat's win and the other's loss, or a draw for both: zero-sum
        assert m["env/won"] == pytest.approx(m["env/lost"]) and m["reward/mean"] == pytest.approx(0.0, abs=1e-6)
        # a game cut at the context is unfinished: no outcome
        assert m["env/won_seat0"] + m["env/drawn_seat0"] + m["env/lost_seat0"] == pytest.approx(m["env/finished"])
        assert m["env/won_seat0"] == pytest.approx(m["env/lost_seat1"])
    evals = [m for m in metrics if "eval/accuracy" in m]
    assert [m["step"] for m in evals] == [0, 2]
    for m in evals:  # 4 rows: each opponent from each seat
        for opponent in ("random", "heuristic"):
            for seat in (0, 1):
                outcome = [m[f"eval/env/{k}_vs_{opponent}_seat{seat}"] for k in ("won", "drawn", "lost")]
                assert sum(outcome) == pytest.approx(1.0) and all(v in (0.0, 1.0) for v in outcome)
        assert m["eval/accuracy"] == pytest.approx(m["eval/env/won"])
