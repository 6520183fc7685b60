"""`resources`: placement of each side on cores and GPUs. Typed, validated with the field named
(shared cores or GPUs, too few for the processes, devices no model uses), written back into a
run's config.yaml, and absent by default (nothing pinned, as before the section existed)."""

from __future__ import annotations

import pytest

from areal_graph.graph.dump import dump_workflow
from areal_graph.graph.loader import WorkflowError, load_workflow, load_workflow_text
from support.paths import WORKFLOWS

PPO = WORKFLOWS / "ppo_async.yaml"


def test_absent_by_default_and_typed_when_given():
    assert not load_workflow(PPO).resources.pinned
    spec = load_workflow(PPO, ["resources.inference.cores=[0]", "resources.training.cores=[1, 2]"])
    assert spec.resources.inference.cores == (0,) and spec.resources.training.cores == (1, 2)
    assert spec.resources.other.cores is None and spec.resources.pinned


def test_a_pinned_workflow_round_trips_through_config_yaml():
    spec = load_workflow(
        PPO, ["resources.inference.cores=[0]", "resources.training.cores=[1]", "resources.other.cores=[1]"]
    )
    again = load_workflow_text(dump_workflow(spec))
    assert again.resources == spec.resources
    assert "resources" not in dump_workflow(load_workflow(PPO))  # the default writes nothing


@pytest.mark.parametrize(
    "workflow, overrides, words",
    [
        (
            "ppo_async.yaml",
            ["resources.inference.cores=[0, 1]", "resources.training.cores=[1]"],
            "field 'resources.training.cores': shares 1 with resources.inference.cores",
        ),
        (
            "ppo_async.yaml",
            ["resources.inference.cores=[0]", "inference.servers=2"],
            "field 'resources.inference.cores': lists 1 core(s) for 2 inference servers",
        ),
        ("ppo_async.yaml", ["resources.inference.cores=[0, 0]"], "field 'resources.inference.cores': lists 0 twice"),
        ("ppo_async.yaml", ["resources.inference.cores=[-1]"], "must be a list of non-negative integers"),
        ("ppo_async.yaml", ["resources.inference.cores=[]"], "must list at least one index"),
        (
            "ppo_async.yaml",
            ["resources.inference.cores=[0, 1]", "inference.threads=3"],
            "field 'inference.threads': 3 threads per server is more than the 2 core(s)",
        ),
        (
            "ppo_async.yaml",
            ["resources.training.cores=[1]", "models.actor.dp_size=2"],
            "field 'models.actor.dp_size': 2 ranks but resources.training.cores lists 1 core(s)",
        ),
        (
            "ppo_async.yaml",
            ["resources.inference.gpus=[0, 1, 2]", "inference.servers=2", "inference.args.device=cuda"],
            "3 GPU(s) do not split evenly among 2 inference servers",
        ),
        ("ppo_async.yaml", ["resources.inference.gpus=[0]"], "the embedded servers run on the CPU"),
        ("ppo_async.yaml", ["resources.training.gpus=[0]"], "no model is on CUDA"),
        (
            "ppo_async.yaml",
            ["resources.training.gpus=[1]", "models.actor.device=cuda:1"],
            "field 'models.actor.device': with resources.training.gpus write 'cuda'",
        ),
        (
            "ppo_async.yaml",
            ["resources.training.gpus=[1]", "models.actor.device=cuda", "models.actor.dp_size=2"],
            "2 ranks on CUDA but resources.training.gpus lists 1 GPU(s)",
        ),
        (
            "ppo_async.yaml",
            [
                "resources.training.gpus=[0]",
                "resources.inference.gpus=[0]",
                "models.actor.device=cuda",
                "inference.args.device=cuda",
            ],
            "field 'resources.training.gpus': shares 0",
        ),
        (
            "ppo_async.yaml",
            ["resources.other.gpus=[0]", "runtime.launcher=ray"],
            "field 'resources.other.gpus': is not built for runtime.launcher 'ray'",
        ),
        ("ppo_async.yaml", ["resources.inferance.cores=[0]"], "unknown field 'inferance' (did you mean 'inference'?)"),
        (
            "ppo_async.yaml",
            ["inference.kv_on_update=keep", "inference.backend=vllm"],
            "field 'inference.kv_on_update': 'keep' is built for the embedded engine only",
        ),
        (
            "ppo_async.yaml",
            ["inference.kv_on_update=wait", "inference.backend=sglang"],
            "field 'inference.kv_on_update': 'wait' is built for the embedded engine only",
        ),
    ],
)
def test_placements_that_cannot_work_name_the_field(workflow, overrides, words):
    with pytest.raises(WorkflowError) as err:
        load_workflow(WORKFLOWS / workflow, overrides)
    found = [str(p) for p in err.value.problems]
    assert any(words in p for p in found), found
