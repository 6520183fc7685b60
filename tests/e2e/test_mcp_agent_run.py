"""The shipped MCP tool workflow (workflows/agent_calculator_mcp.yaml) trained for a few steps
through `areal-graph run`, as a user starts it: the rollout worker starts the calculator MCP
server, the policy's calls go through the MCP client, rewards are computed and the actor
trains. On a tiny model that replays one calculator episode (support/calc_memorised.py), so
that the run is short and the calls are real; the kit itself learns in the slow test."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from support.e2e import read_metrics, run_cli
from support.paths import WORKFLOWS

SHORT = [
    "runtime.steps=3",
    "runtime.batch_size=8",
    "nodes.rollout.group_size=4",
    "runtime.eval_every=3",
    "data.eval_size=4",
    "runtime.save_every=3",
    "runtime.max_tokens_per_microbatch=512",
]


def test_agent_calculator_mcp_trains_with_tool_calls_through_mcp(memorised_calc, tmp_path):
    root, row, _ = memorised_calc
    text = (WORKFLOWS / "agent_calculator_mcp.yaml").read_text()
    text = text.replace("builtin:tiny-calc", str(root / "model"))
    text = text.replace("builtin:calc/train", str(root / "train.jsonl")).replace(
        "builtin:calc/test", str(root / "test.jsonl")
    )
    wf = tmp_path / "wf.yaml"
    wf.write_text(text)
    run_dir = tmp_path / "run"
    proc = run_cli(wf, run_dir, *SHORT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = read_metrics(run_dir)
    steps = [m for m in metrics if "rollout/tool_call_rate" in m]
    assert len(steps) == 3
    assert all(m["env/mcp_calls"] > 0 for m in steps), steps  # every step's batch called through MCP
    assert all(m["rollout/tool_call_rate"] > 0 for m in steps)
    assert all(m["env/mcp_unknown_tool_calls"] >= 0 and "reward/mean" in m for m in steps), steps[0].keys()
    evals = [m for m in metrics if "eval/accuracy" in m]
    assert evals and evals[0]["eval/tool_call_rate"] == 1.0 and evals[0]["eval/accuracy"] == 1.0  # greedy replays it
    assert (run_dir / "final_model").is_dir()


@pytest.mark.slow
def test_agent_calculator_mcp_learns_to_call_the_calculator(tmp_path):
    """The shipped workflow on the builtin kit, whole: greedy test accuracy (the MCP tool
    available) rises by >= 15 points, and the tool-call rate with it, as agent_calculator.yaml's."""
    from areal_graph.modelkit.builtin import resolve_model_path

    resolve_model_path("builtin:tiny-calc")  # the one-off kit build is not part of the run
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "areal_graph.cli.main", "run", str(WORKFLOWS / "agent_calculator_mcp.yaml")]
    t0 = time.monotonic()
    proc = subprocess.run(
        [*cmd, "--run-dir", str(run_dir), "data.eval_size=500"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "COLUMNS": "200"},
    )
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    evals = [m for m in read_metrics(run_dir) if "eval/accuracy" in m]
    accs = [m["eval/accuracy"] for m in evals]
    calls = [m["eval/tool_call_rate"] for m in evals]
    assert accs[-1] - accs[0] >= 0.15, accs
    assert calls[-1] - calls[0] >= 0.15, calls
    assert wall < 600, f"{wall:.0f} s"
