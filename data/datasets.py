"""Prompt datasets: rows with a question (text or chat messages) and a reference answer.

One loader serves the builtin arithmetic task and the datasets users have: GSM8K-style
`{"question": ..., "answer": "... #### 72"}`, MATH-style `{"problem": ..., "solution": ...}`
through `question_key` / `answer_key` (dotted paths reach into nested fields), and verl's
layout read as it is: `prompt` a list of chat messages, the answer in
`reward_model.ground_truth`, `data_source` naming where the row comes from (kept for
per-source metrics). Files: JSONL, JSON, parquet, or a `datasets` save_to_disk folder
(data/dataset_files.py). Rows that cannot be used are skipped and counted by reason, and the
first few are named with their file and line, so a bad row never stops a run and never
disappears silently.

The prompt a model sees: for a text question, `prompt_template.format(question=...)` (or the
bare question) as the user turn of the tokenizer's chat template when it has one, else the raw
text; for chat messages, the messages through the chat template (the template, if any, applied
to the last user turn). The same function builds prompts for SFT, evaluation and RL, so they
always agree.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_graph.data.dataset_files import DatasetError, LoadReport, iter_rows

__all__ = [
    "DatasetError",
    "LoadReport",
    "Prompt",
    "format_prompt",
    "load_prompts",
    "load_run_prompts",
    "reference_answer",
    "render_rows",
]

log = logging.getLogger(__name__)

LAYOUTS = ("auto", "fields", "verl")
VERL_QUESTION, VERL_ANSWER = "prompt", "reward_model.ground_truth"
CHAT_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Prompt:
    """One usable row: what the rollout sends (`input_ids`) and what the reward checks (`answer`).

    `text` is what the model is prompted with (the template and chat template applied);
    `question` is the question as the row gives it (the last user message of a conversation),
    what an environment restates when it asks again (no template); `messages` is the row's own
    conversation when its question is one (None for a text question)."""

    id: str
    text: str
    input_ids: list[int]
    answer: str
    source: str = ""  # the row's data source (verl's `data_source`), for per-source metrics
    messages: tuple[dict[str, str], ...] | None = None
    question: str = ""


def format_prompt(tokenizer: Any, question: str | list[dict[str, str]], prompt_template: str | None = None) -> str:
    """The text the model is prompted with for `question` (text, or chat messages)."""
    if isinstance(question, list):
        messages = [dict(m) for m in question]
        if prompt_template:
            last = max(i for i, m in enumerate(messages) if m["role"] == "user")
            messages[last]["content"] = prompt_template.format(question=messages[last]["content"])
        if not getattr(tokenizer, "chat_template", None):
            raise DatasetError("a chat-message prompt needs a tokenizer with a chat template")
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
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


_MISSING = object()


def field_value(row: dict, key: str) -> Any:
    """`row[key]`, or for a dotted key the value down nested mappings (`reward_model.ground_truth`);
    a key that is itself in the row wins over the path. `_MISSING` when there is none."""
    if key in row:
        return row[key]
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def row_keys(row: dict, layout: str, question_key: str, answer_key: str) -> tuple[str, str]:
    """The (question, answer) keys of a row: verl's under `layout: verl`, and under `auto` when the
    row lacks the configured question key but has verl's fields."""
    if layout == "verl" or (
        layout == "auto"
        and field_value(row, question_key) is _MISSING
        and isinstance(row.get(VERL_QUESTION), list)
        and field_value(row, VERL_ANSWER) is not _MISSING
    ):
        return VERL_QUESTION, VERL_ANSWER
    return question_key, answer_key


def chat_messages(value: Any) -> list[dict[str, str]] | str:
    """`value` as chat messages, or the reason it is not a usable conversation."""
    if not value:
        return "an empty message list"
    out = []
    for m in value:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return "a message that is not {role: text, content: text}"
        if m["role"] not in CHAT_ROLES:
            return f"a message of role {m['role']!r} (roles: {', '.join(CHAT_ROLES)})"
        out.append({"role": m["role"], "content": m["content"]})
    if not any(m["role"] == "user" for m in out):
        return "no user message"
    return out


def load_prompts(
    path: str | Path,
    tokenizer: Any,
    prompt_template: str | None = None,
    question_key: str = "question",
    answer_key: str = "answer",
    max_prompt_tokens: int | None = None,
    layout: str = "auto",
    source_key: str = "data_source",
) -> tuple[list[Prompt], LoadReport]:
    """Every usable row of `path` as a Prompt, and the report of what was skipped."""
    report = LoadReport(str(path))
    prompts = render_rows(
        iter_rows(path, report),
        report,
        tokenizer,
        prompt_template=prompt_template,
        question_key=question_key,
        answer_key=answer_key,
        max_prompt_tokens=max_prompt_tokens,
        layout=layout,
        source_key=source_key,
        stem=Path(path).stem,
    )
    if report.total_skipped:
        log.warning("%s; first skipped: %s", report, "; ".join(report.examples))
    return prompts, report


