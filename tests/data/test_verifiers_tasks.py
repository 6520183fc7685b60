"""verifiers: datasets without verifiers installed: the spec's grammar, the missing-venv error, and
the runner's seat defaults (the rows themselves: tests/workflows/test_verifiers_env.py, `make
test-verifiers`)."""

from __future__ import annotations

import pytest

from areal_graph.data import generated, verifiers_tasks
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


def test_without_verifiers_venv_the_error_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.delenv(verifiers_tasks.PYTHON_ENV, raising=False)
    monkeypatch.setattr(verifiers_tasks, "PACKAGE", tmp_path)
    problem = generated.check("verifiers:vf_arith?size=10")
    assert "make install-verifiers" in problem and "openai<3" in problem
    monkeypatch.setenv(verifiers_tasks.PYTHON_ENV, str(tmp_path / "nope" / "python"))
    assert "no such file" in generated.check("verifiers:vf_arith")


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
