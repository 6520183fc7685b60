"""runtime.keep_checkpoints and keep_checkpoints_every: each rule reports at its field with a
message that names the fields involved, through the loader (file and line) and directly
(graph/workflow_rules.py:check_checkpoints); a setting that holds reports nothing."""

from __future__ import annotations

import dataclasses

import pytest

from areal_graph.graph.loader import WorkflowError, load_workflow, load_workflow_text
from areal_graph.graph.typed_yaml import Validator
from areal_graph.graph.workflow_rules import check_checkpoints, check_runtime
from support.paths import FIXTURES

MINIMAL = (FIXTURES / "minimal.yaml").read_text()


@pytest.fixture(scope="module")
def spec():
    return load_workflow(FIXTURES / "minimal.yaml")


def _problems(spec, **runtime) -> list[tuple[str | None, str]]:
    v = Validator("wf.yaml", {}, {})
    check_checkpoints(dataclasses.replace(spec, runtime=dataclasses.replace(spec.runtime, **runtime)), v)
    return [(p.field, p.message) for p in v.problems]


@pytest.mark.parametrize(
    "runtime",
    [
        {},
        {"save_every": 5, "keep_checkpoints": 1},
        {"save_every": 5, "keep_checkpoints": 3, "keep_checkpoints_every": 50},
        {"save_every": 5, "keep_checkpoints": 3, "keep_checkpoints_every": 5},
        {"save_every": 0},
    ],
)
def test_settings_that_hold_report_nothing(spec, runtime):
    assert _problems(spec, **runtime) == []


def test_keeping_none_with_auto_resume_says_why_one_is_needed(spec):
    assert _problems(spec, save_every=5, keep_checkpoints=0, auto_resume=2) == [
        (
            "runtime.keep_checkpoints",
            "must be >= 1, got 0: runtime.auto_resume (2) resumes from the last complete checkpoint, so "
            "runtime.keep_checkpoints must keep at least 1 (null keeps all)",
        )
    ]


@pytest.mark.parametrize("keep", [0, -2])
def test_keep_checkpoints_must_be_at_least_one(spec, keep):
    assert _problems(spec, save_every=5, keep_checkpoints=keep, auto_resume=0) == [
        ("runtime.keep_checkpoints", f"must be >= 1 (the newest complete checkpoints kept; null keeps all), got {keep}")
    ]


def test_keep_checkpoints_without_checkpoints_does_nothing(spec):
    assert _problems(spec, keep_checkpoints=2) == [
        (
            "runtime.keep_checkpoints",
            "does nothing without runtime.save_every > 0 (no checkpoint is written); set "
            "save_every, or leave keep_checkpoints out",
        )
    ]


def test_milestones_need_keep_checkpoints(spec):
    assert _problems(spec, save_every=5, keep_checkpoints_every=10) == [
        (
            "runtime.keep_checkpoints_every",
            "is used only with runtime.keep_checkpoints (without it every checkpoint is kept)",
        )
    ]


def test_milestones_must_fall_on_saved_steps(spec):
    assert _problems(spec, save_every=4, keep_checkpoints=2, keep_checkpoints_every=6) == [
        (
            "runtime.keep_checkpoints_every",
            "must be a multiple of runtime.save_every (4), got 6: checkpoints are written only at multiples of "
            "save_every, so most multiples of 6 would have no checkpoint to keep as a milestone",
        )
    ]


def test_check_runtime_runs_the_checkpoint_rules(spec):
    v = Validator("wf.yaml", {}, {})
    check_runtime(dataclasses.replace(spec, runtime=dataclasses.replace(spec.runtime, keep_checkpoints=1)), True, v)
    assert [p.field for p in v.problems] == ["runtime.keep_checkpoints"]


def test_the_loader_reports_them_with_the_line():
    text = MINIMAL + "  save_every: 4\n  keep_checkpoints: 0\n  keep_checkpoints_every: 6\n"
    with pytest.raises(WorkflowError) as info:
        load_workflow_text(text)
    problems = info.value.problems
    lines = text.splitlines()
    assert [(p.field, lines[p.line - 1].strip().split(":")[0]) for p in problems] == [
        ("runtime.keep_checkpoints", "keep_checkpoints"),
        ("runtime.keep_checkpoints_every", "keep_checkpoints_every"),
    ]
    assert "runtime.auto_resume (2)" in problems[0].message


def test_a_non_positive_milestone_interval_is_a_schema_error():
    with pytest.raises(WorkflowError, match="keep_checkpoints_every.*must be > 0"):
        load_workflow_text(MINIMAL + "  save_every: 4\n  keep_checkpoints: 1\n  keep_checkpoints_every: 0\n")


def test_a_valid_setting_loads():
    spec = load_workflow_text(MINIMAL + "  save_every: 4\n  keep_checkpoints: 2\n  keep_checkpoints_every: 8\n")
    assert (spec.runtime.keep_checkpoints, spec.runtime.keep_checkpoints_every) == (2, 8)
