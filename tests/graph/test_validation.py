"""Every validation rule has a broken workflow in tests/fixtures/broken/; each must be reported
with the right node, field and YAML line, in a message a user can act on, without a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_graph.cli.main import main
from areal_graph.graph.loader import Problem, WorkflowError, load_workflow, load_workflow_text
from support.paths import FIXTURES

DATA = FIXTURES
BROKEN = DATA / "broken"

# file stem -> (node, field, words the message must contain, text on the line it must point at)
# node None: a problem outside `nodes:`. line marker None: no line is expected.
CASES: dict[str, tuple[str | None, str, tuple[str, ...], str | None]] = {
    "unknown_kind": ("reward", "kind", ("unknown node kind", "rewrad", "did you mean 'reward'"), "kind: rewrad"),
    "misspelt_field": ("train", "clip_epss", ("unknown field", "did you mean 'clip_eps'"), "clip_epss:"),
    "misspelt_nested_field": ("rollout", "sampling.temprature", ("did you mean 'temperature'",), "temprature"),
    "unknown_section": (None, "runtim", ("unknown section", "did you mean 'runtime'"), "runtim:"),
    "wrong_type_int": (None, "runtime.batch_size", ("expected an integer", "sixteen"), "batch_size: sixteen"),
    "wrong_type_list": ("reward", "reads", ("expected a list",), "reads: input_ids"),
    "wrong_type_str": ("reward", "fn", ("expected a string", "42"), "fn: 42"),
    "wrong_type_bool": ("advantage", "group_std", ("expected true/false", "maybe"), "group_std: maybe"),
    "bad_enum": ("advantage", "estimator", ("must be one of", "'gea'", "did you mean 'gae'"), "estimator: gea"),
    "negative_batch_size": (None, "runtime.batch_size", ("must be > 0", "-16"), "batch_size: -16"),
    "clip_eps_zero": ("train", "clip_eps", ("must be > 0",), "clip_eps: 0"),
    "negative_staleness": (None, "runtime.max_staleness", ("must be >= 0", "-1"), "max_staleness: -1"),
    "read_unwritten_key": (
        "train",
        "reads.3",
        ("'prox_logprob'", "no node writes", "did you mean 'prox_logprobs'"),
        "prox_logprob,",
    ),
    "two_writers": (
        "advantage",
        "writes",
        ("'rewards'", "also written by node 'reward'"),
        "writes: [advantages, rewards]",
    ),
    "cycle": (
        "advantage",
        "reads",
        ("dependency cycle", "advantage -> ref_logp -> advantage"),
        "reads: [rewards, loss_mask, ref_logprobs]",
    ),
    "train_without_advantages": (
        "train",
        "reads",
        ("needs advantages", "decoupled_ppo"),
        "reads: [input_ids, loss_mask, behav_logprobs, prox_logprobs]",
    ),
    "unknown_model": ("prox_logp", "model", ("unknown model 'actr'", "did you mean 'actor'"), "model: actr"),
    "missing_model": ("prox_logp", "model", ("logprob node needs 'model'",), "  prox_logp:"),
    "frozen_model_trained": ("train", "model", ("model 'ref'", "no 'train' section"), "    model: ref\n    clip"),
    "missing_section": (None, "data", ("missing required section 'data'",), None),
    "missing_model_path": (None, "models.actor.path", ("missing required field 'path'",), "  actor:"),
    "no_rollout": (None, "nodes", ("exactly one node of kind 'rollout'",), "nodes:"),
    "batch_not_multiple_of_group": (
        None,
        "runtime.batch_size",
        ("multiple of nodes.rollout.group_size (4)", "18"),
        "batch_size: 18",
    ),
    "ppo_minibatches_over_batch": (
        "train",
        "ppo_minibatches",
        ("at most runtime.batch_size (8)", "16"),
        "ppo_minibatches: 16",
    ),
    "gae_without_values": (
        "advantage",
        "reads",
        ("'gae' must read values",),
        "reads: [rewards, loss_mask, ref_logprobs]",
    ),
    "model_device_unknown": (None, "models.actor.device", ("must be cpu, cuda or cuda:N", "gpu0"), "device: gpu0"),
    "yaml_syntax": (None, "", ("YAML syntax error",), None),
    "generation_reads_training_key": (
        "reward",
        "reads.2",
        ("'prox_logprobs'", "node 'prox_logp' writes on the training side", "generation side"),
        "reads: [input_ids, loss_mask, prox_logprobs]",
    ),
    "function_phase_generation_reads_training_key": (
        "shaping",
        "reads.0",
        ("'advantages'", "training side"),
        "reads: [advantages]",
    ),
    "misspelt_function_path": (
        "shaping",
        "fn",
        ("no module named 'areal_graph.nodes.shapng'",),
        "fn: areal_graph.nodes.shapng",
    ),
    "function_args_do_not_fit": (
        "shaping",
        "fn",
        ("cannot be called with weight", "'weights'"),
        "fn: areal_graph.nodes.shaping:weighted_sum",
    ),
    "concurrency_below_group_size": (
        None,
        "runtime.max_concurrent_rollouts",
        ("at least nodes.rollout.group_size (4)",),
        "max_concurrent_rollouts: 2",
    ),
    "renamed_workflow_field": ("rollout", "workflow", ("renamed to 'rollout_class'",), "workflow: areal_graph"),
    "runtime_dp_size_moved": (None, "runtime.dp_size", ("moved", "models.<name>.dp_size"), "dp_size: 2"),
    "model_dp_size_zero": (None, "models.actor.dp_size", ("must be > 0", "got 0"), "dp_size: 0"),
}


def _line_of(path: Path, marker: str) -> int:
    """1-based line where `marker` starts (a multi-line marker: its first line)."""
    text = path.read_text()
    assert text.count(marker) == 1, f"marker {marker!r} must occur once in {path.name}"
    return text[: text.index(marker)].count("\n") + 1


def _problems(path: Path) -> list[Problem]:
    with pytest.raises(WorkflowError) as info:
        load_workflow(path)
    return info.value.problems


def test_every_broken_file_has_a_case():
    files = {p.stem for p in BROKEN.glob("*.yaml")}
    assert len(files) >= 15
    assert files == set(CASES), (
        f"files without a case: {files - set(CASES)}; cases without a file: {set(CASES) - files}"
    )


def test_minimal_workflow_is_valid():
    spec = load_workflow(DATA / "minimal.yaml")
    assert spec.name == "minimal" and len(spec.nodes) == 6


@pytest.mark.parametrize("stem", sorted(CASES))
def test_broken_file_reports_node_field_and_line(stem):
    node, field, words, marker = CASES[stem]
    path = BROKEN / f"{stem}.yaml"
    problems = _problems(path)
    # Each broken file has exactly one thing wrong; `read_unwritten_key` also trips the
    # train loss's required-reads rule (a true second problem), nothing else may appear.
    expected_count = 2 if stem == "read_unwritten_key" else 1
    assert len(problems) == expected_count, "\n".join(map(str, problems))
    problem = problems[0]
    assert problem.file == str(path)
    assert problem.node == node
    assert (problem.field or "") == field
    for word in words:
        assert word in problem.message, f"{word!r} not in {problem.message!r}"
    if marker is not None:
        assert problem.line == _line_of(path, marker)
    text = str(problem)
    assert str(path) in text
    if node is not None:
        assert f"node '{node}'" in text
    if field:
        assert f"field '{field}'" in text
    if problem.line is not None:
        assert f"{path}:{problem.line}" in text


def test_yaml_syntax_error_names_the_line():
    path = BROKEN / "yaml_syntax.yaml"
    (problem,) = _problems(path)
    # The parser notices the unclosed `[` on the line after it opens, or on it.
    opened = _line_of(path, "clip_eps: [0.2")
    assert problem.line in (opened, opened + 1)


@pytest.mark.parametrize("stem", sorted(CASES))
def test_cli_validate_prints_problem_without_traceback(stem, capsys):
    node, field, words, _ = CASES[stem]
    rc = main(["validate", str(BROKEN / f"{stem}.yaml")])
    out = capsys.readouterr()
    assert rc == 1
    text = out.out + out.err
    assert "Traceback" not in text
    assert words[0] in " ".join(text.split())  # rich may wrap long lines
    if node is not None:
        assert f"node '{node}'" in text


def test_all_problems_are_reported_at_once():
    text = (DATA / "minimal.yaml").read_text()
    text = (
        text.replace("clip_eps: 0.2", "clip_eps: -0.2\n    agg: mean")
        .replace("batch_size: 16", "batch_size: -3")
        .replace("kind: reward", "kind: reward\n    timeout_s: fast")
        .replace("model: ref\n    reads", "model: reff\n    reads")
    )
    with pytest.raises(WorkflowError) as info:
        load_workflow_text(text, file="many.yaml")
    got = {(p.node, p.field) for p in info.value.problems}
    assert got == {
        ("train", "clip_eps"),
        ("train", "agg"),
        (None, "runtime.batch_size"),
        ("reward", "timeout_s"),
        ("ref_logp", "model"),
    }, info.value.problems
    lines = [p.line for p in info.value.problems]
    assert lines == sorted(lines), "problems come in file order"
    assert "5 problem(s)" in str(info.value)


def test_missing_file_is_a_clear_error():
    with pytest.raises(WorkflowError) as info:
        load_workflow(DATA / "does_not_exist.yaml")
    assert "cannot read workflow file" in info.value.problems[0].message


@pytest.mark.parametrize(
    "text,field,words",
    [
        ("- just\n- a list\n", "", "must be a mapping"),
        ("", "", "must be a mapping"),
    ],
)
def test_non_mapping_documents(text, field, words):
    with pytest.raises(WorkflowError) as info:
        load_workflow_text(text, file="x.yaml")
    assert words in info.value.problems[0].message


def test_yaml_exponent_without_dot_is_a_number():
    """YAML 1.1 reads `1e-5` as a string; a float field accepts it as the number it means."""
    text = (DATA / "minimal.yaml").read_text().replace("lr: 1.0e-5", "lr: 1e-5")
    spec = load_workflow_text(text)
    assert spec.models["actor"].train.lr == 1e-5


def _all_paths(raw, prefix=()):
    if isinstance(raw, dict):
        for k, v in raw.items():
            yield prefix + (k,)
            yield from _all_paths(v, prefix + (k,))


@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "80")), deadline=None)
@given(data=st.data())
def test_any_value_anywhere_gives_a_spec_or_a_workflow_error(data):
    """Replace any key of a valid workflow with any YAML value: the loader must either accept
    it or raise WorkflowError naming that spot, never crash with another exception."""
    import yaml

    raw = yaml.safe_load((DATA / "minimal.yaml").read_text())
    path = data.draw(st.sampled_from(sorted(_all_paths(raw), key=str)))
    scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-2, 2, allow_nan=False) | st.text(max_size=6)
    value = data.draw(
        st.recursive(
            scalars,
            lambda inner: (
                st.lists(inner, max_size=3) | st.dictionaries(st.text(min_size=1, max_size=5), inner, max_size=3)
            ),
            max_leaves=6,
        )
    )
    target = raw
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    text = yaml.safe_dump(raw, sort_keys=False)
    try:
        load_workflow_text(text, file="fuzz.yaml")
    except WorkflowError as err:
        assert err.problems and all(isinstance(p, Problem) and p.message for p in err.problems)
        assert all(str(p).startswith("fuzz.yaml") for p in err.problems)
