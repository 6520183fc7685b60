"""Prompt datasets: JSONL or parquet rows with a question and a reference answer.

One loader serves the builtin arithmetic task and real datasets (GSM8K-style
`{"question": ..., "answer": "... #### 72"}`, MATH-style `{"problem": ..., "solution": ...}`
via `question_key` / `answer_key`). Rows that cannot be used are skipped and counted by
reason, and the first few are named with their file and line, so a bad row never stops a run
and never disappears silently.

The prompt a model sees: `prompt_template.format(question=...)` (or the bare question) as
the user turn of the tokenizer's chat template when it has one, else the raw text. The same
function builds prompts for SFT, evaluation and RL, so they always agree.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger(__name__)

# Bounds on what one file may make us hold in memory: a JSONL row, and a whole .json array.
MAX_ROW_BYTES = 1 << 20
MAX_JSON_FILE_BYTES = 256 << 20
# How many skipped rows are named individually in the log before only counting.
_NAMED_SKIPS = 5


@dataclass(frozen=True)
class Prompt:
    """One usable row: what the rollout sends (`input_ids`) and what the reward checks (`answer`)."""

    id: str
    text: str
    input_ids: list[int]
    answer: str


@dataclass
class LoadReport:
    """What happened to every row of a file: loaded, or skipped and why."""

    path: str
    loaded: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)  # "line 7: missing 'answer'"

    @property
    def total_skipped(self) -> int:
        return sum(self.skipped.values())

    def skip(self, line: int, reason: str, detail: str = "") -> None:
        self.skipped[reason] += 1
        if len(self.examples) < _NAMED_SKIPS:
            self.examples.append(f"line {line}: {reason}{': ' + detail if detail else ''}")

    def __str__(self) -> str:
        text = f"{self.path}: {self.loaded} rows loaded"
        if self.total_skipped:
            reasons = ", ".join(f"{n} {r}" for r, n in self.skipped.most_common())
            text += f", {self.total_skipped} skipped ({reasons})"
        return text


class DatasetError(ValueError):
    """The dataset as a whole cannot be read (missing file, unknown format)."""


def format_prompt(tokenizer: Any, question: str, prompt_template: str | None = None) -> str:
    """The text the model is prompted with for `question`."""
    content = prompt_template.format(question=question) if prompt_template else question
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
    return content


def reference_answer(raw: Any) -> str:
    """The checkable part of a reference answer: GSM8K puts it after '####'."""
    text = str(raw).strip()
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip()
    return text.replace(",", "") if text.replace(",", "").lstrip("-").isdigit() else text


def iter_rows(path: str | Path, report: LoadReport) -> Iterator[tuple[int, Any]]:
    """(line or row number, decoded row) for JSONL / JSON-array / parquet files.

    Bounded, whatever the file holds: a JSONL line longer than `MAX_ROW_BYTES` is skipped
    without being held in memory, as are lines that are not UTF-8, not JSON, or JSON nested
    too deeply to decode; each is counted in `report`. A .json array is read whole, so it
    must be under `MAX_JSON_FILE_BYTES` (JSONL streams any size)."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"dataset {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as err:
            raise DatasetError(f"dataset {path}: reading parquet needs pyarrow (pip install 'areal-graph[parquet]')") from err
        try:
            table = pq.read_table(path)
        except Exception as err:  # pyarrow raises its own error types for corrupt files
            raise DatasetError(f"dataset {path}: not a readable parquet file ({err})") from err
        for i, row in enumerate(table.to_pylist(), start=1):
            yield i, row
        return
    if suffix == ".json":
        yield from enumerate(_json_array(path), start=1)
        return
    if suffix not in (".jsonl", ".ndjson"):
        raise DatasetError(f"dataset {path}: unknown format {suffix!r} (use .jsonl, .json or .parquet)")
    with path.open("rb") as f:
        i = 0
        while True:
            raw = f.readline(MAX_ROW_BYTES + 1)
            if not raw:
                return
            i += 1
            if len(raw) > MAX_ROW_BYTES and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):  # drop the rest of the line, a chunk at a time
                    raw = f.readline(MAX_ROW_BYTES)
                report.skip(i, "row too long", f"over {MAX_ROW_BYTES:,} bytes")
                continue
            row = _decode_line(raw, i, report)
            if row is not _SKIPPED:
                yield i, row


