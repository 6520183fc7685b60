"""`kind: judge` in a workflow: its rules name the node and field; the plan hosts it in its own
process on the generation side; the key never travels in its arguments."""

from __future__ import annotations

import pytest

from areal_graph.graph.kind import RunInfo
from areal_graph.graph.kinds.registry import kind_of
from areal_graph.graph.loader import WorkflowError, load_workflow
from areal_graph.graph.plan import build_plan
from support.paths import WORKFLOWS

WF = WORKFLOWS / "ppo_judge.yaml"


def problems(*overrides: str) -> list[str]:
    with pytest.raises(WorkflowError) as err:
        load_workflow(WF, list(overrides))
    return [str(p) for p in err.value.problems]


def test_the_shipped_workflow_plans_the_judge_on_the_generation_side():
    spec = load_workflow(WF)
    assert "judge" in build_plan(spec).generation
    node = spec.nodes["judge"]
    kind = kind_of(node)
    assert kind.hosting(node, spec).process == "judge-judge"
    info = RunInfo(model_paths={"actor": "/a"}, server_urls=("http://127.0.0.1:5/",))
    args = kind.host_args(node, spec, info)
    assert (args["base_url"], args["use_run_token"], args["api_key_env"]) == ("http://127.0.0.1:5/v1", True, None)
    ext = load_workflow(WF, ["nodes.judge.url=https://judge.example/v1", "nodes.judge.api_key_env=JUDGE_KEY"])
    args = kind.host_args(ext.nodes["judge"], ext, info)
    assert (args["base_url"], args["use_run_token"], args["api_key_env"]) == (
        "https://judge.example/v1",
        False,
        "JUDGE_KEY",
    )
    assert not any("key" == k or k == "api_key" for k in args)  # the key itself is read in the judge's process


@pytest.mark.parametrize(
    "overrides, words",
    [
        (("nodes.judge.template=is {question} right?",), "field 'template': has field(s) ['question']"),
        (("nodes.judge.template=grade it",), "field 'template': never shows the judge the {response}"),
        (("nodes.judge.pattern=\\d+",), "field 'pattern': must have exactly one group"),
        (("nodes.judge.api_key_env=KEY",), "field 'api_key_env': is for an endpoint given by `url`"),
        (("nodes.judge.verdict=stars",), "field 'verdict': must be"),
        (
            ("nodes.judge.url=localhost:30001/v1",),
            "field 'url': must start with http:// or https:// (e.g. http://localhost:30001/v1)",
        ),
        (("nodes.judge.reads=[input_ids]",), "a judge node (it shows the judge the answer) must read loss_mask"),
    ],
)
def test_rules_name_the_node_and_field(overrides, words):
    found = problems(*overrides)
    assert any(words in p and "node 'judge'" in p for p in found), found
