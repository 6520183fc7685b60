"""verifiers: datasets without verifiers installed: the spec's grammar, the missing-venv error, and
the runner's seat defaults (the rows themselves: tests/workflows/test_verifiers_env.py, `make
test-verifiers`)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from areal_graph.data import generated, verifiers_failures, verifiers_tasks, verifiers_venv
from areal_graph.workflows.rollout import verifiers_runner


def test_a_spec_names_the_taskset_its_size_env_and_config_fields():
    spec = verifiers_tasks.parse_spec("verifiers:vf_arith?size=12&seed=3&split=test&hard=true&env=my_env")
    assert spec == {
        "taskset": "vf_arith",
        "env": "my_env",
        "size": 12,
        "options": {"seed": 3, "split": "test", "hard": True},
    }
    assert verifiers_tasks.parse_spec("verifiers:vf_arith")["size"] == 1000
    assert generated.source_of("verifiers:vf_arith") is verifiers_tasks


@pytest.mark.parametrize(
    "spec, says",
    [
        ("verifiers:", "name a taskset"),
        ("verifiers:x?size=0", "size must be"),
        ("verifiers:x?size=ten", "integer"),
        ("verifiers:x?seed", "not key=value"),
    ],
)
def test_a_bad_spec_says_what_is_wrong(spec, says):
    with pytest.raises(verifiers_tasks.VerifiersError, match=says):
        verifiers_tasks.parse_spec(spec)


def _fake_python(folder: Path) -> Path:
    """`folder`/.venv-verifiers/bin/python as an executable file (never run by the lookup)."""
    python = folder / ".venv-verifiers" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    return python


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """No verifiers venv anywhere: the package in an empty folder (as in site-packages), no
    AREAL_VERIFIERS_PYTHON, the current directory and PYTHONPATH empty folders."""
    monkeypatch.delenv(verifiers_venv.PYTHON_ENV, raising=False)
    monkeypatch.setattr(verifiers_venv, "PACKAGE", tmp_path / "site-packages" / "areal_graph")
    (tmp_path / "project" / "sub").mkdir(parents=True)
    (tmp_path / "workflows").mkdir()
    monkeypatch.chdir(tmp_path / "project" / "sub")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "workflows"))
    return tmp_path


def test_without_verifiers_venv_the_error_says_where_it_looked_and_how_to_make_one(nowhere, monkeypatch):
    problem = generated.check("verifiers:vf_arith?size=10")
    assert "openai<3" in problem and "none was found" in problem
    # where it looked: the package's folder, the current directory and up, the workflow's folders and up
    assert f"the package's folder ({nowhere / 'site-packages' / 'areal_graph'})" in problem
    assert f"in {nowhere / 'project' / 'sub'} or its parents" in problem
    assert f"the workflow's import folders ({nowhere / 'workflows'}) or their parents" in problem
    # how to make one: in a checkout, and anywhere (the pins inline), or name one
    assert "in a checkout of areal-graph, `make install-verifiers`" in problem
    assert "`python3.11 -m venv .venv-verifiers && .venv-verifiers/bin/pip install 'verifiers==0.4.0'`" in problem
    assert "AREAL_VERIFIERS_PYTHON" in problem
    monkeypatch.setenv(verifiers_venv.PYTHON_ENV, str(nowhere / "nope" / "python"))
    assert "no such file" in generated.check("verifiers:vf_arith")


def test_the_venv_is_found_by_the_variable_then_the_package_then_here_then_the_workflow(nowhere, monkeypatch):
    workflow_side = _fake_python(nowhere / "workflows")  # in the workflow's folder (PYTHONPATH)
    assert verifiers_tasks.python() == str(workflow_side)
    monkeypatch.setenv("PYTHONPATH", str(nowhere / "workflows" / "deep" / "er"))
    assert verifiers_tasks.python() == str(workflow_side)  # or a parent of it
    here = _fake_python(nowhere / "project")  # a parent of the current directory: before the workflow's
    assert verifiers_tasks.python() == str(here)
    verifiers_venv.PACKAGE.mkdir(parents=True)
    editable = _fake_python(verifiers_venv.PACKAGE)  # the package's own checkout (editable): before both
    assert verifiers_tasks.python() == str(editable)
    monkeypatch.setenv(verifiers_venv.PYTHON_ENV, str(workflow_side))
    assert verifiers_tasks.python() == str(workflow_side)  # the variable before all


def test_the_pins_ship_with_the_package_and_the_message_reads_them():
    assert verifiers_venv.REQUIREMENTS.is_file()
    assert verifiers_venv.pins() == ["verifiers==0.4.0"]
    data = tomllib.loads((verifiers_venv.PACKAGE / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = data["package-data"]
    assert "requirements-verifiers.txt" in shipped["areal_graph"]
    # the example environments ship too (an installed package's `verifiers:vf_arith` needs them)
    workflows = verifiers_venv.PACKAGE / "workflows"
    files = {p for pattern in shipped["areal_graph.workflows"] for p in workflows.glob(pattern)}
    assert {workflows / "verifiers_envs" / n / "__init__.py" for n in ("vf_arith", "vf_arith_try_again")} <= files


def test_the_shipped_examples_are_on_the_runners_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/mine")
    path = verifiers_tasks.runner_env()["PYTHONPATH"].split(":")
    assert path == ["/somewhere/mine", str(verifiers_tasks.EXAMPLES)]
    assert (verifiers_tasks.EXAMPLES / "vf_arith" / "__init__.py").is_file()


def test_every_seat_gets_the_in_process_harness_and_untrained_seats_the_policy_unrecorded():
    given = {"user": {"max_turns": 4}, "judge": {"client": {"base_url": "http://judge/v1"}, "model": "big"}}
    out = verifiers_runner._seat_defaults(
        given, ["assistant", "user", "judge"], "assistant", "http://proxy/untrained/v1"
    )
    assert out["assistant"] == {"harness": {"id": "areal_chat"}, "runtime": {"type": "subprocess"}}
    assert out["user"]["max_turns"] == 4 and out["user"]["client"]["base_url"] == "http://proxy/untrained/v1"
    assert out["judge"]["client"] == {"base_url": "http://judge/v1"} and out["judge"]["model"] == "big"
    assert given == {"user": {"max_turns": 4}, "judge": {"client": {"base_url": "http://judge/v1"}, "model": "big"}}


def _package(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    return folder


def _not_found(module: str, missing: str = "") -> dict:
    return {"kind": "taskset", "id": module, "module": module, "missing": missing or module, "python": "/vf/python"}


def test_a_package_two_folders_below_is_named_with_the_python_path_that_fixes_it(tmp_path):
    _package(tmp_path / "proj" / "envs" / "tasks" / "vf_mine")
    examples = tmp_path / "examples"
    said = verifiers_failures.explain_not_importable(_not_found("vf_mine"), str(examples), cwd=tmp_path / "proj")
    assert said.startswith("the taskset package 'vf_mine' is not importable in verifiers' venv")
    assert f"looked in {examples} and in the packages installed for /vf/python" in said
    assert f"a package 'vf_mine' is in {tmp_path / 'proj' / 'envs' / 'tasks'} (./envs/tasks from here)" in said
    assert "add that folder to the workflow's `python_path:`" in said and "must already be installed" not in said


def test_a_package_found_nowhere_gets_the_nearest_names_and_the_two_fixes(tmp_path):
    _package(tmp_path / "wf" / "vf_arith_try_again")
    said = verifiers_failures.explain_not_importable(_not_found("vf_arith_tryagain"), str(tmp_path / "wf"), tmp_path)
    assert "put the package 'vf_arith_tryagain' next to the workflow file" in said
    assert "`python_path:` (did you mean 'vf_arith_try_again'?)" in said
    assert "`/vf/python -m pip install ...`" in said


def test_a_package_that_imports_a_missing_one_is_told_apart(tmp_path):
    _package(tmp_path / "wf" / "vf_mine")
    _package(tmp_path / "lib" / "deep" / "vf_helpers")
    detail = _not_found("vf_mine", missing="vf_helpers.core")
    said = verifiers_failures.explain_not_importable(detail, str(tmp_path / "wf"), cwd=tmp_path)
    assert said.startswith("taskset 'vf_mine' imports 'vf_helpers.core', which verifiers' venv cannot import")
    assert f"a package 'vf_helpers' is in {tmp_path / 'lib' / 'deep'}" in said


def test_the_runners_report_becomes_our_message_at_validate(tmp_path, monkeypatch):
    """A fake verifiers python answering as the runner does when the taskset is not importable."""
    _package(tmp_path / "proj" / "sub" / "vf_mine")
    report = {"error": "ModuleNotFoundError: taskset 'vf_mine' not found", "not_importable": _not_found("vf_mine")}
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho '{json.dumps(report)}'\nexit 1\n")
    python.chmod(0o755)
    monkeypatch.setenv(verifiers_venv.PYTHON_ENV, str(python))
    monkeypatch.chdir(tmp_path / "proj")
    problem = generated.check("verifiers:vf_mine?size=4")
    assert problem.startswith("verifiers could not list taskset 'vf_mine': the taskset package 'vf_mine' is not")
    assert f"is in {tmp_path / 'proj' / 'sub'}" in problem and "`python_path:`" in problem
    assert str(verifiers_tasks.EXAMPLES) in problem  # where it looked: the runner's import path


def test_a_wrong_config_field_lists_the_valid_ones_and_where_it_was_given():
    pydantic = pytest.importorskip("pydantic")

    class Strict(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")

    class Agent(Strict):
        max_turns: int = 3
        model: str = ""

    class TasksetConfig(Strict):
        id: str = ""
        seed: int = 0

    class EnvConfig(Strict):
        id: str = ""
        taskset: TasksetConfig = TasksetConfig()
        agent: Agent = Agent()
        retries: int = 0

    spec = {"taskset": "vf_mine"}
    with pytest.raises(pydantic.ValidationError) as bad:
        EnvConfig.model_validate({"taskset": {"id": "vf_mine"}, "agent": {"max_turnz": 2}, "invalid_retries": 2})
    said = verifiers_runner.config_problems(bad.value, EnvConfig, TasksetConfig, spec)
    assert "rollout_args.env_args: 'agent.max_turnz' is not a field of Agent (its fields: max_turns, model)" in said
    assert "rollout_args.env_args: 'invalid_retries' is not a field of EnvConfig (its fields: agent, retries)" in said
    with pytest.raises(pydantic.ValidationError) as bad:
        EnvConfig.model_validate({"taskset": {"id": "vf_mine", "sede": 1}, "agent": {"max_turns": "many"}})
    said = verifiers_runner.config_problems(bad.value, EnvConfig, TasksetConfig, spec)
    assert "'sede' is not an option of taskset 'vf_mine' (the fields of TasksetConfig: seed)" in said
    assert "rollout_args.env_args.agent.max_turns: Input should be a valid integer" in said
