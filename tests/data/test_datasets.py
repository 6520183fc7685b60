"""The prompt loader: formats, templates, GSM8K answers, and bad rows reported, not fatal."""

from __future__ import annotations

import json
import logging

import pytest

from areal_graph.data.datasets import DatasetError, format_prompt, load_prompts, reference_answer
from areal_graph.modelkit.tokenizer import train_tokenizer
from support.ci import missing


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["What is 1 + 2?", "Natalia sold clips to 48 of her friends"] * 20, vocab_size=280)


def write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_rows_become_chat_prompts_with_ids(tok, tmp_path):
    path = write(
        tmp_path / "d.jsonl",
        [
            json.dumps({"question": "What is 1 + 2?", "answer": "3"}),
            json.dumps({"question": "What is 2 + 2?", "answer": 4, "id": "q2"}),
        ],
    )
    prompts, report = load_prompts(path, tok)
    assert report.loaded == 2 and report.total_skipped == 0
    assert prompts[0].text == "<|bos|><|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n"
    assert prompts[0].input_ids == tok(prompts[0].text, add_special_tokens=False).input_ids
    assert (prompts[0].id, prompts[1].id, prompts[1].answer) == ("d:1", "q2", "4")


def test_template_keys_and_gsm8k_answers(tok, tmp_path):
    path = write(
        tmp_path / "gsm.jsonl", [json.dumps({"problem": "Natalia sold 48 clips.", "solution": "48/2 = 24\n#### 1,072"})]
    )
    prompts, _ = load_prompts(
        path, tok, prompt_template="{question}\nAnswer in \\boxed{{}}.", question_key="problem", answer_key="solution"
    )
    assert "Natalia sold 48 clips.\nAnswer in \\boxed{}." in prompts[0].text
    assert prompts[0].answer == "1072"
    assert reference_answer(" -7 ") == "-7" and reference_answer("\\frac{1}{2}") == "\\frac{1}{2}"
    with pytest.raises(DatasetError, match="must contain '{question}'"):
        load_prompts(path, tok, prompt_template="no placeholder")


