"""How long a dataset's prompts are, in the policy's tokens, from a bounded sample.

Why: a prompt that does not leave room for `max_new_tokens` in the model's context is refused by
the inference server, every time: the group is retried, counted as failed, and eight in a row stop
the run minutes in, with the server's words. `validate` renders a sample of each dataset's
prompts exactly as the run will (`datasets.render_rows`: the template, the chat template, the
tokenizer; a game's opening is its row's question) and measures them before anything starts.

Bounded in time, not exhaustive: of a file, the rows with the longest questions (in characters)
among its first `READ_ROWS`; of a generated dataset not written yet, its first `GENERATED_ROWS`
rows (data/generated.py: generating them all can take minutes). What was sampled is said with the
result, so a reader knows what the check saw.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_graph.data import generated
from areal_graph.data.dataset_files import LoadReport, iter_rows
from areal_graph.data.datasets import field_value, render_rows, row_keys

READ_ROWS = 20_000  # rows of a file looked at
SAMPLE_ROWS = 256  # of those, the longest questions rendered and tokenised
GENERATED_ROWS = 64  # the first rows of a generated dataset (a game's opening takes ~10 ms)


@dataclass(frozen=True)
class PromptLengths:
    """The token lengths of a dataset's sampled prompts, and its longest one."""

    sample: str  # what was sampled, in words ("the 256 longest questions of the first 20000 rows")
    lengths: tuple[int, ...]  # tokens of each rendered prompt
    longest_id: str
    longest_question: str  # the longest prompt's question as the row gives it (before any template)

    @property
    def longest(self) -> int:
        return max(self.lengths)


def _question_size(row: Any, data: Any) -> int:
    """A row's question size in characters: the cheap stand-in for its token length when choosing."""
    if not isinstance(row, dict):
        return 0
    key = row_keys(row, data.layout, data.question_key, data.answer_key)[0]
    return len(str(field_value(row, key)))


def sample(dataset: str, path: Path | None, data: Any, cache_root: Path) -> tuple[list[tuple[int, Any]], str]:
    """(line, row) pairs to render from `dataset` (`path`: its local file, None when it is a
    generated dataset), and what they are, in words."""
    if path is None:
        if generated.source_of(dataset) is None:
            raise ValueError(f"{dataset}: no file to read")
        path = generated.cached(dataset, cache_root)  # written by an earlier run: read it
        if path is None:
            rows = generated.sample_rows(dataset, GENERATED_ROWS)
            return list(enumerate(rows, start=1)), f"its first {len(rows)} rows"
    report = LoadReport(str(path))
    read = 0
    heap: list[tuple[int, int, Any]] = []  # (question size, line, row): the SAMPLE_ROWS largest
    for line, row in iter_rows(path, report):
        read += 1
        item = (_question_size(row, data), -line, row)  # ties: the earlier row
        if len(heap) < SAMPLE_ROWS:
            heapq.heappush(heap, item)
        elif item[:2] > heap[0][:2]:
            heapq.heapreplace(heap, item)
        if read >= READ_ROWS:
            break
    chosen = sorted(((-line, row) for _, line, row in heap), key=lambda pair: pair[0])
    if len(chosen) == read:
        return chosen, f"all {read} rows"
    return chosen, f"the {len(chosen)} longest questions of {'its first ' if read >= READ_ROWS else ''}{read} rows"


def measure(dataset: str, path: Path | None, tokenizer: Any, data: Any, cache_root: Path) -> PromptLengths | None:
    """The lengths of `dataset`'s sampled prompts rendered as the run renders them (`data`: the
    workflow's DataSpec, for the template and the row fields); None when no sampled row is usable
    (the run's loader says why, row by row)."""
    rows, what = sample(dataset, path, data, cache_root)
    prompts = render_rows(
        rows,
        LoadReport(dataset),
        tokenizer,
        prompt_template=data.prompt_template,
        question_key=data.question_key,
        answer_key=data.answer_key,
        layout=data.layout,
        source_key=data.source_key,
        stem=path.stem if path is not None else "rows",  # a row without an id is named as the run names it
    )
    if not prompts:
        return None
    longest = max(prompts, key=lambda p: len(p.input_ids))
    return PromptLengths(what, tuple(len(p.input_ids) for p in prompts), longest.id, longest.question or longest.text)