_SKIPPED = object()


def _decode_line(raw: bytes, i: int, report: LoadReport) -> Any:
    if not raw.strip():
        return _SKIPPED
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        report.skip(i, "not UTF-8", f"byte 0x{raw[err.start]:02x} at column {err.start + 1}")
    except json.JSONDecodeError as err:
        report.skip(i, "invalid JSON", str(err))
    except RecursionError:
        report.skip(i, "nested too deeply")
    return _SKIPPED


def _json_array(path: Path) -> list:
    if path.stat().st_size > MAX_JSON_FILE_BYTES:
        raise DatasetError(f"dataset {path}: a .json dataset is read whole and must be under "
                           f"{MAX_JSON_FILE_BYTES >> 20} MiB; write it as JSONL (one row per line)")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise DatasetError(f"dataset {path}: not UTF-8 text (byte offset {err.start})") from None
    except json.JSONDecodeError as err:
        raise DatasetError(f"dataset {path}: not valid JSON ({err})") from None
    except RecursionError:
        raise DatasetError(f"dataset {path}: JSON nested too deeply to read") from None
    if not isinstance(data, list):
        raise DatasetError(f"dataset {path}: a .json dataset must hold a list of rows")
    return data


def load_prompts(
    path: str | Path,
    tokenizer: Any,
    prompt_template: str | None = None,
    question_key: str = "question",
    answer_key: str = "answer",
    max_prompt_tokens: int | None = None,
) -> tuple[list[Prompt], LoadReport]:
    """Every usable row of `path` as a Prompt, and the report of what was skipped."""
    if prompt_template is not None and "{question}" not in prompt_template:
        raise DatasetError(f"prompt_template must contain '{{question}}', got {prompt_template!r}")
    report = LoadReport(str(path))
    prompts: list[Prompt] = []
    for line, row in iter_rows(path, report):
        if not isinstance(row, dict):
            report.skip(line, "not an object", type(row).__name__)
            continue
        missing = [k for k in (question_key, answer_key) if k not in row or row[k] is None]
        if missing:
            report.skip(line, f"missing {missing[0]!r}")
            continue
        question, answer = row[question_key], row[answer_key]
        if not isinstance(question, str) or not question.strip():
            report.skip(line, f"empty or non-text {question_key!r}")
            continue
        answer = reference_answer(answer)
        if not answer:
            report.skip(line, f"empty {answer_key!r}")
            continue
        text = format_prompt(tokenizer, question, prompt_template)
        ids = tokenizer(text, add_special_tokens=False).input_ids
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            report.skip(line, "prompt too long", f"{len(ids)} > max_prompt_tokens {max_prompt_tokens}")
            continue
        prompts.append(Prompt(str(row.get("id", f"{Path(path).stem}:{line}")), text, ids, answer))
    report.loaded = len(prompts)
    if report.total_skipped:
        log.warning("%s; first skipped: %s", report, "; ".join(report.examples))
    return prompts, report


def load_run_prompts(data: Any, tokenizer_path: str, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """A run's training prompts (shuffled with `seed`) and evaluation prompts (the first
    `data.eval_size`), tokenised with the policy's tokenizer; `data` is a workflow's DataSpec
    with local paths. Raises DatasetError when no training row is usable."""
    import random

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    kwargs = dict(prompt_template=data.prompt_template, question_key=data.question_key,
                  answer_key=data.answer_key, max_prompt_tokens=data.max_prompt_tokens)
    train, report = load_prompts(data.train, tok, **kwargs)
    if not train:
        raise DatasetError(f"data.train ({data.train}) has no usable rows: {report}")
    log.info("train prompts: %s", report)
    eval_prompts: list[Prompt] = []
    if data.eval:
        eval_prompts, report = load_prompts(data.eval, tok, **kwargs)
        log.info("eval prompts: %s", report)
        eval_prompts = eval_prompts[: data.eval_size] if data.eval_size else eval_prompts
    random.Random(seed).shuffle(train)
    return train, eval_prompts
