"""The execution plan: phases, dependencies, fusion and hosting, read off the kind registry."""

from __future__ import annotations

import pytest

from areal_graph.graph.loader import load_workflow
from areal_graph.graph.plan import build_plan
from support.paths import REPO

WF = REPO / "workflows"


def plan_of(name: str, *overrides: str):
    return build_plan(load_workflow(WF / name, overrides))


def test_ppo_async_fuses_the_proximal_pass_into_the_one_update_step():
    plan = plan_of("ppo_async.yaml")
    assert plan.fused == {"prox_logp": "train"}
    assert plan.generation == ("reward",) and plan.training == ("advantage", "train")
    assert plan.reads("train") == ("input_ids", "loss_mask", "behav_logprobs", "advantages")
    assert "prox_logp" not in {n for p in plan.processes() for n in plan.nodes_on(p) if n in plan.training}
    assert any("fused: 'prox_logp'" in line for line in plan.describe())


@pytest.mark.parametrize(
    "override",
    [
        "nodes.train.ppo_minibatches=2",
        "nodes.train.ppo_epochs=2",
        "runtime.fuse_prox_logprob=false",
        "nodes.train.loss=ppo",
    ],
)
def test_no_fusion_when_it_would_not_be_exact_or_is_turned_off(override):
    plan = plan_of("ppo_async.yaml", override)
    assert plan.fused == {}
    if override != "nodes.train.loss=ppo":
        assert plan.deps["train"] == ("prox_logp", "advantage")


def test_no_fusion_when_another_node_reads_the_proximal_logprobs():
    plan = plan_of("ppo_kl.yaml")  # the advantage's KL term reads prox_logprobs before training
    assert plan.fused == {}
    assert plan.deps["ref_logp"] == () and plan.deps["prox_logp"] == ()  # independent: run concurrently
    assert plan.hosting["ref_logp"].process == "model-ref" and plan.hosting["prox_logp"].process == "model-actor"
    assert "ref_logp || prox_logp -> advantage -> train" in plan.describe()[1]


def test_function_nodes_take_the_side_of_what_they_read():
    plan = plan_of("dapo.yaml")
    assert set(plan.generation) == {"correct", "overlong", "reward_sum", "dynamic_sampling"}
    assert plan.deps["reward_sum"] == ("correct", "overlong") and plan.deps["dynamic_sampling"] == ("reward_sum",)
    assert plan.eval_nodes == ("correct",)  # evaluation runs the scorer, not the filter
    assert plan.hosting["dynamic_sampling"].process == "controller"


def test_critic_workflow_places_each_model_on_its_own_process():
    plan = plan_of("ppo_gae_critic.yaml")
    assert plan.processes() == {
        "model-actor": "model",
        "model-critic": "model",
        "reward": "stateless",
        "rollout": "rollout",
    }
    assert plan.deps["train_actor"] == ("advantage",) and plan.deps["train_critic"] == ("value", "advantage")
