"""A spec dumped as workflow YAML loads back to the same spec (what run directories store)."""

from __future__ import annotations

import dataclasses

import pytest

from areal_graph.graph.dump import dump_workflow
from areal_graph.graph.loader import load_workflow, load_workflow_text
from support.paths import FIXTURES, REPO

WORKFLOWS = sorted((REPO / "workflows").glob("*.yaml")) + [FIXTURES / "minimal.yaml"]


def _comparable(spec):
    nodes = {k: dataclasses.replace(v, line=None) for k, v in spec.nodes.items()}
    return dataclasses.replace(spec, nodes=nodes, source="")


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_dumped_workflow_loads_back_to_the_same_spec(path):
    spec = load_workflow(path)
    text = dump_workflow(spec, header=f"ran from {path.name}")
    assert text.startswith(f"# ran from {path.name}\n")
    again = load_workflow_text(text, file="config.yaml")
    assert _comparable(again) == _comparable(spec)
    assert dump_workflow(again) == dump_workflow(spec)


def test_overrides_apply_to_a_dumped_workflow():
    spec = load_workflow(REPO / "workflows" / "ppo_async.yaml")
    again = load_workflow_text(dump_workflow(spec), ["runtime.steps=7"], file="config.yaml")
    assert again.runtime.steps == 7
    assert _comparable(again) == _comparable(
        dataclasses.replace(spec, runtime=dataclasses.replace(spec.runtime, steps=7))
    )


@pytest.mark.parametrize(
    "overrides",
    [
        ["models.actor.lora.r=4", "models.actor.lora.sync=merged"],
        ["models.actor.precision=bf16"],
        ["models.actor.lora.r=16", "models.actor.precision=bf16", "models.actor.lora.target_modules=[q_proj,v_proj]"],
    ],
    ids=["lora", "bf16", "both"],
)
def test_every_model_field_survives_the_dump(overrides):
    """A run directory's config.yaml is what `run --resume` reloads: a model field it dropped (LoRA
    adapters, bf16 training) would resume a different run. Every field of every model, not only the
    shipped workflows' defaults."""
    spec = load_workflow(REPO / "workflows" / "ppo_async.yaml", overrides)
    again = load_workflow_text(dump_workflow(spec), file="config.yaml")
    assert again.models == spec.models
    assert _comparable(again) == _comparable(spec)
