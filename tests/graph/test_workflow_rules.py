"""graph/workflow_rules.py called directly on small specs: each cross-field, cross-node and
import rule reports to the Validator at the right path, and reports nothing when it holds.

The broken fixtures (tests/graph/test_validation.py) reach these rules through the loader,
one rule per file; here a valid spec (tests/fixtures/minimal.yaml) is changed with
`dataclasses.replace` so a rule sees exactly the case it is about, including the cases the
loader's schema would stop first (a spec without a rollout, two policies on two models)."""

from __future__ import annotations

import dataclasses
import os
import sys

import pytest

from areal_graph.graph.kind import ImportRef
from areal_graph.graph.loader import load_workflow
from areal_graph.graph.typed_yaml import Validator
from areal_graph.graph.workflow_rules import (
    check_graph,
    check_import,
    check_launcher,
    check_runtime,
    check_signature,
    check_trained_models,
)
from support.paths import FIXTURES


@pytest.fixture(scope="module")
def spec():
    return load_workflow(FIXTURES / "minimal.yaml")


def _v() -> Validator:
    return Validator("wf.yaml", {}, {})


def _where(v: Validator) -> list[tuple[str | None, str | None]]:
    return [(p.node, p.field) for p in v.problems]


def _with_runtime(spec, **changes):
    return dataclasses.replace(spec, runtime=dataclasses.replace(spec.runtime, **changes))


# ---------------------------------------------------------------------- runtime and launcher
def test_the_minimal_workflow_keeps_every_rule(spec):
    v = _v()
    check_runtime(spec, True, v)
    check_graph(spec, True, v)
    assert v.problems == []


def test_batch_and_concurrency_must_hold_whole_prompt_groups(spec):
    v = _v()
    check_runtime(_with_runtime(spec, batch_size=18, max_concurrent_rollouts=3), True, v)
    assert _where(v) == [(None, "runtime.batch_size"), (None, "runtime.max_concurrent_rollouts")]
    assert v.problems[0].message == (
        "must be a multiple of nodes.rollout.group_size (4) so that whole prompt groups are trained, got 18"
    )
    assert v.problems[1].message.startswith("must be at least nodes.rollout.group_size (4)")
    assert v.problems[1].message.endswith("got 3")


def test_runtime_rules_are_skipped_when_the_runtime_section_had_problems(spec):
    v = _v()
    check_runtime(_with_runtime(spec, batch_size=18, ray_address="auto"), False, v)
    assert v.problems == []


def test_memory_weight_sync_needs_a_backend_that_can_take_it(spec):
    # as the loader resolves `kv_on_update: auto` for SGLang
    sglang = dataclasses.replace(
        spec, inference=dataclasses.replace(spec.inference, backend="sglang", kv_on_update="recompute")
    )
    v = _v()
    check_runtime(_with_runtime(sglang, weight_sync="memory"), True, v)
    assert _where(v) == [(None, "runtime.weight_sync")] and "use 'disk' or 'auto'" in v.problems[0].message
    for ok in (_with_runtime(sglang, weight_sync="disk"), _with_runtime(spec, weight_sync="memory")):
        v = _v()
        check_runtime(ok, True, v)
        assert v.problems == []


def test_the_inference_python_must_be_an_executable_file(spec, tmp_path):
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n")
    for path, bad in (
        (str(script), True),
        (str(tmp_path), True),
        (str(tmp_path / "absent"), True),
        (sys.executable, False),
    ):
        v = _v()
        check_runtime(dataclasses.replace(spec, inference=dataclasses.replace(spec.inference, python=path)), True, v)
        assert _where(v) == ([(None, "inference.python")] if bad else []), path
        if bad:
            assert v.problems[0].message.startswith(f"{path!r} is not an executable file")
            assert os.getcwd() in v.problems[0].message
    os.chmod(script, 0o755)
    v = _v()
    check_runtime(dataclasses.replace(spec, inference=dataclasses.replace(spec.inference, python=str(script))), True, v)
    assert v.problems == []


