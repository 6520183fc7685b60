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
