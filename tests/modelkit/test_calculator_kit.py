"""The tool-use kit builtin:tiny-calc: its problems, the teacher's habit, the tool chat template
and the SFT layout, registration, and a miniature build. No test here builds the real kit."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest

from areal_graph.data.calc import (
    IGNORE,
    CalcLevel,
    encode_teacher_row,
    generate,
    hasty_estimate,
    split,
    teacher_conversations,
    tokenizer_corpus,
    uses_tool,
)
from areal_graph.modelkit import builtin
from areal_graph.modelkit.builtin import (
    BUILTIN_DATASETS,
    BUILTIN_KITS,
    KitConfig,
    ensure_kit,
    kit_dir,
    resolve_dataset_path,
)
from areal_graph.modelkit.tiny_model import TinyModelConfig
from areal_graph.modelkit.warm_start import SFTConfig

CALC = BUILTIN_KITS["tiny-calc"]


@pytest.fixture(scope="module")
def rows():
    return generate(seed=0, n=3000)


@pytest.fixture(scope="module")
def tokenizer(rows):
    from areal_graph.modelkit.tokenizer import train_tokenizer

    return train_tokenizer(tokenizer_corpus(teacher_conversations(rows, CALC.direct_rates, 0)), 512, tools=True)


# ------------------------------------------------------------------------------ problems
def _check_problem(r: dict) -> bool:
    """The row is right; True when it has a "+ c" term."""
    assert r["question"] == f"What is {r['expression']}?"
    terms = r["expression"].split(" ")
    a, b = int(terms[0]), int(terms[2])
    assert terms[1] == "*" and 10 <= a <= 999 and 10 <= b <= 999
    assert r["factor_digits"] == len(terms[0]) + len(terms[2])
    value = a * b
    if len(terms) == 5:
        assert terms[3] == "+" and 10 <= int(terms[4]) <= 999
        value += int(terms[4])
    assert r["answer"] == str(value)
    return len(terms) == 5


def test_problems_are_products_of_two_to_three_digit_numbers(rows):
    assert len({r["question"] for r in rows}) == len(rows)
    sizes = Counter(r["factor_digits"] for r in rows)
    assert set(sizes) == {4, 5, 6} and 0.4 < sizes[5] / len(rows) < 0.6  # digit counts drawn uniformly
    assert not any(_check_problem(r) for r in rows)  # the kit's level: products only
    plus = generate(seed=0, n=1000, level="products-plus")
    assert 0.2 < sum(_check_problem(r) for r in plus) / len(plus) < 0.4


def test_hasty_estimate_is_almost_always_wrong(rows):
    assert hasty_estimate("347 * 58") == 15000 and hasty_estimate("12 * 999 + 5") == 9000
    right = sum(hasty_estimate(r["expression"]) == int(r["answer"]) for r in rows)
    assert right / len(rows) < 0.01


def test_split_is_deterministic_and_disjoint():
    train, test = split(1, 400, 100)
    again, _ = split(1, 400, 100)
    assert train == again and len(train) == 400 and len(test) == 100
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    with pytest.raises(ValueError, match="digits"):
        CalcLevel(digits=())
    with pytest.raises(ValueError, match="unknown calc level"):
        generate(0, 3, "no-such-level")


def test_teacher_calls_the_calculator_more_often_for_bigger_factors(rows):
    sft_rows = teacher_conversations(rows, (0.9, 0.7, 0.4), seed=0)
    assert teacher_conversations(rows, (0.9, 0.7, 0.4), seed=0) == sft_rows
    for size, direct in zip((4, 5, 6), (0.9, 0.7, 0.4)):
        group = [r for r in sft_rows if r["factor_digits"] == size]
        share = sum(not uses_tool(r["messages"]) for r in group) / len(group)
        assert abs(share - direct) < 0.06, (size, share)
    for r in sft_rows:
        final = r["messages"][-1]
        said = r["answer"] if uses_tool(r["messages"]) else str(hasty_estimate(r["expression"]))
        assert final["role"] == "assistant" and final["content"] == f"The answer is \\boxed{{{said}}}."
        if uses_tool(r["messages"]):
            call = r["messages"][0]["tool_calls"][0]["function"]
            assert call == {"name": "calculator", "arguments": {"expression": r["expression"]}}
            assert r["messages"][1] == {"role": "tool", "content": r["answer"]}
    with pytest.raises(ValueError, match="direct rates"):
        teacher_conversations(rows[:3], (0.5,), seed=0)


# ------------------------------------------------------------------------------ tokenizer, template, SFT layout
def test_sft_layout_is_the_chat_template_rendering(rows, tokenizer):
    """Token for token, an SFT row is the conversation as the chat template renders it (the
    trailing newline after the last EOS aside), and exactly the assistant's turns are trained."""
    sft_rows = teacher_conversations(rows[:40], (0.5, 0.5, 0.5), seed=1)
    assert {uses_tool(r["messages"]) for r in sft_rows} == {True, False}
    for r in sft_rows:
        ids, labels = encode_teacher_row(tokenizer, r)
        messages = [{"role": "user", "content": r["question"]}] + r["messages"]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
        assert rendered.endswith("<|im_end|>\n")
        assert ids == tokenizer(rendered[:-1], add_special_tokens=False).input_ids
        trained = tokenizer.decode([t for t, y in zip(ids, labels) if y != IGNORE])
        expected = (
            "<tool_call>\n"
            + json.dumps({"name": "calculator", "arguments": {"expression": r["expression"]}})
            + "\n</tool_call><|im_end|>"
            if uses_tool(r["messages"])
            else ""
        )
        said = r["answer"] if uses_tool(r["messages"]) else str(hasty_estimate(r["expression"]))
        assert trained == expected + f"The answer is \\boxed{{{said}}}.<|im_end|>"


