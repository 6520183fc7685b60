"""Spec defaults, shipped workflows, and --set overrides."""

from __future__ import annotations

import dataclasses
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_graph.api.sampling import SamplingParams
from areal_graph.graph import spec as S
from areal_graph.graph.kinds.functions import AdvantageParams
from areal_graph.graph.kinds.losses import TrainParams
from areal_graph.graph.kinds.registry import BUILTIN_KINDS
from areal_graph.graph.kinds.rollout import RolloutParams
from areal_graph.graph.loader import WorkflowError, load_workflow, load_workflow_text, parse_override
from support.paths import FIXTURES, REPO

WORKFLOWS = sorted((REPO / "workflows").glob("*.yaml"))
MINIMAL = (FIXTURES / "minimal.yaml").read_text()


def test_paper_defaults():
    assert TrainParams().clip_eps == 0.2 and TrainParams().loss == "decoupled_ppo"
    assert (AdvantageParams().gamma, AdvantageParams().lam) == (1.0, 1.0)
    assert AdvantageParams().normalize is True
    assert S.OptimConfig().lr == 2e-5 and S.OptimConfig().betas == (0.9, 0.999)
    assert RolloutParams().rollout_class == "areal_graph.workflows.rollout.single_turn_math:SingleTurnMath"
    assert SamplingParams().stop == [] and SamplingParams().stop is not SamplingParams().stop