def test_the_question_as_the_row_gives_it_beside_the_templated_prompt(tok, tmp_path):
    """`Prompt.question` is what an environment restates ("try again: ..."): no template, no chat
    markup; for a conversation, its last user message."""
    path = write(
        tmp_path / "q.jsonl",
        [
            json.dumps({"question": "What is 1 + 2?", "answer": "3"}),
            json.dumps(
                {
                    "question": [
                        {"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "What is 2 + 2?"},
                    ],
                    "answer": "4",
                }
            ),
        ],
    )
    prompts, _ = load_prompts(path, tok, prompt_template="Q: {question}")
    assert [p.question for p in prompts] == ["What is 1 + 2?", "What is 2 + 2?"]
    assert "Q: What is 1 + 2?" in prompts[0].text and prompts[0].text.startswith("<|bos|><|im_start|>user")


def test_without_chat_template_the_raw_text_is_the_prompt(tok):
    class Plain:
        chat_template = None

    assert format_prompt(Plain(), "2+2?", "Q: {question}\nA:") == "Q: 2+2?\nA:"


def test_bad_rows_are_skipped_counted_and_named(tok, tmp_path, caplog):
    good = json.dumps({"question": "What is 1 + 2?", "answer": "3"})
    path = write(
        tmp_path / "bad.jsonl",
        [
            good,
            "{not json",
            json.dumps(["a list"]),
            json.dumps({"question": "no answer"}),
            json.dumps({"question": "", "answer": "1"}),
            json.dumps({"question": 5, "answer": "1"}),
            json.dumps({"question": "blank answer", "answer": "  "}),
            "",
            json.dumps({"question": "What is 1 + 2? " * 40, "answer": "3"}),
            good,
        ],
    )
    with caplog.at_level(logging.WARNING):
        prompts, report = load_prompts(path, tok, max_prompt_tokens=40)
    assert len(prompts) == 2 and report.loaded == 2
    assert report.skipped == {
        "invalid JSON": 1,
        "not an object": 1,
        "missing 'answer'": 1,
        "empty or non-text 'question'": 2,
        "empty 'answer'": 1,
        "prompt too long": 1,
    }
    assert report.examples[0].startswith("line 2: invalid JSON")
    assert "7 skipped" in str(report) and "bad.jsonl" in caplog.text


def test_json_array_and_whole_file_errors(tok, tmp_path):
    arr = tmp_path / "d.json"
    arr.write_text(json.dumps([{"question": "What is 1 + 2?", "answer": "3"}]))
    assert load_prompts(arr, tok)[1].loaded == 1
    with pytest.raises(DatasetError, match="does not exist"):
        load_prompts(tmp_path / "missing.jsonl", tok)
    (tmp_path / "d.csv").write_text("question,answer\n")
    with pytest.raises(DatasetError, match="unknown format '.csv'"):
        load_prompts(tmp_path / "d.csv", tok)
    (tmp_path / "obj.json").write_text("{}")
    with pytest.raises(DatasetError, match="list of rows"):
        load_prompts(tmp_path / "obj.json", tok)


def test_parquet_rows_load_like_jsonl(tok, tmp_path):
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        missing("pyarrow", "a dev dependency: make install")

    pq.write_table(pa.table({"question": ["What is 1 + 2?", None], "answer": ["3", "4"]}), tmp_path / "d.parquet")
    prompts, report = load_prompts(tmp_path / "d.parquet", tok)
    assert [p.answer for p in prompts] == ["3"] and report.skipped == {"missing 'question'": 1}


def test_hostile_rows_are_skipped_in_bounded_memory(tok, tmp_path, monkeypatch):
    """Non-UTF-8 bytes, JSON nested 20k deep and a row far over the row limit are skipped and
    counted; the rows around them load. The long row is never held whole (the limit is set
    to 64 KiB here and the row is 8 MiB)."""
    from areal_graph.data import dataset_files

    monkeypatch.setattr(dataset_files, "MAX_ROW_BYTES", 64 << 10)
    good = json.dumps({"question": "What is 1 + 2?", "answer": "3"}).encode()
    lines = [
        good,
        b'{"question": "caf\xe9", "answer": "1"}',
        b"[" * 20_000 + b"]" * 20_000,
        b'{"question": "' + b"x" * (8 << 20) + b'", "answer": "1"}',
        good,
    ]
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    prompts, report = load_prompts(path, tok)
    assert len(prompts) == 2 and [p.id for p in prompts] == ["hostile:1", "hostile:5"]
    assert report.skipped == {"not UTF-8": 1, "nested too deeply": 1, "row too long": 1}


def test_hostile_json_array_files_are_clear_errors(tok, tmp_path, monkeypatch):
    from areal_graph.data import dataset_files

    (tmp_path / "latin1.json").write_bytes(b'[{"question": "caf\xe9", "answer": "1"}]')
    with pytest.raises(DatasetError, match="latin1.json: not UTF-8"):
        load_prompts(tmp_path / "latin1.json", tok)
    (tmp_path / "deep.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(DatasetError, match="deep.json: JSON nested too deeply"):
        load_prompts(tmp_path / "deep.json", tok)
    monkeypatch.setattr(dataset_files, "MAX_JSON_FILE_BYTES", 1000)
    (tmp_path / "big.json").write_text(json.dumps([{"question": "What is 1 + 2?", "answer": "3"}] * 100))
    with pytest.raises(DatasetError, match="big.json: a .json dataset is read whole.*write it as JSONL"):
        load_prompts(tmp_path / "big.json", tok)


def test_an_eval_file_without_usable_rows_is_an_error_not_evaluation_off(tok, tmp_path):
    """An empty or all-bad data.eval used to turn evaluation off without a word."""
    from areal_graph.data.datasets import load_run_prompts
    from areal_graph.graph.spec import DataSpec

    tok.save_pretrained(tmp_path / "tok")
    train = write(tmp_path / "train.jsonl", [json.dumps({"question": "What is 1 + 2?", "answer": "3"})])
    (tmp_path / "empty.jsonl").write_text("")
    bad = write(tmp_path / "bad.jsonl", [json.dumps({"problem": "What is 1 + 2?", "answer": "3"})])
    for path in (tmp_path / "empty.jsonl", bad):
        with pytest.raises(DatasetError, match=rf"data.eval \({path}\) has no usable rows: .*set data.eval: null"):
            load_run_prompts(DataSpec(train=str(train), eval=str(path)), str(tmp_path / "tok"), seed=0)
    prompts, evals = load_run_prompts(DataSpec(train=str(train), eval=str(train)), str(tmp_path / "tok"), seed=0)
    assert len(prompts) == len(evals) == 1
    assert load_run_prompts(DataSpec(train=str(train)), str(tmp_path / "tok"), seed=0)[1] == []
