"""Every node kind's call names a method its host class has, with arguments it takes.

The other half of tests/test_types.py: a kind's `Call("train", {...})` is a method name and
keyword arguments built from a workflow, and the worker finds the method with getattr. Here
each shipped workflow's nodes are planned and every call is bound, by signature, to the
class its `Hosting.impl` names, without starting a process.
"""

from __future__ import annotations

import inspect

import pytest

from areal_graph.api.imports import import_object
from areal_graph.graph.loader import load_workflow
from areal_graph.graph.plan import build_plan
from areal_graph.runtime.hosts.protocols import (
    FunctionService,
    ModelService,
    RewardModelService,
    RewardService,
    RolloutService,
)
from support.paths import REPO

WORKFLOWS = sorted((REPO / "workflows").glob("*.yaml"))
PROTOCOL_OF = {
    "ModelHost": ModelService,
    "DataParallelModelHost": ModelService,
    "RolloutHost": RolloutService,
    "RewardHost": RewardService,
    "FunctionHost": FunctionService,
    "RewardModelHost": RewardModelService,
    "JudgeHost": RewardService,
}


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=[w.stem for w in WORKFLOWS])
def test_every_call_binds_to_its_host_method(workflow):
    plan = build_plan(load_workflow(workflow))
    bound = 0
    for name, node in plan.spec.nodes.items():
        if name == plan.source or name in plan.fused:
            continue
        host_cls = import_object(plan.hosting[name].impl, what=f"node {name!r} host")
        call = plan.kind(name).call(node, plan.spec)
        method = getattr(host_cls, call.method, None)
        assert callable(method), (
            f"{workflow.name}: node {name!r} calls {host_cls.__name__}.{call.method}, which does not exist"
        )
        inspect.signature(method).bind(None, None, **call.args)  # (self, batch, **args): raises TypeError if not
        protocol = PROTOCOL_OF[host_cls.__name__]
        assert call.method in dir(protocol), f"{call.method} is not declared in {protocol.__name__}"
        bound += 1
    assert bound >= 3


def test_a_wrong_argument_does_not_bind():
    from areal_graph.runtime.hosts.model_host import ModelHost

    with pytest.raises(TypeError):
        inspect.signature(ModelHost.train).bind(None, None, params={}, max_tokens_per_mb=1, temprature=1.0)
