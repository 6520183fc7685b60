"""`kind: reward` in a workflow: a bad `fn` is one problem naming the node, the field, the
builtins and the nearest one."""

from __future__ import annotations

import pytest

from areal_graph.graph.loader import WorkflowError, load_workflow
from support.paths import WORKFLOWS


@pytest.mark.parametrize("fn, near", [("math_verfy", "math_verify"), ("code_frac", "code_fraction")])
def test_a_reward_fn_typo_is_one_problem_with_the_nearest_builtin(fn, near):
    """It was two contradicting problems (the importer's "must look like 'package.module:Name'"
    and the rule's), and no suggestion."""
    with pytest.raises(WorkflowError) as err:
        load_workflow(WORKFLOWS / "ppo_async.yaml", [f"nodes.reward.fn={fn}"])
    [problem] = [str(p) for p in err.value.problems]
    assert (
        "node 'reward', field 'fn': must be a builtin reward ['agent', 'code', 'code_fraction', 'math_verify', 'reasoning_gym']"
        in problem
    )
    assert f"got {fn!r} (did you mean {near!r}?)" in problem


def test_an_import_path_that_does_not_import_is_still_the_importer_s_problem():
    with pytest.raises(WorkflowError, match=r"node 'reward', field 'fn'.*no_such_pkg"):
        load_workflow(WORKFLOWS / "ppo_async.yaml", ["nodes.reward.fn=no_such_pkg.mod:score"])


RG = "reasoning_gym:basic_arithmetic?size=50&seed=1"


def test_math_verify_on_reasoning_gym_rows_is_refused_naming_both_and_the_fix():
    """The copied math workflow pointed at reasoning-gym data: math_verify would read a number out
    of the row's JSON entry and pay it. One problem, on the reward node's fn line."""
    with pytest.raises(WorkflowError) as err:
        load_workflow(WORKFLOWS / "ppo_async.yaml", [f"data.train={RG}", "data.eval=null"])
    [problem] = [str(p) for p in err.value.problems]
    assert "node 'reward', field 'fn': fn: math_verify cannot score data.train (reasoning_gym:basic_" in problem
    assert "only the task's own scorer reads; use fn: reasoning_gym" in problem
    assert problem.endswith("set check_data_fit: false on nodes.reward")


def test_check_data_fit_false_is_the_opt_in_to_a_deliberate_pairing():
    spec = load_workflow(
        WORKFLOWS / "ppo_async.yaml", [f"data.train={RG}", "data.eval=null", "nodes.reward.check_data_fit=false"]
    )
    assert spec.nodes["reward"].params.fn == "math_verify"
    assert spec.nodes["reward"].params.check_data_fit is False
