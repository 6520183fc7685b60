"""`python_path` and the workflow's own folder (graph/loader.py, api/imports.py): what a workflow
imports is found by every command and recorded in the run's config.yaml; bad entries name the field."""

from __future__ import annotations

import os
import sys

import pytest

from areal_graph.api import imports
from areal_graph.graph.dump import dump_workflow
from areal_graph.graph.loader import WorkflowError, load_workflow, load_workflow_text
from support.paths import FIXTURES

MINIMAL = (FIXTURES / "minimal.yaml").read_text()


@pytest.fixture(autouse=True)
def clean_roots(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.setattr(imports, "_ROOTS", [])
    yield
    sys.modules.pop("my_rewards", None)  # each test's project has its own


def project(tmp_path, reward_fn: str, python_path: str = ""):
    """A workflow in tmp/proj whose reward fn lives in tmp/proj/src/my_rewards.py."""
    (tmp_path / "proj" / "src").mkdir(parents=True)
    (tmp_path / "proj" / "src" / "my_rewards.py").write_text("def score(completion, answer):\n    return 1.0\n")
    text = MINIMAL.replace("  reward:\n    kind: reward\n", f"  reward:\n    kind: reward\n    fn: {reward_fn}\n")
    wf = tmp_path / "proj" / "wf.yaml"
    wf.write_text(python_path + text)
    return wf


def test_python_path_entries_are_relative_to_the_file_and_recorded_absolute(tmp_path):
    wf = project(tmp_path, "my_rewards:score", "python_path: [src]\n")
    spec = load_workflow(wf)
    src = str((tmp_path / "proj" / "src").resolve())
    # the workflow's own folder (code one level down: src/) and src itself
    assert spec.python_path == (str((tmp_path / "proj").resolve()), src)
    assert sys.path[:2] == list(spec.python_path) and os.environ["PYTHONPATH"].split(os.pathsep)[:2] == list(
        spec.python_path
    )
    dumped = dump_workflow(spec)
    assert "python_path:" in dumped
    assert load_workflow_text(dumped).python_path == spec.python_path  # a run dir imports what its run imported


def test_without_python_path_the_module_is_not_found_and_the_error_says_how(tmp_path):
    wf = project(tmp_path, "my_rewards:score")
    with pytest.raises(WorkflowError) as err:
        load_workflow(wf)
    text = str(err.value)
    assert "node 'reward', field 'fn'" in text and "no module named 'my_rewards'" in text
    assert str((tmp_path / "proj").resolve()) in text  # where it looked


@pytest.mark.parametrize(
    "value,message",
    [
        ("[nowhere]", "wf.yaml:1, field 'python_path': 'nowhere' is not a folder"),
        ("src", "field 'python_path': expected a list of folders"),
        ("[1]", "field 'python_path': expected a list of folders"),
    ],
)
def test_bad_python_path_entries_name_the_field(tmp_path, value, message):
    wf = project(tmp_path, "math_verify", f"python_path: {value}\n")
    with pytest.raises(WorkflowError) as err:
        load_workflow(wf)
    assert message in str(err.value)


def test_a_reasoning_gym_reward_needs_reasoning_gym_data(tmp_path):
    wf = tmp_path / "wf.yaml"
    wf.write_text(
        MINIMAL.replace("  reward:\n    kind: reward\n", "  reward:\n    kind: reward\n    fn: reasoning_gym\n")
    )
    with pytest.raises(
        WorkflowError,
        match=r"fn: reasoning_gym cannot score data.train \(builtin:arith/train\): .*; "
        r"use fn: math_verify or fn: agent; to pair them on purpose, set check_data_fit: false on nodes.reward",
    ):
        load_workflow(wf)