def render_rows(
    rows: Iterable[tuple[int, Any]],
    report: LoadReport,
    tokenizer: Any,
    *,
    prompt_template: str | None = None,
    question_key: str = "question",
    answer_key: str = "answer",
    max_prompt_tokens: int | None = None,
    layout: str = "auto",
    source_key: str = "data_source",
    stem: str = "rows",
) -> list[Prompt]:
    """(line, row) pairs as Prompts, the unusable ones counted in `report`: the one place a row
    becomes what the model is prompted with (`load_prompts` for a run's files; `validate` for a
    sample it measures against the model's context, data/prompt_lengths.py)."""
    if prompt_template is not None and "{question}" not in prompt_template:
        raise DatasetError(f"prompt_template must contain '{{question}}', got {prompt_template!r}")
    if layout not in LAYOUTS:
        raise DatasetError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    prompts: list[Prompt] = []
    for line, row in rows:
        prompt = _row_prompt(
            row,
            line,
            report,
            tokenizer,
            prompt_template,
            max_prompt_tokens,
            row_keys(row, layout, question_key, answer_key) if isinstance(row, dict) else ("", ""),
            source_key,
            stem,
        )
        if prompt is not None:
            prompts.append(prompt)
    report.loaded = len(prompts)
    return prompts


def _row_prompt(
    row: Any,
    line: int,
    report: LoadReport,
    tokenizer: Any,
    prompt_template: str | None,
    max_prompt_tokens: int | None,
    keys: tuple[str, str],
    source_key: str,
    stem: str,
) -> Prompt | None:
    """The row as a Prompt, or None after recording in `report` why it was skipped."""
    if not isinstance(row, dict):
        report.skip(line, "not an object", type(row).__name__)
        return None
    question_key, answer_key = keys
    question, answer = field_value(row, question_key), field_value(row, answer_key)
    for key, value in ((question_key, question), (answer_key, answer)):
        if value is _MISSING or value is None:
            report.skip(line, f"missing {key!r}")
            return None
    messages: list[dict[str, str]] | None = None
    if isinstance(question, list):
        conversation = chat_messages(question)
        if isinstance(conversation, str):
            report.skip(line, f"{question_key!r} is not a conversation", conversation)
            return None
        messages = conversation
    elif not isinstance(question, str) or not question.strip():
        report.skip(line, f"empty or non-text {question_key!r}")
        return None
    answer = reference_answer(answer)
    if not answer:
        report.skip(line, f"empty {answer_key!r}")
        return None
    try:
        text = format_prompt(tokenizer, messages if messages is not None else question, prompt_template)
    except DatasetError as err:
        report.skip(line, str(err))
        return None
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
        report.skip(line, "prompt too long", f"{len(ids)} > max_prompt_tokens {max_prompt_tokens}")
        return None
    source = field_value(row, source_key)
    row_id = row.get("id", field_value(row, "extra_info.index"))
    plain = (
        question if messages is None else next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    )
    return Prompt(
        str(row_id) if row_id not in (None, _MISSING) else f"{stem}:{line}",
        text,
        ids,
        answer,
        source=str(source) if source not in (None, _MISSING) else "",
        messages=tuple(messages) if messages is not None else None,
        question=plain,
    )


def load_run_prompts(data: Any, tokenizer_path: str, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """A run's training prompts (shuffled with `seed`) and evaluation prompts (the first
    `data.eval_size`), tokenised with the policy's tokenizer; `data` is a workflow's DataSpec
    with local paths. Raises DatasetError when no training row, or (an eval file given) no
    evaluation row, is usable."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    kwargs = dict(
        prompt_template=data.prompt_template,
        question_key=data.question_key,
        answer_key=data.answer_key,
        max_prompt_tokens=data.max_prompt_tokens,
        layout=data.layout,
        source_key=data.source_key,
    )
    train, report = load_prompts(data.train, tok, **kwargs)
    if not train:
        raise DatasetError(f"data.train ({data.train}) has no usable rows: {report}")
    log.info("train prompts: %s", report)
    eval_prompts: list[Prompt] = []
    if data.eval:
        eval_prompts, report = load_prompts(data.eval, tok, **kwargs)
        if not eval_prompts:  # evaluation would silently be off
            raise DatasetError(
                f"data.eval ({data.eval}) has no usable rows: {report}; fix it, or set data.eval: null "
                "to train without evaluating"
            )
        log.info("eval prompts: %s", report)
        eval_prompts = eval_prompts[: data.eval_size] if data.eval_size else eval_prompts
    random.Random(seed).shuffle(train)
    return train, eval_prompts
