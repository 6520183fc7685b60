"""graph/problems.py on its own: how a `Problem` names its place, what `WorkflowError` carries,
and the two phrasing helpers (`node_of`, `suggest`) every validation message is built from.

The loader tests check whole messages end to end; these pin the pieces, so a change to the
wording of one part shows up here rather than as a puzzling diff in every fixture case."""

from __future__ import annotations

import dataclasses

import pytest

from areal_graph.graph.problems import Problem, WorkflowError, node_of, suggest


@pytest.mark.parametrize(
    "problem,text",
    [
        (
            Problem("wf.yaml", 12, "train", "clip_eps", "must be > 0"),
            "wf.yaml:12, node 'train', field 'clip_eps': must be > 0",
        ),
        (Problem("wf.yaml", None, None, "runtime.steps", "bad"), "wf.yaml, field 'runtime.steps': bad"),
        (Problem("wf.yaml", 3, None, None, "YAML syntax error"), "wf.yaml:3: YAML syntax error"),
        # line 0 is falsy: printed without a line, like None
        (Problem("wf.yaml", 0, "reward", None, "x"), "wf.yaml, node 'reward': x"),
        (Problem("wf.yaml", 7, "reward", "", "x"), "wf.yaml:7, node 'reward': x"),
    ],
)
def test_a_problem_names_file_line_node_and_field_that_it_has(problem, text):
    assert str(problem) == text


def test_a_problem_is_frozen_and_comparable():
    a = Problem("f", 1, "n", "x", "m")
    assert a == Problem("f", 1, "n", "x", "m") and hash(a) == hash(Problem("f", 1, "n", "x", "m"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.line = 2  # type: ignore[misc]


def test_workflow_error_lists_every_problem_in_its_message():
    problems = (Problem("f.yaml", 2, None, "name", "first"), Problem("f.yaml", 9, "train", "lr", "second"))
    err = WorkflowError(problems)
    assert err.problems == list(problems) and isinstance(err.problems, list)
    assert str(err) == (
        "2 problem(s) in workflow:\n  - f.yaml:2, field 'name': first\n  - f.yaml:9, node 'train', field 'lr': second"
    )


@pytest.mark.parametrize(
    "parts,node",
    [
        (("nodes", "train", "clip_eps"), "train"),
        (("nodes", "train"), "train"),
        (("nodes",), None),
        (("runtime", "steps"), None),
        ((), None),
        (["nodes", 3], "3"),  # a node name YAML read as a number is still named
    ],
)
def test_node_of_is_the_second_part_of_a_path_into_nodes(parts, node):
    assert node_of(parts) == node


def test_suggest_names_the_closest_option_only_when_it_is_close():
    assert suggest("clip_epss", ["clip_eps", "lr"]) == " (did you mean 'clip_eps'?)"
    assert suggest("rewrad", ("rollout", "reward", "train")) == " (did you mean 'reward'?)"
    assert suggest("zzz", ["clip_eps", "lr"]) == ""
    assert suggest("x", []) == ""
    assert suggest(12, ["12x", "abc"]) == " (did you mean '12x'?)"  # non-strings are compared as text
