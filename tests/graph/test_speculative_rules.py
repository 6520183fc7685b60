"""`inference.speculative`: a section that always exists (off by default), set in the file or with
`--set`, every out-of-range value reported with file and field, max_match against min_match, and
speculation asked of SGLang or vLLM refused by name with how to turn on their own."""

from __future__ import annotations

import dataclasses

import pytest

from areal_graph.graph import spec as S
from areal_graph.graph.dump import dump_workflow
from areal_graph.graph.loader import WorkflowError, load_workflow, load_workflow_text
from support.paths import FIXTURES, WORKFLOWS

MINIMAL = (FIXTURES / "minimal.yaml").read_text()


def test_the_section_exists_and_is_off_by_default():
    sp = load_workflow_text(MINIMAL).inference.speculative
    assert sp == S.SpeculativeSpec()
    assert (sp.enabled, sp.max_draft, sp.max_rows, sp.min_match, sp.max_match) == (False, 4, None, 2, 4)
    assert (sp.history_prompts, sp.history_answers, sp.shadow_every) == (128, 8, 16)
    assert S.InferenceSpec().speculative == S.SpeculativeSpec()  # built in Python: the same section


def test_set_reaches_a_field_of_a_section_the_file_does_not_have():
    assert "speculative" not in MINIMAL
    sp = load_workflow_text(
        MINIMAL, ["inference.speculative.enabled=true", "inference.speculative.max_rows=16"]
    ).inference.speculative
    assert (sp.enabled, sp.max_rows, sp.max_draft) == (True, 16, 4)


def test_the_section_in_yaml_and_its_dump_round_trip():
    text = MINIMAL + (
        "inference:\n"
        "  speculative:\n"
        "    enabled: true\n"
        "    max_draft: 8\n"
        "    min_match: 3\n"
        "    max_match: 3\n"
        "    history_prompts: 1\n"
        "    history_answers: 0\n"
    )
    spec = load_workflow_text(text)
    assert spec.inference.speculative == S.SpeculativeSpec(
        enabled=True, max_draft=8, min_match=3, max_match=3, history_prompts=1, history_answers=0
    )
    again = load_workflow_text(dump_workflow(spec))
    assert again.inference.speculative == spec.inference.speculative
    assert "  speculative:\n    enabled: true\n    max_draft: 8\n" in dump_workflow(spec)


@pytest.mark.parametrize(
    "override, message",
    [
        ("max_draft=0", "field 'inference.speculative.max_draft': must be in [1, 16], got 0"),
        ("max_draft=17", "field 'inference.speculative.max_draft': must be in [1, 16], got 17"),
        ("max_draft=2.5", "field 'inference.speculative.max_draft': expected an integer, got a number 2.5"),
        ("max_rows=0", "field 'inference.speculative.max_rows': must be > 0, got 0"),
        ("min_match=0", "field 'inference.speculative.min_match': must be >= 1, got 0"),
        ("max_match=0", "field 'inference.speculative.max_match': must be >= 1, got 0"),
        (
            "max_match=1",
            "field 'inference.speculative.max_match': must be >= inference.speculative.min_match (2): the "
            "longest suffix looked up cannot be shorter than the shortest, got 1",
        ),
        ("history_prompts=0", "field 'inference.speculative.history_prompts': must be > 0, got 0"),
        ("history_answers=-1", "field 'inference.speculative.history_answers': must be >= 0, got -1"),
        ("shadow_every=-1", "field 'inference.speculative.shadow_every': must be >= 0, got -1"),
        ("shadow_every=2.5", "field 'inference.speculative.shadow_every': expected an integer, got a number 2.5"),
        ("enabled=yes please", "field 'inference.speculative.enabled': expected true/false, got a string"),
        ("draft=4", "field 'inference.speculative.draft': unknown field 'draft'"),
    ],
)
def test_a_value_out_of_range_names_file_and_field(override, message):
    with pytest.raises(WorkflowError) as err:
        load_workflow(WORKFLOWS / "ppo_async.yaml", [f"inference.speculative.{override}"])
    found = [str(p) for p in err.value.problems]
    assert len(found) == 1 and found[0].startswith(str(WORKFLOWS / "ppo_async.yaml")), found
    assert message in found[0] and f"(set by override 'inference.speculative.{override}')" in found[0], found