def test_a_ray_address_without_the_ray_launcher_is_refused(spec):
    v = _v()
    check_launcher(_with_runtime(spec, ray_address="auto"), v)
    assert _where(v) == [(None, "runtime.ray_address")]
    assert v.problems[0].message == "is used only with runtime.launcher 'ray' (it is 'local')"


def test_under_ray_models_name_cuda_without_an_index_and_one_rank(spec, monkeypatch):
    models = dict(spec.models)
    models["actor"] = dataclasses.replace(models["actor"], device="cuda:1")
    models["ref"] = dataclasses.replace(models["ref"], device="cuda", dp_size=2)
    ray = _with_runtime(dataclasses.replace(spec, models=models), launcher="ray", ray_address="auto")
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # as if ray were installed
    v = _v()
    check_launcher(ray, v)
    assert _where(v) == [(None, "models.actor.device"), (None, "models.ref.dp_size")]
    assert "write 'cuda', not 'cuda:1'" in v.problems[0].message
    assert "use the local launcher, or dp_size 1" in v.problems[1].message


def test_the_ray_launcher_without_ray_installed_says_how_to_install_it(spec, monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    v = _v()
    check_launcher(_with_runtime(spec, launcher="ray"), v)
    assert _where(v) == [(None, "runtime.launcher")]
    assert v.problems[0].message == "'ray' needs the ray package: pip install 'areal-graph[ray]'"


# ---------------------------------------------------------------------- the graph
def _nodes(spec, drop=(), **add):
    nodes = {k: n for k, n in spec.nodes.items() if k not in drop}
    nodes.update(add)
    return dataclasses.replace(spec, nodes=nodes)


def test_without_a_rollout_only_the_missing_rollout_is_reported(spec):
    """The keys a rollout would write count as available, so the other nodes' reads are not
    each reported as unwritten too."""
    v = _v()
    check_graph(_nodes(spec, drop=("rollout",)), True, v)
    assert _where(v) == [(None, "nodes")]
    assert v.problems[0].message == "the workflow needs exactly one node of kind 'rollout' (it has none)"


def test_a_second_rollout_is_named(spec):
    second = dataclasses.replace(spec.nodes["rollout"], name="rollout2", writes=())
    v = _v()
    check_graph(_nodes(spec, rollout2=second), True, v)
    assert _where(v)[0] == ("rollout2", "kind")
    assert v.problems[0].message == "a second rollout node (the first is 'rollout'); a workflow has exactly one"
    # both provide the implicit keys (group_id, sample_id, ...): the second one is named as their second writer
    assert {p.field for p in v.problems[1:]} == {"writes"} and all(p.node == "rollout2" for p in v.problems)
    assert "key 'group_id' is also written by node 'rollout'" in " ".join(p.message for p in v.problems)


def test_a_key_with_two_writers_and_a_read_of_an_unwritten_key(spec):
    dup = dataclasses.replace(spec.nodes["reward"], name="reward2", reads=("input_ids", "loss_mask", "rewardz"))
    v = _v()
    check_graph(_nodes(spec, reward2=dup), True, v)
    assert _where(v) == [("reward2", "writes"), ("reward2", "reads.2")]
    assert v.problems[0].message == ("key 'rewards' is also written by node 'reward'; each key has exactly one writer")
    assert v.problems[1].message.startswith(
        "reads key 'rewardz' which no node writes (did you mean 'rewards'?); available keys: "
    )


def test_a_cycle_is_reported_once_with_its_path(spec):
    ref = dataclasses.replace(spec.nodes["ref_logp"], reads=("input_ids", "advantages"))
    v = _v()
    check_graph(_nodes(spec, ref_logp=ref), True, v)
    [problem] = v.problems
    assert problem.field == "reads" and problem.message.startswith("dependency cycle: ")
    cycle = problem.message.split(": ", 1)[1].split(" (")[0].split(" -> ")
    assert cycle[0] == cycle[-1] == problem.node and set(cycle) == {"ref_logp", "advantage"}


def test_a_workflow_needs_one_policy_on_one_model(spec):
    v = _v()
    check_trained_models(_nodes(spec, drop=("train",)), v)
    assert _where(v) == [(None, "nodes")] and "needs a 'train' node with a policy loss" in v.problems[0].message

    second = dataclasses.replace(spec.nodes["train"], name="train_ref", model="ref")
    v = _v()
    check_trained_models(_nodes(spec, train_ref=second), v)
    assert _where(v) == [("train_ref", "model")]
    assert v.problems[0].message.startswith("trains model 'ref' with a policy loss, but node 'train' trains 'actor'")


def test_one_model_may_not_be_both_policy_and_critic(spec):
    train = spec.nodes["train"]
    critic = dataclasses.replace(train, name="critic", params=dataclasses.replace(train.params, loss="value"))
    v = _v()
    check_trained_models(_nodes(spec, critic=critic), v)
    assert _where(v) == [("critic", "model")]
    # the first node using 'actor' as a policy is the proximal log-prob node
    assert v.problems[0].message.startswith(
        "model 'actor' is used as a critic here and as a policy by node 'prox_logp'"
    )


# ---------------------------------------------------------------------- imports and signatures
def two_args(batch, out_key, scale=1.0):
    return batch


class NotARollout:
    def __init__(self, a):
        self.a = a


@pytest.mark.parametrize(
    "ref,words",
    [
        (
            ImportRef(
                "fn",
                "areal_graph.nodes.shaping:weighted_sum",
                kwargs={"weights": {"a": 1}},
                positional=1,
                supplied=("out_key",),
            ),
            None,
        ),
        (ImportRef("fn", "areal_graph.nodes.shapng:weighted_sum"), "no module named 'areal_graph.nodes.shapng'"),
        (
            ImportRef("fn", "areal_graph.graph.spec:SECTIONS"),
            "areal_graph.graph.spec:SECTIONS is a tuple, not a function",
        ),
        (ImportRef("cls", "areal_graph.nodes.shaping:weighted_sum", expect="class"), "is not a class"),
        (
            ImportRef("rollout_class", "areal_graph.graph.spec:WorkflowSpec", expect="rollout_class"),
            "is not a subclass of areal_graph.api.rollout.Rollout",
        ),
        (
            ImportRef(
                "fn",
                "areal_graph.nodes.shaping:weighted_sum",
                kwargs={"weight": {"a": 1}},
                positional=1,
                supplied=("out_key",),
            ),
            "its function (batch",
        ),
    ],
)
def test_check_import_imports_and_checks_what_a_parameter_names(ref, words):
    problem = check_import(ref)
    assert problem is None if words is None else words in problem


def test_check_signature_binds_positional_inputs_configured_and_supplied_arguments():
    fn = two_args
    assert check_signature(fn, ImportRef("fn", "m:two_args", kwargs={}, positional=1, supplied=("out_key",))) is None
    assert (
        check_signature(
            fn, ImportRef("fn", "m:two_args", kwargs={"scale": 2}, positional=1, supplied=("out_key", "not_a_param"))
        )
        is None
    )
    problem = check_signature(fn, ImportRef("fn", "m:two_args", kwargs={"scale": 2}, positional=1))
    assert problem.startswith("m:two_args: its function (batch, out_key, scale=1.0) cannot be called with scale: ")
    problem = check_signature(NotARollout, ImportRef("cls", "m:NotARollout", kwargs={}, positional=0))
    assert "its constructor (a) cannot be called with no keyword arguments" in problem
    assert check_signature(NotARollout, ImportRef("cls", "m:NotARollout", kwargs={"a": 1})) is None


def test_objects_without_a_signature_are_not_checked():
    assert check_signature(dict, ImportRef("fn", "builtins:dict", kwargs={"nonsense": 1}, positional=5)) is None


@pytest.mark.parametrize("field", ["json_schema", "grammar"])
def test_a_rollout_cannot_constrain_its_sampling(field):
    """Constrained tokens come from a masked distribution: a rollout's must be the policy's own."""
    from areal_graph.graph.problems import WorkflowError

    with pytest.raises(WorkflowError, match=f"field 'sampling.{field}'") as info:
        load_workflow(FIXTURES / "minimal.yaml", overrides=[f"nodes.rollout.sampling.{field}='{{}}'"])
    assert "drawn from the policy itself" in str(info.value)
