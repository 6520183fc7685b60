"""data/prompt_lengths.py: a bounded sample of a dataset's prompts, rendered as the run renders them
(the same `render_rows` as `load_prompts`), and their token lengths."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from areal_graph.data import prompt_lengths
from areal_graph.data.datasets import load_prompts

DATA = SimpleNamespace(
    prompt_template="Q: {question}\nA:",
    question_key="question",
    answer_key="answer",
    layout="auto",
    source_key="data_source",
)


@pytest.fixture(scope="module")
def tokenizer(kit):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(kit / "model")


def write_rows(path, questions):
    path.write_text(
        "".join(json.dumps({"id": f"r{i}", "question": q, "answer": "1"}) + "\n" for i, q in enumerate(questions))
    )
    return path


def test_a_small_file_is_rendered_whole_exactly_as_the_run_renders_it(kit, tokenizer, tmp_path):
    found = prompt_lengths.measure(str(kit / "train.jsonl"), kit / "train.jsonl", tokenizer, DATA, tmp_path)
    run, _ = load_prompts(kit / "train.jsonl", tokenizer, prompt_template=DATA.prompt_template)
    assert found.sample == f"all {len(run)} rows"
    assert sorted(found.lengths) == sorted(len(p.input_ids) for p in run)
    longest = max(run, key=lambda p: len(p.input_ids))
    assert (found.longest, found.longest_id, found.longest_question) == (
        len(longest.input_ids),
        longest.id,
        longest.question,
    )


def test_of_a_large_file_the_longest_questions_of_the_first_rows_are_rendered(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(prompt_lengths, "SAMPLE_ROWS", 3)
    monkeypatch.setattr(prompt_lengths, "READ_ROWS", 8)
    questions = ["1 + 1"] * 8 + ["9 + 9 + 9 + 9 + 9 + 9 + 9 + 9"]  # the longest is past the rows read
    questions[2], questions[5] = "2 + 2 + 2 + 2", "3 + 3 + 3"
    rows, what = prompt_lengths.sample("f.jsonl", write_rows(tmp_path / "f.jsonl", questions), DATA, tmp_path)
    assert what == "the 3 longest questions of its first 8 rows"
    assert [row["id"] for _, row in rows] == ["r0", "r2", "r5"]  # ties: the earlier row; in file order
    monkeypatch.setattr(prompt_lengths, "READ_ROWS", 100)
    rows, what = prompt_lengths.sample("f.jsonl", tmp_path / "f.jsonl", DATA, tmp_path)
    assert what == "the 3 longest questions of 9 rows" and rows[-1][1]["id"] == "r8"


def test_a_generated_dataset_not_written_yet_is_sampled_from_its_first_rows_without_writing(tokenizer, tmp_path):
    pytest.importorskip("reasoning_gym")
    spec = "reasoning_gym:spell_backward?size=500&seed=3"
    found = prompt_lengths.measure(spec, None, tokenizer, DATA, tmp_path)
    assert found.sample == f"its first {prompt_lengths.GENERATED_ROWS} rows"
    assert len(found.lengths) == prompt_lengths.GENERATED_ROWS
    assert found.longest_question.startswith("Spell this word backward")
    assert not (tmp_path / "reasoning_gym").exists()  # validate writes nothing into the cache
    from areal_graph.data import generated

    path = generated.materialize(spec, tmp_path)  # once written (by a run), the file is read instead
    assert generated.cached(spec, tmp_path) == path
    assert (
        prompt_lengths.measure(spec, None, tokenizer, DATA, tmp_path).sample == "the 256 longest questions of 500 rows"
    )


def test_no_usable_row_is_none(tokenizer, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"q": "no question field"}) + "\n")
    assert prompt_lengths.measure(str(path), path, tokenizer, DATA, tmp_path) is None