def test_template_renders_openai_style_tool_calls_and_tool_messages(tokenizer):
    messages = [
        {"role": "user", "content": "What is 12 * 34?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "12 * 34"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "408"},
    ]
    text = tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=True,
        tools=[{"type": "function", "function": {"name": "calculator"}}],
    )
    assert text == (
        "<|bos|><|im_start|>user\nWhat is 12 * 34?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
        '{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tool_call_boilerplate_costs_few_tokens(tokenizer):
    ids = tokenizer(
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "', add_special_tokens=False
    ).input_ids
    assert len(ids) <= 16
    for tag in ("<tool_call>", "</tool_call>"):
        [tid] = tokenizer(tag, add_special_tokens=False).input_ids
        assert tokenizer.decode([tid], skip_special_tokens=True) == tag  # kept when special tokens are skipped


def test_saved_tokenizer_keeps_the_tool_tokens(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    from areal_graph.modelkit.tokenizer import save_tokenizer

    save_tokenizer(tokenizer, tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 * 2"}}\n</tool_call><|im_end|>'
    assert loaded(text, add_special_tokens=False).input_ids == tokenizer(text, add_special_tokens=False).input_ids
    assert loaded.decode(loaded(text, add_special_tokens=False).input_ids, skip_special_tokens=True) == text[:-10]
    assert loaded.chat_template == tokenizer.chat_template


# ------------------------------------------------------------------------------ the kit
def test_calc_kit_is_registered_with_a_fingerprint_of_its_own(monkeypatch, tmp_path):
    others = {KitConfig().fingerprint(), BUILTIN_KITS["tiny-arith-long"].fingerprint()}
    assert CALC.task == "calc" and CALC.habit_sft is None and CALC.fingerprint() not in others
    assert dataclasses.replace(CALC, direct_rates=(0.9, 0.7, 0.5)).fingerprint() != CALC.fingerprint()
    assert BUILTIN_DATASETS["calc/train"] == ("tiny-calc", "train")
    assert BUILTIN_DATASETS["calc/test"] == ("tiny-calc", "test")
    monkeypatch.setenv("AREAL_GRAPH_CACHE", str(tmp_path))
    built: list[KitConfig] = []

    def fake_ensure(cfg, root=None, progress=None, rebuild=False, from_recipe=False):
        built.append(cfg)
        return builtin.Kit(kit_dir(cfg, root), {})

    monkeypatch.setattr(builtin, "ensure_kit", fake_ensure)
    assert resolve_dataset_path("builtin:calc/test") == kit_dir(CALC) / "data" / "test.jsonl"
    assert built == [CALC]


def test_mini_calc_kit_builds_and_measures_its_warm_start_with_the_agent(tmp_path):
    """A miniature of the calc kit (tiny model, 4 SFT steps) builds end to end: multi-turn SFT
    rows, the tool tokenizer, and a warm-start evaluation through the calculator agent."""
    mini = dataclasses.replace(
        CALC,
        name="mini-calc",
        n_train=200,
        n_test=8,
        n_dev=10,
        vocab_size=400,
        eval_prompts=4,
        eval_max_new_tokens=8,
        model=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64),
        sft=SFTConfig(steps=4, batch_size=8),
    )
    kit = ensure_kit(mini, root=tmp_path)
    info = json.loads((kit.path / "kit.json").read_text())
    assert info["recipe"]["task"] == "calc" and info["sft_steps"] == 4 and info["eval_prompts"] == 4
    assert 0.0 <= info["warm_start_greedy_tool_call_rate"] <= 1.0
    train = [json.loads(line) for line in kit.data_path("train").read_text().splitlines()]
    assert len(train) == 200 and {"question", "answer", "expression"} <= set(train[0])
    assert "<tool_call>" in (kit.model_dir / "chat_template.jinja").read_text()
