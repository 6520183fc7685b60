"""cli/prompt_fit.py: validate and run measure a sample of each dataset's prompts, rendered with the
workflow's template and the policy's tokenizer, against the policy's context; a prompt that leaves
no room for max_new_tokens is an error naming the dataset, the longest prompt and what to change.
Nothing is built or downloaded: a kit not built yet is checked later, by the run."""

from __future__ import annotations

import pytest

from areal_graph.cli.prompt_fit import check_prompts
from areal_graph.data.datasets import load_prompts
from areal_graph.graph.loader import load_workflow
from support.paths import WORKFLOWS

TEMPLATE = "Q: {question} A:"


@pytest.fixture(scope="module")
def lengths(kit):
    """The token lengths of the kit's train prompts under TEMPLATE, as the run renders them."""
    from transformers import AutoTokenizer

    prompts, _ = load_prompts(kit / "train.jsonl", AutoTokenizer.from_pretrained(kit / "model"), TEMPLATE)
    return [len(p.input_ids) for p in prompts], prompts


@pytest.fixture(scope="module")
def longest(lengths):
    """(tokens, id) of the kit's longest train prompt."""
    top = max(lengths[1], key=lambda p: len(p.input_ids))
    return len(top.input_ids), top.id


def spec_on(kit, *overrides: str):
    return load_workflow(
        WORKFLOWS / "ppo_async.yaml",
        [
            f"models.actor.path={kit / 'model'}",
            f"data.train={kit / 'train.jsonl'}",
            "data.eval=null",
            f"data.prompt_template='{TEMPLATE}'",
            *overrides,
        ],
    )


def test_prompts_that_fit_say_how_much_room_they_leave(kit, longest):
    spec = spec_on(kit, "nodes.rollout.sampling.max_new_tokens=64")
    assert spec.data.prompt_template == TEMPLATE
    check = check_prompts(spec)
    assert check.problems == [] and check.complete
    tokens, _ = longest
    assert check.lines == [
        f"prompts: data.train ({kit / 'train.jsonl'}): the longest of 40 (all 40 rows) is {tokens} tokens + 64 new = "
        f"{tokens + 64}, within the 512-token context of models.actor ({kit / 'model'})"
    ]


def test_a_prompt_without_room_for_the_answer_is_an_error_naming_it_and_the_fixes(kit, longest):
    tokens, row_id = longest
    check = check_prompts(spec_on(kit, f"nodes.rollout.sampling.max_new_tokens={512 - tokens + 1}"))
    [problem] = check.problems
    assert problem.startswith(f"data.train ({kit / 'train.jsonl'}): the longest sampled prompt, {row_id!r} (")
    assert f"is {tokens} tokens with the template and chat template" in problem
    assert (
        f"with nodes.rollout.sampling.max_new_tokens {512 - tokens + 1} it needs 513, past the 512-token context"
        in problem
    )
    assert f"lower nodes.rollout.sampling.max_new_tokens to at most {512 - tokens}" in problem
    assert f"set data.max_prompt_tokens: {tokens - 1} (longer prompts are skipped, and counted)" in problem
    assert "shorten data.prompt_template" in problem


def test_the_server_s_own_cap_is_the_context_when_set(kit, longest):
    tokens, _ = longest
    check = check_prompts(
        spec_on(kit, f"inference.args.max_context={tokens + 10}", "nodes.rollout.sampling.max_new_tokens=16")
    )
    [problem] = check.problems
    assert f"past the {tokens + 10}-token context inference.args.max_context sets" in problem
    assert "raise inference.args.max_context toward the model's 512" in problem


def test_max_prompt_tokens_skips_the_long_ones_and_all_skipped_is_an_error(kit, lengths):
    """The run skips prompts over data.max_prompt_tokens: only the rest must leave room."""
    cap = sorted(lengths[0])[len(lengths[0]) // 2]
    kept = sum(n <= cap for n in lengths[0])
    fits = check_prompts(
        spec_on(kit, f"nodes.rollout.sampling.max_new_tokens={512 - cap}", f"data.max_prompt_tokens={cap}")
    )
    assert fits.problems == []
    assert fits.lines[0].endswith(
        f"the longest of {kept} (all 40 rows) is {cap} tokens + {512 - cap} new = 512, within the 512-token context of models.actor ({kit / 'model'})"
    )
    [problem] = check_prompts(
        spec_on(kit, f"nodes.rollout.sampling.max_new_tokens={513 - cap}", f"data.max_prompt_tokens={cap}")
    ).problems
    assert "it needs 513, past the 512-token context" in problem
    [problem] = check_prompts(spec_on(kit, "data.max_prompt_tokens=1")).problems
    assert (
        f"every sampled prompt (all 40 rows) is longer than data.max_prompt_tokens (1), the shortest {min(lengths[0])} tokens"
        in problem
    )


def test_a_kit_not_built_yet_is_left_to_the_run_and_nothing_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv("AREAL_GRAPH_CACHE", str(tmp_path / "empty"))
    check = check_prompts(load_workflow(WORKFLOWS / "textarena_guess.yaml"))
    assert check.problems == [] and check.complete is False
    assert check.lines == [
        "prompts: not checked yet: builtin:tiny-guess is not built yet (the run builds it, then checks)"
    ]
    assert not (tmp_path / "empty").exists()


def test_a_model_whose_context_is_unknown_is_not_checked(tmp_path):
    (tmp_path / "model").mkdir()
    check = check_prompts(load_workflow(WORKFLOWS / "ppo_async.yaml", [f"models.actor.path={tmp_path / 'model'}"]))
    assert check.problems == [] and check.complete
    assert check.lines == [
        f"prompts: not checked (the context of models.actor ({tmp_path / 'model'}) is not known here)"
    ]
