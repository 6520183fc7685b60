"""graph/overrides.py on its own: how `key.path=value` is parsed and set into the raw mapping
before validation, and which overrides are refused there (with the override named).

tests/graph/test_spec.py runs overrides through the whole loader; here `apply_overrides` is
called on plain dicts, so what it does to the mapping (and what it records as the origin of
each value) is checked directly."""

from __future__ import annotations

import pytest

from areal_graph.graph.overrides import apply_overrides, parse_override


@pytest.mark.parametrize(
    "text,parts,value",
    [
        (" runtime.steps = 7", ["runtime", "steps"], 7),  # key and value are stripped
        ("a.b=", ["a", "b"], ""),  # an empty value is the empty string, not null
        ("a.b=  ", ["a", "b"], ""),
        ("a.b=~", ["a", "b"], None),
        ("a.b=2e-5", ["a", "b"], "2e-5"),  # YAML 1.1: no dot, a string (the validator reads it as a number)
        ("a.b=2.0e-5", ["a", "b"], 2.0e-5),
        ("a.b={x: 1}", ["a", "b"], {"x": 1}),
        ("a.b='3'", ["a", "b"], "3"),
        ("a.b=[unclosed", ["a", "b"], "[unclosed"),  # not YAML: kept as the text given
        ("a.b=x: y: z", ["a", "b"], "x: y: z"),
        ("single=1", ["single"], 1),
    ],
)
def test_parse_override_splits_the_path_and_reads_the_value_as_yaml(text, parts, value):
    assert parse_override(text) == (parts, value)


@pytest.mark.parametrize(
    "text,words",
    [
        ("runtime.steps", "must look like key.path=value"),
        ("a.=1", "empty path component"),
        ("=1", "empty path component"),
    ],
)
def test_malformed_overrides_are_value_errors_quoting_the_override(text, words):
    with pytest.raises(ValueError, match=words) as info:
        parse_override(text)
    assert repr(text) in str(info.value)


def test_overrides_are_set_in_place_and_their_origins_recorded():
    raw = {"runtime": {"steps": 5}, "nodes": {"train": {"kind": "train", "clip_eps": 0.2}}}
    problems, origins = apply_overrides(
        raw,
        ["runtime.steps=10", "nodes.train.clip_eps=0.1", "nodes.train.extra.deep=on", "runtime.steps=12"],
        "wf.yaml",
    )
    assert problems == []
    # intermediate mappings are created; the last override of a key wins; YAML 1.1 reads `on` as true
    assert raw == {
        "runtime": {"steps": 12},
        "nodes": {"train": {"kind": "train", "clip_eps": 0.1, "extra": {"deep": True}}},
    }
    assert origins == {
        ("runtime", "steps"): "runtime.steps=12",
        ("nodes", "train", "clip_eps"): "nodes.train.clip_eps=0.1",
        ("nodes", "train", "extra", "deep"): "nodes.train.extra.deep=on",
    }


def test_an_override_may_add_a_missing_section():
    raw = {"name": "x"}
    problems, origins = apply_overrides(raw, ["inference.backend=vllm"], "f")
    assert problems == [] and raw == {"name": "x", "inference": {"backend": "vllm"}}
    assert origins == {("inference", "backend"): "inference.backend=vllm"}


def test_bad_overrides_are_problems_and_the_good_ones_still_apply():
    raw = {"runtime": {"steps": 5}, "nodes": {"train": {}}, "models": {"actor": {"path": "p"}}}
    problems, origins = apply_overrides(
        raw,
        [
            "noequals",  # not key=value
            "runtme.steps=3",  # unknown section
            "nodes.trian.lr=1",  # no such node
            "models.actr.path=q",  # no such model
            "runtime.steps.deep=1",  # steps is not a mapping
            "runtime.batch_size=8",  # fine
        ],
        "wf.yaml",
    )
    assert raw["runtime"] == {"steps": 5, "batch_size": 8} and "trian" not in raw["nodes"]
    assert "actr" not in raw["models"] and "runtme" not in raw
    assert list(origins) == [("runtime", "batch_size")]
    got = [(p.file, p.line, p.node, p.field) for p in problems]
    assert got == [
        ("wf.yaml", None, None, None),
        ("wf.yaml", None, None, "runtme"),
        ("wf.yaml", None, "trian", "lr"),
        ("wf.yaml", None, None, "models.actr.path"),
        ("wf.yaml", None, None, "runtime.steps.deep"),
    ]
    messages = [p.message for p in problems]
    assert messages[0].startswith("bad override: ") and "must look like key.path=value" in messages[0]
    assert "unknown section 'runtme' (did you mean 'runtime'?)" in messages[1]
    assert "sections: name, models, data, inference, nodes, runtime" in messages[1]
    assert "the workflow has no node 'trian' (did you mean 'train'?)" in messages[2]
    assert "the workflow has no model 'actr' (did you mean 'actor'?)" in messages[3]
    assert "'runtime.steps' is not a mapping, cannot set 'deep' in it" in messages[4]
    for text, problem in zip(
        ["runtme.steps=3", "nodes.trian.lr=1", "models.actr.path=q", "runtime.steps.deep=1"], problems[1:]
    ):
        assert repr(text) in problem.message  # each names the override it came from


def test_a_section_that_is_not_a_mapping_cannot_take_a_key():
    raw = {"runtime": [1, 2]}
    problems, origins = apply_overrides(raw, ["runtime.steps=3"], "f")
    assert raw == {"runtime": [1, 2]} and origins == {}
    assert [p.field for p in problems] == ["runtime.steps"] and "'runtime' is not a mapping" in problems[0].message


def test_an_override_into_a_scalar_of_a_node_names_the_node():
    raw = {"nodes": {"train": {"sampling": 3}}}
    problems, origins = apply_overrides(raw, ["nodes.train.sampling.temperature=0.5"], "f")
    assert raw == {"nodes": {"train": {"sampling": 3}}} and origins == {}
    [problem] = problems
    assert problem.node == "train" and "'nodes.train.sampling' is not a mapping" in problem.message
