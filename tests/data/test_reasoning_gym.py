"""reasoning-gym tasks as datasets (data/reasoning_gym.py) and their scorers as the reward
(`fn: reasoning_gym`): specs parsed and checked with clear errors, rows generated once and the
same every time, and the reward agreeing with the library's own score_answer."""

from __future__ import annotations

import json

import pytest

from areal_graph.data import reasoning_gym as rg
from areal_graph.data.datasets import load_prompts
from support.ci import optional


@pytest.fixture(scope="module")
def lib():
    return optional("reasoning_gym", "pip install 'reasoning-gym>=0.1.25,<0.2' (in the dev extra)")


@pytest.mark.parametrize(
    "spec,parsed",
    [
        ("reasoning_gym:basic_arithmetic", ("basic_arithmetic", {"size": rg.DEFAULT_SIZE, "seed": 0})),
        ("reasoning_gym:leg_counting?size=20&seed=3", ("leg_counting", {"size": 20, "seed": 3})),
        (
            "reasoning_gym:basic_arithmetic?size=5&min_terms=2&whitespace=single&allow_x=true&p=0.5&operators=+,-",
            (
                "basic_arithmetic",
                {
                    "size": 5,
                    "seed": 0,
                    "min_terms": 2,
                    "whitespace": "single",
                    "allow_x": True,
                    "p": 0.5,
                    "operators": ["+", "-"],
                },
            ),
        ),
        (
            "reasoning_gym:basic_arithmetic?operators=%2A",
            ("basic_arithmetic", {"size": rg.DEFAULT_SIZE, "seed": 0, "operators": "*"}),
        ),
    ],
)
def test_specs_parse_with_typed_options(spec, parsed):
    assert rg.parse_spec(spec) == parsed


@pytest.mark.parametrize(
    "spec,message",
    [
        ("reasoning_gym:", "give a dataset"),
        ("reasoning_gym:x?size=0", "size must be an integer in"),
        ("reasoning_gym:x?size=many", "size must be an integer in"),
        ("reasoning_gym:x?seed=1.5", "seed must be an integer"),
        ("reasoning_gym:x?size", "options must look like"),
    ],
)
def test_bad_specs_are_clear_errors(spec, message):
    with pytest.raises(rg.ReasoningGymError, match=message):
        rg.parse_spec(spec)


def test_an_unknown_dataset_or_option_is_named_with_the_nearest(lib):
    problem = rg.check_spec("reasoning_gym:basic_arithmatic?size=10")
    assert "reasoning-gym has no dataset 'basic_arithmatic' (did you mean 'basic_arithmetic'" in problem
    assert "leg_counting" in problem  # the whole list follows
    problem = rg.check_spec("reasoning_gym:basic_arithmetic?size=10&no_such_option=1")
    assert problem.startswith("reasoning_gym:basic_arithmetic: its options are ") and "min_terms" in problem
    assert rg.check_spec("reasoning_gym:basic_arithmetic?size=10&seed=1") is None
    assert rg.check_spec("reasoning_gym:basic_arithmetic?size=10&operators=+") is None  # a one-item list


def test_list_options_reach_the_config(lib, tmp_path):
    path = rg.materialize(
        "reasoning_gym:basic_arithmetic?size=30&seed=1&operators=+,-&allow_parentheses=false", tmp_path
    )
    questions = [json.loads(line)["question"] for line in path.read_text().splitlines()]
    assert not any(c in q for q in questions for c in "*/()")


def test_without_the_package_the_error_is_the_pip_command(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_rg(name, *a, **k):
        if name.startswith("reasoning_gym"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_rg)
    assert (
        rg.check_spec("reasoning_gym:basic_arithmetic")
        == f"reasoning_gym: datasets need the reasoning-gym package: {rg.PIP}"
    )


def test_rows_are_generated_once_the_same_and_load_as_prompts(lib, tmp_path):
    from areal_graph.modelkit.tokenizer import train_tokenizer

    spec = "reasoning_gym:leg_counting?size=12&seed=5"
    path = rg.materialize(spec, tmp_path)
    again = rg.materialize(spec, tmp_path)
    assert again == path and path.parent == tmp_path / "reasoning_gym"
    other = rg.materialize("reasoning_gym:leg_counting?size=12&seed=6", tmp_path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 12 and rows != [json.loads(line) for line in other.read_text().splitlines()]
    direct = lib.create_dataset("leg_counting", size=12, seed=5)
    for i, row in enumerate(rows):  # what the library generates, with the entry for its scorer
        payload = json.loads(row["answer"])
        assert row["question"] == direct[i]["question"] and payload["entry"]["answer"] == direct[i]["answer"]
        assert payload["reasoning_gym"] == "leg_counting" and row["data_source"] == "reasoning_gym/leg_counting"
    tok = train_tokenizer([r["question"] for r in rows] * 3, vocab_size=300)
    prompts, report = load_prompts(path, tok)
    assert report.loaded == 12 and json.loads(prompts[0].answer) == json.loads(rows[0]["answer"])


@pytest.mark.parametrize("name", ["basic_arithmetic", "leg_counting", "word_sorting", "letter_counting"])
def test_the_reward_is_the_tasks_own_score(lib, tmp_path, name):
    """The oracle answer in <answer> tags or as \\boxed{} scores what the library's score_answer
    gives it (1.0); a wrong answer scores what the library gives that; untagged text scores 0."""
    from areal_graph.api.reward_fns import resolve_reward_fn

    fn = resolve_reward_fn("reasoning_gym")
    path = rg.materialize(f"reasoning_gym:{name}?size=6&seed=2", tmp_path)
    score = lib.get_score_answer_fn(name)
    for line in path.read_text().splitlines():
        row = json.loads(line)
        entry = json.loads(row["answer"])["entry"]
        oracle = str(entry["answer"])
        for completion in (f"Thinking.\n<answer>{oracle}</answer>", f"So the answer is \\boxed{{{oracle}}}."):
            if "\\boxed" in completion and "}" in oracle:
                continue  # braces inside a box are ambiguous for any extractor
            assert fn(completion, row["answer"]) == pytest.approx(score(oracle, entry)) == pytest.approx(1.0)
        assert fn("<answer>definitely wrong</answer>", row["answer"]) == pytest.approx(score("definitely wrong", entry))
        # no tag and no box: no answer, whatever the text contains (partial credit for containing
        # the oracle is what a policy learns to game)
        assert fn(f"The answer is{oracle} + 3}}.", row["answer"]) == pytest.approx(score(None, entry)) == 0.0


def test_the_reward_on_a_row_that_is_not_reasoning_gym_says_so():
    from areal_graph.nodes.reasoning_gym_reward import reasoning_gym_reward

    with pytest.raises(ValueError, match="fn: reasoning_gym scores rows of a reasoning_gym:<dataset> dataset"):
        reasoning_gym_reward("\\boxed{3}", "3")
