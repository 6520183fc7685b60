"""graph/kinds/losses.py: one `LOSSES` table says what each train loss reads, which role it
trains, what it takes; validation, the model's role and the trainer all read it, and no other
module of the package names a loss."""

from __future__ import annotations

import ast
import typing

import pytest

from areal_graph.graph.kinds.common import trains_policy
from areal_graph.graph.kinds.losses import LOSSES, POLICY_LOSSES, PROX_LOSSES, TrainParams
from areal_graph.graph.kinds.model import TRAIN
from areal_graph.graph.kinds.registry import BUILTIN_KINDS, model_role
from areal_graph.graph.kinds.rewards import REWARD
from areal_graph.graph.loader import WorkflowError, load_workflow
from support.paths import REPO, WORKFLOWS

PACKAGES = [
    "api",
    "cli",
    "data",
    "engines",
    "graph",
    "modelkit",
    "nodes",
    "perfmodel",
    "runtime",
    "tools",
    "trace_analysis",
    "workflows",
]


def test_the_train_node_takes_exactly_the_losses_of_the_table():
    assert typing.get_args(typing.get_type_hints(TrainParams)["loss"]) == tuple(LOSSES)
    assert TrainParams().loss in LOSSES
    with pytest.raises(WorkflowError) as info:
        load_workflow(WORKFLOWS / "ppo_async.yaml", ["nodes.train.loss=gspoo"])
    assert "one of " + ", ".join(repr(n) for n in LOSSES) in str(info.value)


def test_the_loss_lists_are_read_off_the_table():
    assert POLICY_LOSSES == tuple(n for n, loss in LOSSES.items() if loss.role == "policy")
    assert set(PROX_LOSSES) <= set(POLICY_LOSSES) and "value" not in POLICY_LOSSES
    for name, loss in LOSSES.items():
        assert loss.name == name and ":" in loss.fn and set(loss.reads) >= {"input_ids", "loss_mask"}


@pytest.mark.parametrize("name", list(LOSSES))
def test_validation_and_roles_follow_the_entry(name):
    loss = LOSSES[name]
    overrides = [f"nodes.train.loss={name}", "nodes.train.reads=[input_ids]"]
    with pytest.raises(WorkflowError) as info:
        load_workflow(WORKFLOWS / "ppo_async.yaml", overrides)
    missing = [k for k in loss.reads if k != "input_ids"]
    assert f"loss '{name}' must read {', '.join(missing)}" in str(info.value)
    spec = load_workflow(WORKFLOWS / "ppo_gae_critic.yaml")
    node = next(n for n in spec.nodes.values() if n.kind == "train")
    node = type(node)(**{**node.__dict__, "params": TrainParams(loss=name)})
    assert TRAIN.model_role(node) == loss.role and trains_policy(node) == (loss.role == "policy")


def test_a_model_is_a_critic_when_a_loss_trains_it_as_one():
    spec = load_workflow(WORKFLOWS / "ppo_gae_critic.yaml")
    roles = {n.model: model_role(spec, str(n.model)) for n in spec.nodes.values() if n.kind == "train"}
    assert sorted(roles.values()) == ["critic", "policy"]


def test_dual_clip_only_where_the_loss_takes_it():
    takes = [n for n, loss in LOSSES.items() if loss.dual_clip]
    assert takes == ["decoupled_ppo", "ppo"]
    with pytest.raises(WorkflowError, match="not built for loss 'cispo' \\(decoupled_ppo and ppo only"):
        load_workflow(WORKFLOWS / "ppo_async.yaml", ["nodes.train.loss=cispo", "nodes.train.dual_clip=3.0"])


def test_no_other_module_names_a_loss():
    """A new loss is one LOSSES entry (and its function): no module switches on a loss's name.
    (`value` is also a node kind's name, so it is not searched for.)"""
    names = set(LOSSES) - set(BUILTIN_KINDS)
    assert names and REWARD.name not in names
    found = []
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            if path == REPO / "graph" / "kinds" / "losses.py":
                continue
            found += [
                f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}"
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Constant) and node.value in names
            ]
    assert not found, found
