"""`areal-graph validate` and `areal-graph plot` as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET

from areal_graph.cli.main import main
from support.paths import FIXTURES, REPO

DATA = FIXTURES


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "areal_graph.cli.main", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_validate_good_file_subprocess():
    out = _cli("validate", str(REPO / "workflows/ppo_gae_critic.yaml"))
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "OK" in text and "ppo_gae_critic" in text
    for word in (
        "train_critic",
        "critic",
        "values",
        "returns",
        "new weights",
        "per prompt group (before the sample buffer): rollout -> reward",
        # the two train nodes live on different processes and depend only on advantages
        "per step of B trajectories: value -> advantage -> train_actor || train_critic",
        "fused: 'prox_logp' is not run; 'train_actor' takes its output from the training forward",
        "model-critic [value, train_critic]",
    ):
        assert word in text, word
    assert "Traceback" not in out.stderr


def test_validate_bad_file_subprocess():
    path = DATA / "broken/unknown_model.yaml"
    out = _cli("validate", str(path), "--set", "runtime.steps=0")
    assert out.returncode == 1
    text = out.stdout + out.stderr
    assert "Traceback" not in text
    assert "2 problem(s)" in text
    assert f"{path}:28, node 'prox_logp', field 'model': unknown model 'actr' (did you mean 'actor'?)" in text
    assert "field 'runtime.steps': must be > 0, got 0 (set by override 'runtime.steps=0')" in text


def test_validate_set_override_changes_summary(capsys):
    rc = main(["validate", str(DATA / "minimal.yaml"), "--set", "runtime.max_staleness=0"])
    assert rc == 0
    assert "max staleness 0" in capsys.readouterr().out


def test_plot_writes_three_files(tmp_path, capsys):
    rc = main(["plot", str(REPO / "workflows/ppo_async.yaml"), "-o", str(tmp_path / "plots")])
    assert rc == 0
    files = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert files == ["ppo_async.dot", "ppo_async.mmd", "ppo_async.svg"]
    ET.parse(tmp_path / "plots/ppo_async.svg")
    assert "prox_logp" in (tmp_path / "plots/ppo_async.dot").read_text()
    assert "wrote" in capsys.readouterr().out


def test_plot_bad_file_exits_1(tmp_path, capsys):
    rc = main(["plot", str(DATA / "broken/cycle.yaml"), "-o", str(tmp_path)])
    assert rc == 1
    assert "dependency cycle" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_validate_schema_prints_field_reference(capsys):
    assert main(["validate", "--schema"]) == 0
    out = capsys.readouterr().out
    for word in ("max_staleness", "clip_eps", "group_size", "max_new_tokens", "lr_schedule"):
        assert word in out


def test_validate_without_file_is_usage_error(capsys):
    assert main(["validate"]) == 2
    assert "needs a WORKFLOW" in capsys.readouterr().out
