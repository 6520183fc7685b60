"""Where user code is found (api/imports.py): the workflow's own folder, as pytest's rootdir, and
errors that say where a module was looked for and what the nearest name is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal_graph.api import imports
from areal_graph.api.imports import ImportPathError, add_import_roots, import_object, import_root_of

REPO = Path(__file__).resolve().parents[2]
TRY_AGAIN = REPO / "tests" / "fixtures" / "try_again"


@pytest.fixture
def clean_roots(monkeypatch):
    """sys.path, PYTHONPATH and the recorded roots restored after the test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.setattr(imports, "_ROOTS", [])
    yield
    sys.modules.pop("my_rewards", None)


def test_a_folder_with_code_is_its_own_root_and_a_package_folder_gives_the_folder_above(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "rewards.py").write_text("")
    assert import_root_of(tmp_path / "plain") == (tmp_path / "plain").resolve()
    pkg = tmp_path / "proj" / "mypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    assert import_root_of(pkg) == (tmp_path / "proj").resolve()  # `mypkg.x` imports under its own name
    (tmp_path / "proj" / "sub").mkdir()
    (tmp_path / "proj" / "sub" / "env.py").write_text("")
    assert import_root_of(tmp_path / "proj") == (tmp_path / "proj").resolve()  # code one level down counts


def test_no_root_for_a_folder_without_code_or_inside_areal_graph(tmp_path):
    (tmp_path / "w.yaml").write_text("")
    assert import_root_of(tmp_path) is None  # nothing to import: sys.path stays short
    assert import_root_of(REPO / "workflows") is None  # the shipped workflows import as areal_graph.*
    assert import_root_of(TRY_AGAIN) == TRY_AGAIN  # a folder of the repository that is not a package


def test_roots_go_first_on_sys_path_and_on_pythonpath_once(tmp_path, clean_roots):
    add_import_roots([tmp_path, tmp_path])
    add_import_roots([tmp_path])
    assert sys.path[0] == str(tmp_path) and sys.path.count(str(tmp_path)) == 1
    env = os.environ["PYTHONPATH"].split(os.pathsep)
    assert env[0] == str(tmp_path) and env.count(str(tmp_path)) == 1


def test_a_missing_module_says_where_it_looked_and_the_nearest_name(tmp_path, clean_roots):
    (tmp_path / "my_rewards.py").write_text("def two_turn_reward(c, a):\n    return 1.0\n")
    add_import_roots([tmp_path])
    with pytest.raises(ImportPathError) as err:
        import_object("my_reward:two_turn_reward", what="fn")
    assert "no module named 'my_reward' (did you mean 'my_rewards'?)" in str(err.value)
    assert f"looked in the workflow's folder and python_path ({tmp_path})" in str(err.value)
    with pytest.raises(
        ImportPathError,
        match=r"has no attribute 'two_turn_rewrad' \(did you mean "
        r"'my_rewards:two_turn_reward'\?\)",
    ):
        import_object("my_rewards:two_turn_rewrad", what="fn")
    assert import_object("my_rewards:two_turn_reward")("", "") == 1.0


def test_a_misspelled_submodule_of_a_package_gets_a_suggestion():
    with pytest.raises(ImportPathError, match=r"did you mean 'areal_graph.nodes.math_reward'\?"):
        import_object("areal_graph.nodes.math_rewards:math_reward")


@pytest.mark.parametrize("command", [["validate"], ["plot", "-o", "OUT"]])
def test_a_workflow_next_to_its_code_validates_from_any_folder(tmp_path, command):
    """A fresh process, started elsewhere, with no PYTHONPATH: the workflow's folder is enough."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    args = [a.replace("OUT", str(tmp_path / "plots")) for a in command]
    got = subprocess.run(
        [sys.executable, "-m", "areal_graph.cli.main", args[0], str(TRY_AGAIN / "try_again.yaml"), *args[1:]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0, got.stdout + got.stderr