def test_spec_is_frozen():
    spec = load_workflow_text(MINIMAL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.runtime.steps = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.nodes["train"].params.clip_eps = 0.3  # type: ignore[misc]


def test_graph_package_imports_neither_torch_nor_grpc():
    import subprocess

    code = (
        "import sys; import areal_graph.graph.loader, areal_graph.graph.render, areal_graph.graph.dag; "
        "bad = [m for m in ('torch', 'grpc') if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_unset_fields_take_dataclass_defaults():
    spec = load_workflow_text(MINIMAL)
    train = spec.nodes["train"].params
    for f in dataclasses.fields(TrainParams):
        if f.name != "clip_eps":
            assert getattr(train, f.name) == f.default
    # `auto` is resolved by the loader: an asynchronous run (max_staleness 4) on the embedded engine keeps the cache
    assert spec.inference == S.InferenceSpec(kv_on_update="keep")
    assert spec.nodes["rollout"].params.sampling == SamplingParams(max_new_tokens=32)
    assert spec.models["ref"].train is None
    assert spec.models["actor"].train == S.OptimConfig(lr=1e-5)


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_shipped_workflows_validate(path):
    spec = load_workflow(path)
    assert spec.name == path.stem
    assert spec.source == str(path)
    assert spec.inference.backend == "embedded"
    # every shipped workflow runs from a fresh install: builtin kits and datasets only
    from areal_graph.modelkit.builtin import BUILTIN_DATASETS, BUILTIN_KITS, BUILTIN_REWARD_MODELS, SHIPPED_DATASETS

    kits = {m.path.removeprefix("builtin:") for m in spec.models.values()}
    assert all(m.path.startswith("builtin:") for m in spec.models.values())
    assert kits <= set(BUILTIN_KITS) | set(BUILTIN_REWARD_MODELS)
    for data in filter(None, (spec.data.train, spec.data.eval)):
        if data.startswith(("reasoning_gym:", "verifiers:", "textarena:")):  # generated offline (data/generated.py)
            continue
        name = data.removeprefix("builtin:")
        assert data.startswith("builtin:") and (name in SHIPPED_DATASETS or BUILTIN_DATASETS[name][0] in kits)
    rollout = spec.nodes_of_kind("rollout")[0]
    assert spec.runtime.batch_size % rollout.params.group_size == 0
    long_kits = {"tiny-arith-long": 320, "tiny-arith-ladder": 160}
    assert rollout.params.sampling.max_new_tokens <= (
        max(long_kits[k] for k in kits) if kits <= set(long_kits) else 128
    )


def test_shipped_workflow_specifics():
    names = {p.stem for p in WORKFLOWS}
    assert {"ppo_async", "grpo_sync", "ppo_gae_critic"} <= names
    a = load_workflow(REPO / "workflows/ppo_async.yaml")
    s = load_workflow(REPO / "workflows/grpo_sync.yaml")
    c = load_workflow(REPO / "workflows/ppo_gae_critic.yaml")
    assert a.runtime.max_staleness == 4 and s.runtime.max_staleness == 0
    # kv_on_update: auto keeps the KV cache at updates when asynchronous, recomputes when synchronous
    assert (a.inference.kv_on_update, s.inference.kv_on_update) == ("keep", "recompute")
    for spec in (a, s):
        assert spec.nodes["advantage"].params.estimator == "grpo"
        assert spec.nodes["train"].params.loss == "decoupled_ppo"

    # grpo_sync differs from ppo_async only in name and staleness (and what `auto` resolves to)
    def lineless(spec):
        return {k: dataclasses.replace(n, line=None) for k, n in spec.nodes.items()}

    assert lineless(s) == lineless(a)
    assert (
        dataclasses.replace(
            s,
            name=a.name,
            source=a.source,
            nodes=a.nodes,
            runtime=dataclasses.replace(s.runtime, max_staleness=4),
            inference=dataclasses.replace(s.inference, kv_on_update="keep"),
        )
        == a
    )
    assert c.nodes["advantage"].params.estimator == "gae"
    assert c.nodes["value"].model == "critic"
    losses = {n.params.loss: n.model for n in c.nodes_of_kind("train")}
    assert losses == {"decoupled_ppo": "actor", "value": "critic"}


# ----------------------------------------------------------------------------- overrides
def test_overrides_reach_every_section():
    spec = load_workflow(
        REPO / "workflows/ppo_async.yaml",
        overrides=[
            "runtime.steps=10",
            "nodes.train.clip_eps=0.1",
            "models.actor.train.lr=1e-5",
            "nodes.rollout.sampling.temperature=0.5",
            "data.eval_size=8",
            "nodes.train.behav_imp_cap=null",
        ],
    )
    assert spec.runtime.steps == 10
    assert spec.nodes["train"].params.clip_eps == 0.1
    assert spec.models["actor"].train.lr == 1e-5
    assert spec.nodes["rollout"].params.sampling.temperature == 0.5
    assert spec.data.eval_size == 8
    assert spec.nodes["train"].params.behav_imp_cap is None
    # an override may create a missing mapping: the `train` section of the frozen ref
    spec = load_workflow(FIXTURES / "minimal.yaml", overrides=["models.ref.train.lr=3.0e-6"])
    assert spec.models["ref"].train == S.OptimConfig(lr=3e-6)


def test_override_values_are_yaml_scalars():
    assert parse_override("a.b=3") == (["a", "b"], 3)
    assert parse_override("a.b=3.5") == (["a", "b"], 3.5)
    assert parse_override("a.b=true") == (["a", "b"], True)
    assert parse_override("a.b=null") == (["a", "b"], None)
    assert parse_override("a.b=[x, y]") == (["a", "b"], ["x", "y"])
    assert parse_override("a.b=x=y") == (["a", "b"], "x=y")
    for bad in ("no_equals", "a..b=1", ".a=1"):
        with pytest.raises(ValueError):
            parse_override(bad)


@pytest.mark.parametrize(
    "override,node,field,words",
    [
        ("nodes.train.clp_eps=0.1", "train", "clp_eps", "did you mean 'clip_eps'"),
        ("nodes.trian.clip_eps=0.1", "trian", "clip_eps", "no node 'trian' (did you mean 'train'?)"),
        ("models.actr.train.lr=1", None, "models.actr.train.lr", "no model 'actr'"),
        ("runtme.steps=3", None, "runtme", "did you mean 'runtime'"),
        ("runtime.steps.deep=3", None, "runtime.steps.deep", "not a mapping"),
        ("runtime.steps=-2", None, "runtime.steps", "must be > 0"),
        ("runtime.steps=ten", None, "runtime.steps", "expected an integer"),
        ("runtime.restart_window_s=0", None, "runtime.restart_window_s", "must be > 0, got 0"),
        ("runtime.restart_window_s=-60", None, "runtime.restart_window_s", "must be > 0, got -60"),
        ("runtime.restart_window_s=daily", None, "runtime.restart_window_s", "expected a number"),
        ("runtime.max_restarts=-1", None, "runtime.max_restarts", "must be >= 0, got -1"),
        ("novalue", None, None, "must look like key.path=value"),
    ],
)
def test_bad_override_is_a_problem_like_any_other(override, node, field, words):
    with pytest.raises(WorkflowError) as info:
        load_workflow_text(MINIMAL, overrides=[override], file="m.yaml")
    (problem,) = info.value.problems
    assert problem.node == node and problem.field == field, problem
    assert words in problem.message
    if "=" in override:
        assert override in str(problem)


def test_the_restart_window_defaults_to_ten_minutes_and_null_counts_over_the_run():
    assert load_workflow_text(MINIMAL).runtime.restart_window_s == 600.0
    assert load_workflow_text(MINIMAL, overrides=["runtime.restart_window_s=null"]).runtime.restart_window_s is None
    assert load_workflow_text(MINIMAL, overrides=["runtime.restart_window_s=30"]).runtime.restart_window_s == 30.0


@settings(max_examples=40, deadline=None)
@given(steps=st.integers(min_value=-(10**6), max_value=10**6), eps=st.floats(-2, 2, allow_nan=False))
def test_override_range_property(steps, eps):
    """Any integer step count > 0 and clip eps > 0 is accepted as given; others are named."""
    try:
        spec = load_workflow_text(MINIMAL, overrides=[f"runtime.steps={steps}", f"nodes.train.clip_eps={eps!r}"])
    except WorkflowError as err:
        fields = {p.field for p in err.problems}
        assert fields == ({"runtime.steps"} if steps <= 0 else set()) | ({"clip_eps"} if eps <= 0 else set())
        return
    assert steps > 0 and eps > 0
    assert spec.runtime.steps == steps and spec.nodes["train"].params.clip_eps == eps


@settings(max_examples=30, deadline=None)
@given(g=st.integers(1, 16), b=st.integers(1, 128))
def test_batch_size_must_hold_whole_groups(g, b):
    overrides = [f"nodes.rollout.group_size={g}", f"runtime.batch_size={b}"]
    if b % g == 0:
        assert load_workflow_text(MINIMAL, overrides=overrides).runtime.batch_size == b
    else:
        with pytest.raises(WorkflowError) as info:
            load_workflow_text(MINIMAL, overrides=overrides)
        assert [p.field for p in info.value.problems] == ["runtime.batch_size"]


def test_yaml_anchors_and_merge_keys():
    """Users share settings with anchors; merged keys must validate like written ones."""
    text = MINIMAL.replace(
        "  ref_logp:\n    kind: logprob\n    model: ref\n", "  ref_logp: &lp\n    kind: logprob\n    model: ref\n"
    )
    text = text.replace(
        "  prox_logp:\n    kind: logprob\n    model: actor\n    reads: [input_ids]\n",
        "  prox_logp:\n    <<: *lp\n    model: actor\n",
    )
    spec = load_workflow_text(text)
    assert spec.nodes["prox_logp"].model == "actor"
    assert spec.nodes["prox_logp"].reads == ("input_ids",)
    assert spec.nodes["prox_logp"].writes == ("prox_logprobs",)


def test_schema_reference_lists_every_field_with_its_default():
    from areal_graph.graph.schema_doc import schema_markdown

    doc = schema_markdown()
    for cls in (
        S.OptimConfig,
        S.DataSpec,
        S.InferenceSpec,
        S.RuntimeSpec,
        SamplingParams,
        *(info.params for info in BUILTIN_KINDS.values()),
    ):
        for f in dataclasses.fields(cls):
            row = next((line for line in doc.splitlines() if line.startswith(f"| {f.name} |")), None)
            assert row is not None, f"{cls.__name__}.{f.name} missing"
    assert "| clip_eps | float | 0.2 |" in doc
    assert "| max_staleness | int | 4 |" in doc
    assert "| estimator | grpo or rloo or gae or reinforce | 'grpo' |" in doc


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], "keep"),  # ppo_async: asynchronous, embedded
        (["runtime.max_staleness=0"], "recompute"),  # synchronous: nothing in flight worth keeping
        (["inference.backend=vllm"], "recompute"),  # vLLM cannot keep it: still a valid workflow
        (["inference.backend=sglang", "runtime.weight_sync=disk"], "recompute"),
        (["inference.kv_on_update=recompute"], "recompute"),  # an explicit setting wins
        (["inference.kv_on_update=wait"], "wait"),
    ],
)
def test_kv_on_update_auto_is_resolved_once_by_the_loader(overrides, expected):
    spec = load_workflow(REPO / "workflows/ppo_async.yaml", overrides)
    assert spec.inference.kv_on_update == expected
    assert S.resolve_kv_on_update("auto", "embedded", 1) == "keep"
    assert S.resolve_kv_on_update("auto", "embedded", 0) == "recompute"
