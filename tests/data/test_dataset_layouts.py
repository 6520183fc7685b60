"""Datasets as users have them: verl's parquet layout read as it is, chat-message prompts in
JSONL, a Hugging Face `datasets` folder written by the real library's save_to_disk, and the
data source of every row kept for per-source metrics.

The verl rows are the shape verl's examples/data_preprocess/gsm8k.py writes: `prompt` a list of
chat messages, `reward_model: {style, ground_truth}`, `data_source`, `extra_info: {split, index}`.
"""

from __future__ import annotations

import json

import pytest

from areal_graph.data.dataset_files import ARROW_BATCH_ROWS, DatasetError
from areal_graph.data.datasets import field_value, load_prompts, row_keys
from areal_graph.modelkit.tokenizer import train_tokenizer
from support.ci import missing


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["What is 1 + 2? Let's think step by step", "You are a careful tutor."] * 20, vocab_size=300)


def verl_row(i: int, question: str, answer: str, source: str, system: bool = False) -> dict:
    messages = ([{"role": "system", "content": "You are a careful tutor."}] if system else []) + [
        {"role": "user", "content": question + ' Let\'s think step by step and output the final answer after "####".'}
    ]
    return {
        "data_source": source,
        "prompt": messages,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "index": i, "answer": f"... #### {answer}"},
    }


ROWS = [
    verl_row(0, "What is 1 + 2?", "3", "openai/gsm8k"),
    verl_row(1, "What is 2 + 2?", "4", "lighteval/MATH", system=True),
    {"data_source": "openai/gsm8k", "prompt": [], "reward_model": {"ground_truth": "1"}},
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "narrator", "content": "x"}],
        "reward_model": {"ground_truth": "1"},
    },
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "What is 5 + 5?"}],
        "reward_model": {"style": "rule"},
    },
]


def pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        missing("pyarrow", "a dev dependency: make install")
    return pa, pq


def test_dotted_keys_and_the_layout_of_a_row():
    row = ROWS[0]
    assert field_value(row, "reward_model.ground_truth") == "3" and field_value(row, "extra_info.index") == 0
    assert field_value({"a.b": 1, "a": {"b": 2}}, "a.b") == 1  # a key with a dot wins over the path
    assert row_keys(row, "auto", "question", "answer") == ("prompt", "reward_model.ground_truth")
    assert row_keys({"question": "q", **row}, "auto", "question", "answer") == ("question", "answer")
    assert row_keys(row, "fields", "question", "answer") == ("question", "answer")
    assert row_keys({}, "verl", "question", "answer") == ("prompt", "reward_model.ground_truth")


def test_verl_parquet_loads_with_no_configuration(tok, tmp_path):
    pa, pq = pyarrow()
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "train.parquet")
    prompts, report = load_prompts(tmp_path / "train.parquet", tok)
    assert [(p.id, p.answer, p.source) for p in prompts] == [("0", "3", "openai/gsm8k"), ("1", "4", "lighteval/MATH")]
    # the conversation goes through the chat template as given, system turn included
    assert prompts[0].text == tok.apply_chat_template(
        [dict(m) for m in ROWS[0]["prompt"]], tokenize=False, add_generation_prompt=True
    )
    assert prompts[1].text.count("You are a careful tutor.") == 1 and prompts[1].messages == tuple(ROWS[1]["prompt"])
    assert prompts[0].input_ids == tok(prompts[0].text, add_special_tokens=False).input_ids
    assert report.skipped == {"'prompt' is not a conversation": 2, "missing 'reward_model.ground_truth'": 1}
    assert any("role 'narrator'" in e for e in report.examples)


def test_a_template_applies_to_the_last_user_turn(tok, tmp_path):
    pa, pq = pyarrow()
    pq.write_table(pa.Table.from_pylist(ROWS[1:2]), tmp_path / "d.parquet")
    [prompt], _ = load_prompts(tmp_path / "d.parquet", tok, prompt_template="Q: {question}\nA:")
    assert "Q: What is 2 + 2?" in prompt.text and "Q: You are" not in prompt.text


def test_explicit_keys_read_verl_rows_too_and_fields_layout_refuses_them(tok, tmp_path):
    path = tmp_path / "verl.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:2]))
    explicit, _ = load_prompts(
        path, tok, question_key="prompt", answer_key="reward_model.ground_truth", layout="fields"
    )
    auto, _ = load_prompts(path, tok)
    assert [p.text for p in explicit] == [p.text for p in auto] and len(auto) == 2
    prompts, report = load_prompts(path, tok, layout="fields")  # question / answer: not in these rows
    assert prompts == [] and report.skipped == {"missing 'question'": 2}
    with pytest.raises(DatasetError, match="layout must be one of auto, fields, verl"):
        load_prompts(path, tok, layout="sharegpt")


def test_chat_prompts_need_a_chat_template(tmp_path):
    class Plain:
        chat_template = None

        def __call__(self, text, add_special_tokens=False):
            raise AssertionError("never tokenised")

    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"question": [{"role": "user", "content": "hi"}], "answer": "1"}) + "\n")
    prompts, report = load_prompts(path, Plain())
    assert prompts == [] and report.skipped == {"a chat-message prompt needs a tokenizer with a chat template": 1}


def test_parquet_is_read_a_batch_at_a_time(tok, tmp_path, monkeypatch):
    """More rows than one record batch: every row arrives, in order, with its row number."""
    pa, pq = pyarrow()
    n = ARROW_BATCH_ROWS * 2 + 7
    pq.write_table(
        pa.table({"question": [f"What is {i} + 1?" for i in range(n)], "answer": [str(i + 1) for i in range(n)]}),
        tmp_path / "big.parquet",
        row_group_size=500,
    )
    prompts, report = load_prompts(tmp_path / "big.parquet", tok)
    assert report.loaded == n and [p.answer for p in prompts[-2:]] == [str(n - 1), str(n)]
    assert prompts[-1].id == f"big:{n}"


def test_a_damaged_parquet_file_is_an_error_naming_it(tok, tmp_path):
    pa, pq = pyarrow()
    pq.write_table(pa.Table.from_pylist(ROWS[:2]), tmp_path / "d.parquet")
    data = (tmp_path / "d.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match="cut.parquet: not a readable parquet file"):
        load_prompts(tmp_path / "cut.parquet", tok)


def test_a_datasets_folder_written_by_save_to_disk(tok, tmp_path):
    try:
        import datasets
    except ImportError:
        missing("datasets", "a dev dependency: make install")
    rows = ROWS[:2] * 3
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "one"))
    prompts, report = load_prompts(tmp_path / "one", tok)
    assert [p.answer for p in prompts] == ["3", "4"] * 3 and report.total_skipped == 0
    assert {p.source for p in prompts} == {"openai/gsm8k", "lighteval/MATH"}
    # a DatasetDict: the error names its splits, and a split folder loads
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows[:2])}
    ).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(DatasetError, match=r"several splits \((train, test|test, train)\): name one"):
        load_prompts(tmp_path / "dict", tok)
    assert load_prompts(tmp_path / "dict" / "test", tok)[1].loaded == 2
    (tmp_path / "plain").mkdir()
    with pytest.raises(DatasetError, match="not one written by datasets' save_to_disk"):
        load_prompts(tmp_path / "plain", tok)