def test_max_match_below_min_match_in_the_file_names_its_line():
    text = MINIMAL + "inference:\n  speculative:\n    min_match: 5\n    max_match: 4\n"
    with pytest.raises(WorkflowError) as err:
        load_workflow_text(text, file="wf.yaml")
    (problem,) = err.value.problems
    assert (problem.file, problem.field) == ("wf.yaml", "inference.speculative.max_match")
    assert problem.line == text.splitlines().index("    max_match: 4") + 1
    assert problem.message.startswith("must be >= inference.speculative.min_match (5)")


@pytest.mark.parametrize(
    "backend, how",
    [
        (
            "sglang",
            "SGLang's --speculative-algorithm server argument (its n-gram lookup: inference.args "
            "speculative_algorithm: NGRAM, with its speculative_* settings)",
        ),
        (
            "vllm",
            'vLLM\'s --speculative-config with method "ngram" (inference.args speculative_config: '
            '\'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}\')',
        ),
    ],
)
def test_speculation_asked_of_sglang_or_vllm_is_refused_by_name(backend, how):
    with pytest.raises(WorkflowError) as err:
        load_workflow(
            WORKFLOWS / "ppo_async.yaml",
            ["inference.speculative.enabled=true", f"inference.backend={backend}", "runtime.weight_sync=disk"],
        )
    found = [p for p in err.value.problems if p.field == "inference.speculative.enabled"]
    assert len(found) == 1, [str(p) for p in err.value.problems]
    assert found[0].message == (
        "speculative decoding from the prompt group's answers is the embedded engine's; the "
        f"{backend} backend has speculative decoding of its own: set enabled: false and turn it on with "
        f"{how} (set by override 'inference.speculative.enabled=true')"
    )
    # off (the default) with those backends is fine, settings and all
    spec = load_workflow(
        WORKFLOWS / "ppo_async.yaml",
        [f"inference.backend={backend}", "runtime.weight_sync=disk", "inference.speculative.max_draft=8"],
    )
    assert spec.inference.speculative.max_draft == 8 and not spec.inference.speculative.enabled


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
def test_shadow_counting_asked_of_sglang_or_vllm_is_refused(backend):
    base = ["inference.backend=" + backend, "runtime.weight_sync=disk"]
    with pytest.raises(WorkflowError) as err:
        load_workflow(WORKFLOWS / "ppo_async.yaml", [*base, "inference.speculative.shadow_every=4"])
    found = [p for p in err.value.problems if p.field == "inference.speculative.shadow_every"]
    assert len(found) == 1, [str(p) for p in err.value.problems]
    assert found[0].message.startswith(
        f"counting what speculation would accept is the embedded engine's; the {backend} backend "
        "does not count it: remove the field (or set 0), got 4"
    )
    for value in (0, 16):  # off, and the default every workflow has
        spec = load_workflow(WORKFLOWS / "ppo_async.yaml", [*base, f"inference.speculative.shadow_every={value}"])
        assert spec.inference.speculative.shadow_every == value


def test_the_schema_reference_has_the_section_with_its_defaults():
    from areal_graph.graph.schema_doc import schema_markdown

    doc = schema_markdown()
    assert "## inference.speculative" in doc
    section = doc.split("## inference.speculative", 1)[1].split("\n## ", 1)[0]
    for f in dataclasses.fields(S.SpeculativeSpec):
        assert f"| {f.name} |" in section, f.name
    assert "| max_draft | int | 4 | tokens a request proposes at most per step, in [1, 16]" in section
    assert "| max_rows | int or null | null |" in section
    assert "| speculative | SpeculativeSpec | (see below) |" in doc
