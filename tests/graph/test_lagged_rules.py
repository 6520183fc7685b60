"""`models.<name>.lagged`: a copy of the policy served for generation (never trained) that a
rollout names as `model:<name>`; every way to get it wrong is an error at `validate` naming the
file, the node or model, and the field (graph/kinds/rollout.py, graph/workflow_rules.py)."""

from __future__ import annotations

import pytest

from areal_graph.graph.dump import dump_workflow
from areal_graph.graph.kind import RunInfo
from areal_graph.graph.kinds.rollout import rollout_args
from areal_graph.graph.loader import WorkflowError, load_workflow_text
from areal_graph.graph.schema_doc import schema_markdown
from support.lagged import OPPONENT, lagged_selfplay_text


def problems(*overrides: str, text: str | None = None) -> list[str]:
    with pytest.raises(WorkflowError) as err:
        load_workflow_text(text or lagged_selfplay_text(), list(overrides), file="lagged.yaml")
    return [str(p) for p in err.value.problems]


def test_a_lagged_opponent_validates_and_the_rollout_gets_its_servers():
    spec = load_workflow_text(lagged_selfplay_text(refresh_every=3, servers=2), [OPPONENT])
    lagged = spec.models["opponent"].lagged
    assert (lagged.refresh_every, lagged.servers) == (3, 2) and spec.models["actor"].lagged is None
    info = RunInfo(
        model_paths={"actor": "/a", "opponent": "/a"},
        server_urls=("http://p",),
        served_urls={"opponent": ("http://l0", "http://l1")},
    )
    args = rollout_args(spec.nodes["rollout"], spec, info)
    assert args["served_urls"] == {"opponent": ["http://l0", "http://l1"]} and args["server_urls"] == ["http://p"]
    assert load_workflow_text(dump_workflow(spec)).models["opponent"].lagged == lagged  # a resume keeps it
    assert "| refresh_every | int | 10 |" in schema_markdown()


@pytest.mark.parametrize(
    "overrides, words",
    [
        (
            ["nodes.rollout.rollout_args.opponent=model:oponent"],
            "node 'rollout', field 'rollout_args.opponent': unknown model 'oponent' (did you mean 'opponent'?); "
            "models: actor, opponent",
        ),
        (
            ["nodes.rollout.rollout_args.opponent=model:actor"],
            "field 'rollout_args.opponent': model 'actor' is the policy itself, whose servers the rollout already "
            "plays on: use opponent: self",
        ),
        (
            [OPPONENT, "models.opponent.path=builtin:tiny-arith"],
            "field 'models.opponent.path': a lagged model starts from the actor's weights: its path must be the "
            "actor's 'builtin:tiny-tictactoe', not 'builtin:tiny-arith'",
        ),
        (
            [OPPONENT, "models.opponent.train.lr=1e-4"],
            "field 'models.opponent.train': a lagged model is served, never trained",
        ),
        (
            [OPPONENT, "models.opponent.lora.r=4"],
            "field 'models.opponent.lora': a lagged model is served, never trained",
        ),
        (
            [OPPONENT, "nodes.prox_logp.model=opponent"],
            "node 'prox_logp', field 'model': model 'opponent' is a lagged copy served for generation only",
        ),
        (
            [],  # declared, and no rollout plays it
            "field 'models.opponent.lagged': no rollout plays model 'opponent' (rollout_args: "
            "{opponent: model:opponent}): its servers would run for nothing",
        ),
        (
            [OPPONENT, "models.actor.lora.r=4", "inference.backend=vllm"],
            "field 'models.opponent.lagged': a lagged copy of a policy that syncs LoRA adapters to vllm servers "
            "(lora.sync: adapter) is not built yet",
        ),
        ([OPPONENT, "models.opponent.lagged.refresh_every=0"], "field 'models.opponent.lagged.refresh_every': must be"),
        ([OPPONENT, "models.opponent.lagged.servers=0"], "field 'models.opponent.lagged.servers': must be"),
        ([OPPONENT, "models.opponent.lagged.every=2"], "field 'models.opponent.lagged.every': unknown field 'every'"),
        (
            [
                OPPONENT,
                "resources.inference.cores=[0]",
                "resources.training.cores=[1]",
            ],
            "field 'resources.inference.cores': lists 1 core(s) for 2 inference servers",
        ),
    ],
)
def test_what_is_wrong_is_an_error_naming_the_field(overrides, words):
    found = problems(*overrides)
    assert any(words in p for p in found), found
    assert all(p.startswith("lagged.yaml") for p in found), found


def test_a_model_that_is_not_lagged_is_not_served_and_a_class_must_take_served_models():
    text = lagged_selfplay_text().replace(
        "    lagged: {refresh_every: 2, servers: 1}\n", "    train: {lr: 1.0e-4}\n"
    )  # a second trained model, not a lagged one
    found = problems(OPPONENT, text=text)
    assert any(
        "field 'rollout_args.opponent': model 'opponent' is not served: give it `lagged: {refresh_every: N}` "
        "(models.opponent.lagged)" in p
        for p in found
    ), found
    found = problems(
        "nodes.rollout.rollout_class=support.failing_rollout:DataCheckedRollout",
        "nodes.rollout.rollout_args={level: 'model:opponent'}",
    )
    assert any(
        "field 'rollout_class': support.failing_rollout:DataCheckedRollout takes no `served_models` argument, "
        "so it cannot play the model that rollout_args name (level)" in p
        for p in found
    ), found
