"""`models.<name>.backend: megatron`: validation names the field wherever it is not built (a CPU
device, dp_size > 1, LoRA, a critic), a valid configuration validates (CUDA itself is checked
when the model host starts), and the model host is told the backend only when it is not torch."""

from __future__ import annotations

import pytest

from areal_graph.graph.kind import RunInfo
from areal_graph.graph.kinds.model import _model_host_args
from areal_graph.graph.loader import WorkflowError, load_workflow
from support.paths import WORKFLOWS

MEGATRON = ["models.actor.backend=megatron", "models.actor.device=cuda"]


def test_a_valid_megatron_policy_validates_and_reaches_the_host():
    spec = load_workflow(WORKFLOWS / "ppo_async.yaml", MEGATRON + ["models.actor.precision=bf16"])
    assert spec.models["actor"].backend == "megatron"
    args = _model_host_args(spec.nodes["train"], spec, RunInfo(model_paths={"actor": "/a"}))
    assert (args["backend"], args["precision"], args["device"]) == ("megatron", "bf16", "cuda")
    load_workflow(WORKFLOWS / "ppo_kl.yaml", ["models.ref.backend=megatron", "models.ref.device=cuda:1"])  # frozen ref


def test_default_host_args_are_unchanged():
    spec = load_workflow(WORKFLOWS / "ppo_async.yaml")
    args = _model_host_args(spec.nodes["train"], spec, RunInfo(model_paths={"actor": "/a"}))
    assert "backend" not in args and "precision" not in args


@pytest.mark.parametrize(
    "workflow, overrides, words",
    [
        (
            "ppo_async.yaml",
            ["models.actor.backend=megatron"],
            "field 'models.actor.device': backend megatron needs a CUDA device (cuda or cuda:N), got 'cpu'",
        ),
        (
            "ppo_async.yaml",
            MEGATRON + ["models.actor.dp_size=2"],
            "field 'models.actor.dp_size': data parallelism with backend megatron is not built yet",
        ),
        (
            "ppo_async.yaml",
            MEGATRON + ["models.actor.lora.r=4"],
            "field 'models.actor.lora': LoRA with backend megatron is not built yet",
        ),
        (
            "ppo_gae_critic.yaml",
            ["models.critic.backend=megatron", "models.critic.device=cuda"],
            "field 'models.critic.backend': backend megatron is built for policy models",
        ),
    ],
)
def test_what_is_not_built_is_an_error_naming_the_field(workflow, overrides, words):
    with pytest.raises(WorkflowError) as err:
        load_workflow(WORKFLOWS / workflow, overrides)
    found = [str(p) for p in err.value.problems]
    assert any(words in p for p in found), found
