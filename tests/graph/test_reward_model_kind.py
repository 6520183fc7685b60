"""`kind: reward_model` in a workflow: its rules name the node and field, and the plan hosts it
in its own process on the generation side, with the frozen model's path and the policy's
tokenizer."""

from __future__ import annotations

import pytest

from areal_graph.graph.kind import RunInfo
from areal_graph.graph.kinds.registry import kind_of
from areal_graph.graph.loader import WorkflowError, load_workflow
from areal_graph.graph.plan import build_plan
from support.paths import WORKFLOWS

WF = WORKFLOWS / "ppo_reward_model.yaml"


def problems(*overrides: str) -> list[str]:
    with pytest.raises(WorkflowError) as err:
        load_workflow(WF, list(overrides))
    return [str(p) for p in err.value.problems]


def test_the_shipped_workflow_plans_the_reward_model_on_the_generation_side():
    spec = load_workflow(WF)
    plan = build_plan(spec)
    assert "rm_score" in plan.generation and "rm_score" in plan.eval_nodes
    node = spec.nodes["rm_score"]
    kind = kind_of(node)
    hosting = kind.hosting(node, spec)
    assert (hosting.process, hosting.impl.rsplit(".", 1)[-1], hosting.exclusive) == (
        "rm-rm_score",
        "reward_model_host:RewardModelHost",
        True,
    )
    args = kind.host_args(node, spec, RunInfo(model_paths={"actor": "/a", "rm": "/r"}))
    assert args == {
        "path": "/r",
        "policy_tokenizer_path": "/a",
        "device": "cpu",
        "output": "sigmoid",
        "retokenize": "auto",
    }
    call = kind.call(node, spec)
    assert (call.method, call.args) == ("score", {"out_key": "rm_reward", "max_tokens_per_mb": 2048})


@pytest.mark.parametrize(
    "overrides, words",
    [
        (
            ("models.rm.train.lr=1e-5",),
            "node 'rm_score', field 'model': model 'rm' has `train` settings, but a reward model is frozen",
        ),
        (("models.rm.dp_size=2",), "node 'rm_score', field 'model': model 'rm' has dp_size 2"),
        (("nodes.prox_logp.model=rm",), "model 'rm' is also used by ['prox_logp']"),
        (
            ("nodes.rm_score.reads=[loss_mask]",),
            "node 'rm_score', field 'reads': a reward_model node must read input_ids",
        ),
        (("nodes.rm_score.output=softmax",), "node 'rm_score', field 'output': must be"),
    ],
)
def test_rules_name_the_node_and_field(overrides, words):
    found = problems(*overrides)
    assert any(words in p for p in found), found
