"""`models.<name>.lora`: typed with defaults, and an error naming the field wherever it is not
built (no `train`, a critic or reference, dp_size > 1, an adapter vLLM cannot serve)."""

from __future__ import annotations

import pytest

from areal_graph.graph.kind import RunInfo
from areal_graph.graph.kinds.model import _model_host_args
from areal_graph.graph.kinds.rollout import rollout_args
from areal_graph.graph.loader import WorkflowError, load_workflow
from support.paths import WORKFLOWS


def test_defaults_and_what_the_model_host_gets():
    spec = load_workflow(WORKFLOWS / "ppo_async.yaml", ["models.actor.lora.r=16"])
    lora = spec.models["actor"].lora
    assert (lora.r, lora.alpha, lora.dropout, lora.sync) == (16, 16, 0.0, "adapter")
    assert lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    args = _model_host_args(spec.nodes["train"], spec, RunInfo(model_paths={"actor": "/a"}))
    assert args["lora"]["r"] == 16 and "lora" not in _model_host_args(
        spec.nodes["train"], load_workflow(WORKFLOWS / "ppo_async.yaml"), RunInfo(model_paths={"actor": "/a"})
    )


@pytest.mark.parametrize(
    "workflow, overrides, words",
    [
        (
            "ppo_async.yaml",
            ["models.actor.lora.r=4", "models.actor.dp_size=2"],
            "field 'models.actor.dp_size': LoRA with data parallelism (dp_size > 1) is not built yet",
        ),
        (
            "ppo_async.yaml",
            ["models.actor.lora.r=4", "inference.backend=vllm", "runtime.weight_sync=memory"],
            "field 'runtime.weight_sync': the vllm backend loads LoRA adapters from a directory",
        ),
        (
            "ppo_async.yaml",
            ["models.actor.lora.r=1024", "inference.backend=vllm"],
            "field 'models.actor.lora.r': vLLM serves LoRA ranks up to 512",
        ),
        ("ppo_kl.yaml", ["models.ref.lora.r=4"], "field 'models.ref.lora': adapters are trained"),
        (
            "ppo_gae_critic.yaml",
            ["models.critic.lora.r=4"],
            "field 'models.critic.lora': LoRA is built for the policy model only",
        ),
        ("ppo_async.yaml", ["models.actor.lora.r=0"], "field 'models.actor.lora.r': must be"),
    ],
)
def test_what_is_not_built_is_an_error_naming_the_field(workflow, overrides, words):
    with pytest.raises(WorkflowError) as err:
        load_workflow(WORKFLOWS / workflow, overrides)
    found = [str(p) for p in err.value.problems]
    assert any(words in p for p in found), found


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_adapter_sync_to_servers_that_load_adapters_is_accepted_and_the_rollout_names_it(backend):
    spec = load_workflow(WORKFLOWS / "ppo_async.yaml", ["models.actor.lora.r=4", f"inference.backend={backend}"])
    info = RunInfo(model_paths={"actor": "/a"}, server_urls=("http://x",))
    assert rollout_args(spec.nodes["rollout"], spec, info)["lora_adapters"] is True
    merged = load_workflow(WORKFLOWS / "ppo_async.yaml", ["models.actor.lora.r=4", "models.actor.lora.sync=merged"])
    assert rollout_args(merged.nodes["rollout"], merged, info)["lora_adapters"] is False
