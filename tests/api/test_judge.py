"""A judge's template and verdict rules (api/judge.py): what validation refuses, and the reward
each reply gives, written out by hand."""

from __future__ import annotations

import pytest

from areal_graph.api.judge import DEFAULT_TEMPLATE, parse_verdict, pattern_problem, render, template_problem


def test_templates_name_only_known_placeholders_and_show_the_response():
    assert template_problem(DEFAULT_TEMPLATE) is None
    assert "['question']" in template_problem("{question} {response}")
    assert "never shows the judge the {response}" in template_problem("{prompt} {answer}")
    assert "not a format string" in template_problem("{response")
    assert "['0']" in template_problem("{0} {response}")
    assert render("P={prompt} R={response} A={answer} {{x}}", "p", "r", "a") == "P=p R=r A=a {x}"


def test_patterns_need_exactly_one_group():
    assert pattern_problem(r"(\d+)") is None
    assert "exactly one group" in pattern_problem(r"\d+") and "has 2" in pattern_problem(r"(a)(b)")
    assert "not a regular expression" in pattern_problem("(")


@pytest.mark.parametrize(
    "reply, verdict, pattern, expected",
    [
        ("Yes, the answer is right.", "yes_no", None, 1.0),
        ("NO.", "yes_no", None, 0.0),
        ("no... wait, yes", "yes_no", None, 0.0),  # the first verdict counts
        ("yesterday it was fine", "yes_no", None, None),  # a word boundary: not a verdict
        ("", "yes_no", None, None),
        ("Verdict: CORRECT", "yes_no", r"Verdict: (\w+)", None),  # found, but neither yes nor no
        ("I'd give it 7/10", "score", None, 0.7),
        ("10", "score", None, 1.0),
        ("11 out of 10", "score", None, None),  # outside the scale: unparsable, not clipped
        ("-1", "score", None, None),
        ("score: 2.5 (of 5)", "score", r"score: ([\d.]+)", 0.5),
        ("no number here", "score", None, None),
    ],
)
def test_verdicts(reply, verdict, pattern, expected):
    score_max = 5.0 if pattern and "score" in pattern else 10.0
    assert parse_verdict(reply, verdict, pattern, score_max) == expected


def test_choose_model_prefers_the_newest_adapter_then_the_one_served():
    from areal_graph.api.judge import choose_model

    p = "policy-lora-v"
    assert choose_model(["base", f"{p}2", f"{p}10", f"{p}9", f"{p}x"], p, own_server=True) == f"{p}10"
    assert choose_model(["inference-0"], p, own_server=False) == "inference-0"
    assert choose_model(["inference-0", "other"], p, own_server=True) == "inference-0"
    with pytest.raises(ValueError, match="serves 2 models"):
        choose_model(["a", "b"], p, own_server=False)
    with pytest.raises(ValueError, match="lists no model"):
        choose_model([], p, own_server=True)
